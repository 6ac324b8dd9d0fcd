"""The main job: one trace replayed under several policies on one runtime, compared in one
report (with, given a calibration, the model's prediction, the simulator and the advisor's pick
beside the replays, and optionally a capacity search)."""
