"""The calibration file: rates measured on a live server, read by the model and the simulator.

JSON with these keys (each value within its documented range, harness.limits, tabled in
docs/simulator.md "Calibration file ranges": rates MIN_TOK_S to MAX_TOK_S tokens/s, swap
MIN_BYTES_PER_S to MAX_BYTES_PER_S, KV bytes 1 to MAX_KV_BYTES_PER_TOKEN a token, block_size to
MAX_BLOCK_SIZE tokens, kv_capacity_tokens to MAX_POOL_TOKENS, batch_tokens and context lengths
to MAX_TOKENS, times 0 to MAX_MS ms, noise factors MIN_NOISE_FACTOR to MAX_NOISE_FACTOR; a value
outside is refused naming the file and the key, so whatever the model computes from them stays
finite):

    {"runtime": "llama.cpp", "server_version": "b6000", "model": "SmolLM2-135M-Instruct.Q4_1",
     "kv_bytes_per_token": 23040, "prefill_tok_s": 240.0,
     "prefill_points": [[512, 260.0], [4096, 210.0]],   # (context_len, tok_s), optional
     "decode_tok_s": 30.0, "swap_out_bytes_per_s": 5e9, "swap_in_bytes_per_s": 6e9,
     "decode_points": [[64, 30.0], [1024, 21.0]],       # (context_len, tok_s), optional
     "append_points": [[64, 90.0], [1024, 40.0]],       # (context_len, tok_s), optional
     "long_append_points": [[64, 80.0], [1024, 60.0]],  # (context_len, tok_s), optional
     "measured_at": "2026-11-29T21:00:00Z",
     # optional, the engine and its KV pool as the server reports them:
     "engine": "llamacpp",            # llamacpp | vllm | sglang (default: from runtime)
     "block_size": 1,                 # KV block / page size in tokens (vLLM 16, SGLang 1)
     "kv_capacity_tokens": 4096,      # the KV pool in tokens
     "batch_tokens": 2048,            # the most tokens one iteration takes
     "free_tokens": 256,              # GPUs: tokens an iteration computes in its fixed cost
     "request_overhead_ms": 1.2,      # a call's time outside the engine's compute (median)
     "wake_ms": 1.4, "wake_tau_ms": 40.0,  # the first iteration after idle time (below)
     "iteration_noise_samples": [0.9, 1.0, 1.3],  # one iteration's times / their median
     "front_end_ms": 1.4, "front_end_cpu_ms": 2.2, "stream_token_ms": 0.12,  # (below)
     "declared": "...",               # sources: figures published elsewhere, not measured
     "provenance": {"decode_tok_s": {"status": "published", "source": "..."}, ...}}

`prefill_tok_s` is the headline rate; `prefill_points` give it by context length when measured,
and `prefill_tok_s_at` interpolates between them (clamped at both ends). `decode_points` give one
sequence's decode rate by context length; `append_points` the rate of a 32-token prompt
appended to a cached context of that length (a kept request's resume), `long_append_points` of a
256-token one (measured on vLLM and SGLang, whose prompt cost grows with the context a chunk
reads). The simulator's iteration model (harness.model.iteration) uses them, when present, for
the cost of attention in decode steps and prompt chunks.

An engine without per-request swap (SGLang's CPU engine) records both swap rates as null: the
calibration then holds 0.0 for them (`has_swap` False), policies price a restore as never
finishing, and a policy that must swap is refused with one line (`check_swap`).

`engine` names the engine semantics (how the server schedules and caches); without it,
`engine_kind` derives them from `runtime`. `block_size`, `kv_capacity_tokens` and
`batch_tokens` are what the server itself reports (vLLM: block_size x num_gpu_blocks and
max_num_batched_tokens; SGLang: page_size, max_total_num_tokens, chunked_prefill_size;
llama.cpp: 1, slots x n_ctx and n_batch). `free_tokens` (1 to MAX_FREE_TOKENS; absent: 0, a
CPU's): the tokens an iteration computes within its fixed cost, a GPU's roofline ridge
(harness.model.iteration).
`declared` is present only on a calibration whose
figures come from published measurements rather than from this project's own (a shipped
preset): it cites the sources, and whatever prints or records it says DECLARED_NOTE.
`provenance` (optional): per field, `status` `measured` (here), `published` (by someone else:
`source` names the publication, its commit and the rows) or `declared` (by no one: a
specification, a default or a rule, `source` says which); `calibrate --list`, `simulate` and the
report print the `declared_fields`.

`wake_ms` (optional, with `wake_tau_ms`) is what the first iteration after the server idled
adds to it: an engine that idled for t computes its next iteration wake_ms (1 - e^(-t /
wake_tau_ms)) slower. Measured on the pinned CPU vLLM server (a 48-token append after 512 cached
tokens, 10 each): 3.2 ms right after other work, 3.5 after 10 ms idle, 4.0 after 30, 4.4 after
60, 4.6 after 100 and 4.6-4.7 after 200-500 ms; a cold 300-token prompt 4.7 -> 6.2 ms. A
calibration measures its appends back to back, an agent's resume comes after a tool's wait.

`wake_curve_ms` (optional): the wake measured at several idle times, as [idle_ms, server_ms,
way_ms] triples by ascending idle time, each part >= 0 and non-decreasing: what the first call
after that much idle time added to the server's prompt time and to its way there and back (the
client's time to first token less that). Where present the simulator adds the server part to
the first iteration after idle time, in place of the wake_ms form, and the way part to the way
of the first request sent after it (harness.simulate.client), each linearly interpolated in the
idle time (flat past the last point). Measured on a 2-core Xeon VM's pinned vLLM server: server
+1.7, +2.9, +6.2, +14.6, +28.4 ms and way +0.1, +2.1, +7.7, +23.4, +52.9 ms after 10 ms, 30 ms,
300 ms, 1 s and 3 s (harness.calibrate.wake).

`iteration_noise_samples` (optional): the same iteration's measured times over their median,
ascending (at least 2; harness.calibrate.wake). The simulator multiplies each iteration's time
by a factor drawn from them (seeded), so its tails carry the server's own spread.

`request_overhead_ms` is what a call spends outside the engine's own compute: the client's
time to first token less the prompt time the server reports, median over short appended
prompts (HTTP, the API server, the hand-over to the engine's scheduler and back). The
simulator delays each call's arrival at the engine by it; absent, by nothing.
`request_overhead_samples_ms` (optional) is the same overhead's distribution: the measured
overheads themselves, ascending (at least 2). Where present the simulator draws each call's
overhead from them (uniformly, seeded) instead of taking the median for every call: the overhead
of a server sharing its CPUs has a tail (measured on CPU vLLM: median 7 ms, P95 17 ms). Samples,
not quantiles: a rare outlier keeps its own weight (one of n), where interpolated quantiles
would spread it over a whole band of draws.

The server's front end (optional, measured on vLLM and SGLang: harness.calibrate.front_end):
`front_end_ms` is each arriving request's turn in it, one request at a time (the rise of a
burst's first answer with its size); `front_end_cpu_ms` the compute a request's front-end work
takes from the engine where both share processors (the decode steps' slowdown per request per
second of small requests sent beside them); `stream_token_ms` what each streamed token of a
call adds to a decode step beyond the engine's own cost (the step's rise per extra streaming
call). The simulator queues requests through the front end and pauses the engine's compute
for its work (harness.simulate.client); absent, requests go in parallel and take nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.arrays import FloatArray
from harness.errors import InputError
from harness.limits import (
    MAX_BLOCK_SIZE,
    MAX_KV_BYTES_PER_TOKEN,
    MAX_POOL_TOKENS,
    MAX_TOK_S,
    MAX_TOKENS,
    MIN_TOK_S,
)
from harness.model.calibration_values import (
    check_points,
    check_provenance,
    check_wake,
    parse_count,
    parse_overhead,
    parse_points,
    parse_provenance,
    parse_samples,
    parse_swap_rate,
    parse_wake_curve,
    positive_number,
)
from harness.model.engines import ENGINES
from harness.model.engines import RUNTIME_ENGINES as RUNTIME_ENGINES
from harness.model.iteration import BATCH_TOKENS, IterationCosts, MeasuredRates, fit_costs
from harness.model.swap_support import check_swap as check_swap
from harness.policies.base import ServerRates
from harness.records.store import write_json
from harness.userfiles import check_regular

CALIBRATION_VERSION = "1"
_RATE_KEYS = ("kv_bytes_per_token", "prefill_tok_s", "decode_tok_s")
_SWAP_KEYS = ("swap_out_bytes_per_s", "swap_in_bytes_per_s")
_TEXT_KEYS = ("runtime", "server_version", "model", "measured_at")
_INT_KEYS = ("block_size", "kv_capacity_tokens", "batch_tokens", "free_tokens")
MAX_FREE_TOKENS = 65536  # far past any GPU's roofline ridge (a few hundred tokens)
# The documented ranges (harness.limits): (low, high) of each rate, the most of each count.
_RATE_RANGES = {"kv_bytes_per_token": (1.0, MAX_KV_BYTES_PER_TOKEN),
                "prefill_tok_s": (MIN_TOK_S, MAX_TOK_S), "decode_tok_s": (MIN_TOK_S, MAX_TOK_S)}
_INT_HIGH = {"block_size": MAX_BLOCK_SIZE, "kv_capacity_tokens": MAX_POOL_TOKENS,
             "batch_tokens": MAX_TOKENS, "free_tokens": MAX_FREE_TOKENS}
_FRONT_END_KEYS = ("front_end_ms", "front_end_cpu_ms", "stream_token_ms")
DECLARED_NOTE = "declared, not measured here"


def prefill_rate_at(points: tuple[tuple[int, float], ...], default: float,
                    context_len: FloatArray) -> FloatArray:
    """Prefill rate at each context length: linear between points, clamped; `default` if none."""
    if not points:
        return np.full(np.shape(context_len), float(default))
    xs = np.array([c for c, _ in points], dtype=float)
    ys = np.array([r for _, r in points], dtype=float)
    rates: FloatArray = np.interp(context_len, xs, ys)
    return rates


@dataclass(frozen=True)
class Calibration:
    """Rates measured on one server with one model (see the module docstring for the file)."""

    runtime: str
    server_version: str
    model: str
    kv_bytes_per_token: float
    prefill_tok_s: float
    decode_tok_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    measured_at: str
    prefill_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    decode_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    append_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    long_append_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    engine: str | None = None  # llamacpp | vllm | sglang; None: from runtime (engine_kind)
    block_size: int | None = None  # the KV block / page size in tokens, as the server reports
    kv_capacity_tokens: int | None = None  # the KV pool in tokens, as the server reports
    batch_tokens: int | None = None  # the most tokens one iteration takes
    free_tokens: int | None = None  # tokens an iteration computes within its fixed cost (GPUs)
    declared: str | None = None  # sources of published figures: not measured by the project
    request_overhead_ms: float | None = None  # outside the engine's compute, per call
    # the measured overheads, ascending (empty: the median for every call)
    request_overhead_samples_ms: tuple[float, ...] = ()
    wake_ms: float | None = None  # the first iteration after idle time: at most this slower
    wake_tau_ms: float | None = None  # its time constant
    # the same iteration's measured times over their median, ascending (empty: not measured)
    iteration_noise_samples: tuple[float, ...] = ()
    # (idle ms, server ms, way ms) of the first call after idle time, ascending (empty: none)
    wake_curve_ms: tuple[tuple[float, float, float], ...] = ()
    front_end_ms: float | None = None  # a request's turn in the server's front end
    front_end_cpu_ms: float | None = None  # the engine's compute a request's front end takes
    stream_token_ms: float | None = None  # ... and each streamed token, beyond the engine's
    # (field, status, source) for each field whose origin is stated (`provenance` in the file)
    field_provenance: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        self.validate("calibration")

    def validate(self, where: str) -> None:
        """Raise InputError naming `where` and the key when a value is malformed."""
        for key in _TEXT_KEYS:
            if not isinstance(getattr(self, key), str):
                raise InputError(f"{where}: {key} must be a string")
        for key in _RATE_KEYS:
            _rate(getattr(self, key), key, where)
        swaps = [getattr(self, k) for k in _SWAP_KEYS]
        if swaps != [0.0, 0.0]:  # both 0.0: no swap (null in the file)
            for key in _SWAP_KEYS:
                parse_swap_rate(getattr(self, key), key, where)
        if self.engine is not None and self.engine not in ENGINES:
            raise InputError(f"{where}: engine must be one of {', '.join(ENGINES)}, got "
                             f"{self.engine!r}")
        for key in _INT_KEYS:
            parse_count(getattr(self, key), key, where, _INT_HIGH[key])
        if self.declared is not None and (not isinstance(self.declared, str)
                                          or not self.declared.strip()):
            raise InputError(f"{where}: declared must be a non-empty string citing sources")
        parse_overhead(self.request_overhead_ms, where)
        parse_samples(list(self.request_overhead_samples_ms) or None, where)
        check_points(self.prefill_points, where)
        check_points(self.decode_points, where, "decode_points")
        check_points(self.append_points, where, "append_points")
        check_points(self.long_append_points, where, "long_append_points")
        check_wake(self.wake_ms, self.wake_tau_ms, where)
        parse_samples(list(self.iteration_noise_samples) or None, where, "iteration_noise_samples")
        parse_wake_curve(list(self.wake_curve_ms) or None, where)
        for key in _FRONT_END_KEYS:
            parse_overhead(getattr(self, key), where, key)
        check_provenance(self.field_provenance, where)

    def declared_fields(self) -> list[str]:
        """The fields no one measured (provenance status `declared`), in file order."""
        return [f for f, status, _ in self.field_provenance if status == "declared"]

    def wake(self) -> tuple[float, float] | None:
        """(seconds, time constant in seconds) of the first iteration after idle time, or None
        where not measured."""
        if self.wake_ms is None or self.wake_tau_ms is None:
            return None
        return self.wake_ms / 1e3, self.wake_tau_ms / 1e3

    def wake_curve(self, way: bool = True) -> tuple[tuple[float, float], ...]:
        """(idle s, extra s) of the first iteration after idle time, ascending: its server and
        way parts together (`way` False: the server's part alone); empty where not measured."""
        return tuple((i / 1e3, (v + (w if way else 0.0)) / 1e3) for i, v, w in self.wake_curve_ms)

    def way_wake_curve(self) -> tuple[tuple[float, float], ...]:
        """(idle s, extra s): what a request's way there and back (its time to first token less
        the server's prompt time) grows by after idle time, ascending; empty where not
        measured or where it did not grow."""
        if not any(w > 0 for _, _, w in self.wake_curve_ms):
            return ()
        return tuple((i / 1e3, w / 1e3) for i, _, w in self.wake_curve_ms)

    def iteration_costs(self, way: bool = True) -> IterationCosts:
        """What an iteration costs on this server (harness.model.iteration), fitted to these
        points; without a measured iteration budget, the default one. `way` False: a wake
        curve's server part alone (what the server reports as its prompt time)."""
        return fit_costs(MeasuredRates(self.prefill_tok_s, self.decode_tok_s,
                                       self.prefill_points, self.decode_points,
                                       self.append_points, self.long_append_points),
                         self.batch_tokens or BATCH_TOKENS, self.wake(), self.wake_curve(way),
                         self.free_tokens or 0)

    @property
    def engine_kind(self) -> str | None:
        """The engine semantics: `engine` when given, else derived from `runtime`
        (RUNTIME_ENGINES); None for a runtime of no known engine."""
        return self.engine or RUNTIME_ENGINES.get(self.runtime)

    @property
    def has_swap(self) -> bool:
        """Whether the engine can swap a paused request's KV (False: null swap rates)."""
        return self.swap_out_bytes_per_s > 0 and self.swap_in_bytes_per_s > 0

    @property
    def is_declared(self) -> bool:
        """Published figures, not measured by the project (`declared` cites them)."""
        return self.declared is not None

    def provenance(self) -> str:
        """How the figures were obtained, in a few words: DECLARED_NOTE with the sources, or
        measured on which runtime and when."""
        if self.declared is not None:
            if self.declared.startswith(DECLARED_NOTE):  # the file says so itself
                return self.declared
            return f"{DECLARED_NOTE} ({self.declared})"
        return f"measured on {self.runtime} {self.server_version} at {self.measured_at}"

    def prefill_tok_s_at(self, context_len: float) -> float:
        """Prefill tokens/s at a context length: linear between measured points, else the rate."""
        return float(prefill_rate_at(self.prefill_points, self.prefill_tok_s,
                                     np.asarray(context_len, dtype=float)))

    def rates(self) -> ServerRates:
        """The rates a pause policy prices its options with (restore uses swap-in bandwidth)."""
        return ServerRates(prefill_tok_s=self.prefill_tok_s,
                           swap_bytes_per_s=self.swap_in_bytes_per_s,
                           kv_bytes_per_token=self.kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"version": CALIBRATION_VERSION}
        for key in (*_TEXT_KEYS, *_RATE_KEYS):
            d[key] = getattr(self, key)
        for key in _SWAP_KEYS:
            d[key] = getattr(self, key) if self.has_swap else None
        for key in ("engine", *_INT_KEYS, "declared", "request_overhead_ms", "wake_ms",
                    "wake_tau_ms", *_FRONT_END_KEYS):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        d["prefill_points"] = [[c, r] for c, r in self.prefill_points]
        if self.decode_points:
            d["decode_points"] = [[c, r] for c, r in self.decode_points]
        if self.append_points:
            d["append_points"] = [[c, r] for c, r in self.append_points]
        if self.long_append_points:
            d["long_append_points"] = [[c, r] for c, r in self.long_append_points]
        if self.request_overhead_samples_ms:
            d["request_overhead_samples_ms"] = list(self.request_overhead_samples_ms)
        if self.iteration_noise_samples:
            d["iteration_noise_samples"] = list(self.iteration_noise_samples)
        if self.wake_curve_ms:
            d["wake_curve_ms"] = [list(row) for row in self.wake_curve_ms]
        if self.field_provenance:
            d["provenance"] = {f: {"status": st, "source": src}
                               for f, st, src in self.field_provenance}
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "calibration") -> Calibration:
        """Build and validate from parsed JSON; unknown keys are refused by name."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a JSON object")
        known = {"version", "prefill_points", "decode_points", "append_points",
                 "long_append_points", *_TEXT_KEYS,
                 *_RATE_KEYS, *_SWAP_KEYS, "engine", *_INT_KEYS, "declared",
                 "request_overhead_ms", "request_overhead_samples_ms", "wake_ms",
                 "wake_tau_ms", "iteration_noise_samples", "wake_curve_ms", *_FRONT_END_KEYS,
                 "provenance"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in (*_TEXT_KEYS, *_RATE_KEYS, *_SWAP_KEYS) if k not in data]
        if missing:
            raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
        version = str(data.get("version", CALIBRATION_VERSION))
        if version != CALIBRATION_VERSION:
            raise InputError(f"{where}: version {version!r} is not the supported "
                             f"{CALIBRATION_VERSION!r}")
        for k in _TEXT_KEYS:
            if not isinstance(data[k], str):
                raise InputError(f"{where}: {k} must be a string")
        rates = {k: _rate(data[k], k, where) for k in _RATE_KEYS}
        if (data["swap_out_bytes_per_s"] is None) != (data["swap_in_bytes_per_s"] is None):
            raise InputError(f"{where}: swap_out_bytes_per_s and swap_in_bytes_per_s are both "
                             "null (the engine has no swap) or both rates")
        engine = data.get("engine")
        if engine is not None and engine not in ENGINES:
            raise InputError(f"{where}: engine must be one of {', '.join(ENGINES)}, got "
                             f"{engine!r}")
        declared = data.get("declared")
        if declared is not None and (not isinstance(declared, str) or not declared.strip()):
            raise InputError(f"{where}: declared must be a non-empty string citing sources")
        check_wake(data.get("wake_ms"), data.get("wake_tau_ms"), where)
        return cls(runtime=data["runtime"], server_version=data["server_version"],
                   model=data["model"], measured_at=data["measured_at"],
                   prefill_points=parse_points(data, "prefill_points", where),
                   decode_points=parse_points(data, "decode_points", where),
                   append_points=parse_points(data, "append_points", where),
                   long_append_points=parse_points(data, "long_append_points", where),
                   engine=engine,
                   declared=declared,
                   request_overhead_ms=parse_overhead(data.get("request_overhead_ms"), where),
                   request_overhead_samples_ms=parse_samples(
                       data.get("request_overhead_samples_ms"), where),
                   wake_ms=data.get("wake_ms"), wake_tau_ms=data.get("wake_tau_ms"),
                   iteration_noise_samples=parse_samples(data.get("iteration_noise_samples"), where,
                                                    "iteration_noise_samples"),
                   wake_curve_ms=parse_wake_curve(data.get("wake_curve_ms"), where),
                   swap_out_bytes_per_s=parse_swap_rate(data["swap_out_bytes_per_s"],
                                                   "swap_out_bytes_per_s", where),
                   swap_in_bytes_per_s=parse_swap_rate(data["swap_in_bytes_per_s"],
                                                  "swap_in_bytes_per_s", where),
                   block_size=_count(data, "block_size", where),
                   kv_capacity_tokens=_count(data, "kv_capacity_tokens", where),
                   batch_tokens=_count(data, "batch_tokens", where),
                   free_tokens=_count(data, "free_tokens", where),
                   front_end_ms=parse_overhead(data.get("front_end_ms"), where, "front_end_ms"),
                   front_end_cpu_ms=parse_overhead(data.get("front_end_cpu_ms"), where,
                                                   "front_end_cpu_ms"),
                   stream_token_ms=parse_overhead(data.get("stream_token_ms"), where,
                                                  "stream_token_ms"),
                   field_provenance=parse_provenance(data.get("provenance"), known, where),
                   **rates)


def _rate(value: Any, key: str, where: str) -> float:
    """One of _RATE_KEYS, in its documented range."""
    low, high = _RATE_RANGES[key]
    return positive_number(value, key, where, high, low)


def _count(data: dict[str, Any], key: str, where: str) -> int | None:
    """One of _INT_KEYS, absent or in its documented range."""
    return parse_count(data.get(key), key, where, _INT_HIGH[key])


def read_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; InputError names the file and the bad key."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: calibration file does not exist")
    check_regular(p)  # a FIFO or a device would hang the read
    return Calibration.from_dict(_read_json(p), str(p))


def write_calibration(path: str | Path, cal: Calibration) -> Path:
    """Write a calibration file atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json(p, cal.to_dict())
    return p


# ---- shipped calibrations -----------------------------------------------------------------
PRESETS_DIR = Path(__file__).resolve().parent / "presets"
# What `harness simulate` prices with when no --calibration is given.
DEFAULT_PRESET = "llamacpp-smollm2-cpu"


def preset_names() -> list[str]:
    """The shipped calibrations' names (harness/model/presets/<name>.json)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def resolve_calibration(name_or_path: str | Path, policy: str | None = None,
                        policy_args: dict[str, str] | None = None,
                        note: Callable[[str], object] | None = None) -> Calibration:
    """A shipped calibration by name, or a calibration file; InputError (one line, listing the
    presets) for a name that is neither. With `policy`, refused (check_swap) when the policy
    must swap and the engine has none; `note` is told when the figures are declared."""
    raw = str(name_or_path)
    if raw in preset_names():
        cal = Calibration.from_dict(_read_json(PRESETS_DIR / f"{raw}.json"), f"preset {raw}")
    elif Path(name_or_path).is_file() or Path(raw).suffix == ".json" or os.sep in raw:
        cal = read_calibration(name_or_path)  # a path: "does not exist" when it does not
    else:
        raise InputError(f"calibration {raw!r}: neither a file nor a shipped preset (presets: "
                         f"{', '.join(preset_names())})")
    if policy is not None:
        check_swap(cal, policy, policy_args, f"calibration {raw}")
    if note is not None and cal.is_declared:
        note(f"calibration {raw}: {DECLARED_NOTE}; its sources are in its `declared` key"
             + declared_fields_note(cal))
    return cal


def declared_fields_note(cal: Calibration) -> str:
    """'; fields measured by no one: a, b' where the provenance names some, else ''."""
    fields = cal.declared_fields()
    return f"; fields measured by no one: {', '.join(fields)}" if fields else ""


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: calibration file does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: cannot read as JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{p}: JSON nested too deeply to be a calibration") from None


def calibration_label(name_or_path: str | Path, cal: Calibration) -> str:
    """How a command names the calibration it uses: the name or path, and DECLARED_NOTE with
    the sources when its figures are declared."""
    return f"{name_or_path} ({cal.provenance()})" if cal.is_declared else str(name_or_path)
