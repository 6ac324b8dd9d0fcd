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

# A calibration's values (harness.model.calibration), from a file or measured; a flag for the
# same value (simulate's --block-size, --capacity-tokens) takes the same bound.
# A KV block / page size in tokens (vLLM 16, SGLang 1): the simulator keeps state per token of
# a block, so a block far past any engine's would exhaust memory before the run began.
MAX_BLOCK_SIZE = 1 << 20
# A KV pool in tokens (a calibration's kv_capacity_tokens, simulate's --capacity-tokens).
MAX_POOL_TOKENS = 10**12
# Bytes of KV cache a token takes: a 405B-parameter model in 16 bits takes ~0.5 MiB, so a GiB
# is far past any model; products with token counts stay far inside a float.
MAX_KV_BYTES_PER_TOKEN = float(1 << 30)
# A rate in tokens per second (prefill, decode, a measured point's): a token each 100 s at
# least (MAX_TOKENS then take ~32 years, inside the records' nanosecond clock), a billion at most.
MIN_TOK_S = 1e-2
MAX_TOK_S = 1e9
# A bandwidth in bytes per second (swap out and in): a byte a second up to a petabyte.
MIN_BYTES_PER_S = 1.0
MAX_BYTES_PER_S = 1e15
# A time measured on a server in milliseconds (overheads, wake, the front end): MAX_SECONDS.
MAX_MS = MAX_SECONDS * 1e3
# A noise factor (one iteration's time over the median of its kind): a thousandth to a
# thousand; a factor of 0 would give an iteration that takes no time.
MIN_NOISE_FACTOR = 1e-3
MAX_NOISE_FACTOR = 1e3
# A gzipped input's inflated size in bytes (trace files, agent logs, span exports). A gzip
# stream inflates up to ~1,000x, so a 2 MB file can hold gigabytes; the reader inflates in
# bounded chunks and stops at this bound, naming the file. The largest real gzipped trace
# known (a kv-cache-tester conversation) inflates to 3.6 MB: 512 MiB is ~150x that, and what an
# import then holds (the inflated bytes, their text, the parsed values) still fits a laptop.
MAX_INFLATED_BYTES = 512 * 2**20
# One line of a JSON Lines input, in bytes (after inflating a .gz). A line is one record, read
# and parsed a line at a time so that memory follows the longest line, not the file; the
# longest real line known (a Claude Code transcript's) is 0.15 MB: 64 MiB is ~450x that.
MAX_LINE_BYTES = 64 * 2**20
