"""The simulator: a discrete-event model of one server replaying a trace under a pause policy.

It writes the same results directory as a real replay (records parts, run.json, summary.json),
so metrics and reports read either. Engine: a plain `heapq` event loop, not SimPy: SimPy's
generator processes cost about 2x per bare event here, and far more with the interrupts a TTL or
deadline needs, which would miss the target of 100,000 trajectories (~1M pauses) in 10 s.
"""

from harness.simulate import native

native.select()
