"""The advisor: which pause policy (and server settings) to run, searched on the calibrated
simulator and confirmed on the live server."""
