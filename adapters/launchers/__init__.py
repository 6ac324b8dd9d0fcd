"""Install and start real runtime servers on this machine."""
