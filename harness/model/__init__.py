"""The analytical model: KV geometry, calibration files and first-order pause costs."""
