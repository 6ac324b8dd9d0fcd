"""Planning: trajectories + injection profile + seed -> a pure, timed plan for the executor."""
