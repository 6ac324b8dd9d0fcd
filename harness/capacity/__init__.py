"""Capacity: how many concurrent agents a server holds under an SLO, per pause policy (a search
over bounded replays, or over the simulator where the advisor drives it)."""
