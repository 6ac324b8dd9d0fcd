"""The documented ranges of values read from flags and files (profiles, injections, SLOs).

A value outside its range is refused with the rule named (exit 2), never clamped or replaced:
each bound sits well past any real workload and well short of what would exhaust the client.
"""

from __future__ import annotations

# A token count (a prompt, an output, a context): beyond any served model's context; the
# client holds a context's token ids as Python ints (~36 bytes each), ~360 MB at this bound.
MAX_TOKENS = 10_000_000
# A duration in seconds (a tool's latency, a deadline): about 11.6 days of agent time.
MAX_SECONDS = 1_000_000.0
# Arrivals per second (trajectories or bystanders): planning holds one entry per arrival.
MAX_RATE_PER_S = 10_000.0
# Turns per generated trajectory.
MAX_TURNS = 100_000
# Anything else counted (weights, prefix groups, a slowdown factor).
MAX_COUNT = 1_000_000
# A distribution's shape parameter (lognormal sigma, Pareto tail alpha).
MAX_SHAPE = 10.0
# A random seed (numpy seeds with a non-negative integer).
MAX_SEED = 2**63 - 1
# An SLO bound in its unit (ms or s).
MAX_SLO = 1e9
# Sub-agent nesting: levels of parents above a trajectory (a root is at 0, its sub-agent at 1).
# Real agents nest a handful of levels; the planner and the replay walk a family recursively
# (a few Python frames a level), so 64 stays far inside Python's default limit of 1,000.
MAX_SUBAGENT_DEPTH = 64

# A gzipped input's inflated size in bytes (trace files, agent logs, span exports). A gzip
# stream inflates up to ~1,000x, so a 2 MB file can hold gigabytes; the reader inflates in
# bounded chunks and stops at this bound, naming the file. The largest real gzipped trace
# known (a kv-cache-tester conversation) inflates to 3.6 MB: 512 MiB is ~150x that, and what an
# import then holds (the inflated bytes, their text, the parsed values) still fits a laptop.
MAX_INFLATED_BYTES = 512 * 2**20
