"""Calibration: a live server's measured rates (prefill, decode, append, slot save/restore),
for the model, the simulator and the policies that price their actions."""
