"""Capacity and advice: how many agents a server holds under an SLO, and which pause policy to
run."""
