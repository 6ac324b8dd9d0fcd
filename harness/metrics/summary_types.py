"""summary.json as types: the one `Summary` every writer builds and every reader gets back.

`save_summary(directory, summary)` is the only writer of summary.json and
`read_summary(directory)` its only reader; reading a file and saving it again gives the same
bytes. A summary written by an older harness lacks some keys (`absent`): their fields take
their defaults and stay out of the file when it is written again. Keys this harness does not
know (a newer harness's) are kept as they were read (`extra`) and written back unchanged.
Values are kept as read (an integer stays an integer), only their kind is checked: a field of
the wrong kind is an InputError naming the file and the key.

The headline metrics read the typed fields (harness.metrics.registry). A `Summary` is also a
read-only Mapping of its JSON form, for the sections that show summary.json's breakdowns as
they are (the HTML report's tables by tool class, pause bucket, server times, reuse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.errors import InputError
from harness.records.store import SUMMARY_JSON, read_json, write_json

SUMMARY_VERSION = "3"

# The keys of summary.json, in order: the stable core first, then breakdowns and provenance.
SUMMARY_KEYS: tuple[str, ...] = (
    "runtime", "policy", "trajectories", "resume_latency_ms", "resume_parts_ms",
    "client_lag_ms", "ttft_ms", "tpot_ms", "itl_ms", "itl_source", "e2e_ms",
    "request_throughput_per_s", "output_token_throughput_per_s",
    "tokens_recomputed", "bytes_moved", "cache_mismatches", "cache_mismatch_list",
    "hint_honoured", "effective_retention",
    "job_completion_s", "makespan_s",
    "memory_time_token_s", "memory_time_mib_s", "kv_paused_peak_tokens", "kv_paused_mean_tokens",
    "kv_active_peak_tokens", "kv_active_mean_tokens", "goodput_per_min", "outcome_ci95",
    "bystander_ttft_ms",
    "by_tool_class", "by_pause_bucket", "reuse", "routing", "server_occupancy",
    "server_times_ms",
    "duration_s", "pauses",
    "pause_actions", "slo", "kv_bytes_per_token", "warnings", "health", "run_id",
    "summary_version",
)

Json = dict[str, Any]  # a JSON object kept as it is (a breakdown no headline reads)


def _bad(where: str, key: str, want: str, value: Any) -> InputError:
    return InputError(f"{where}: {key} must be {want}, got {type(value).__name__}")


def _number(value: Any, where: str, key: str) -> float | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise _bad(where, key, "a number or null", value)


def _count(value: Any, where: str, key: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _bad(where, key, "an integer or null", value)


def _text(value: Any, where: str, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _bad(where, key, "a string or null", value)


def _object(value: Any, where: str, key: str) -> Json:
    if isinstance(value, dict):
        return value
    raise _bad(where, key, "a JSON object", value)


def _object_or_null(value: Any, where: str, key: str) -> Json | None:
    return None if value is None else _object(value, where, key)


def _list(value: Any, where: str, key: str) -> list[Any]:
    if isinstance(value, list):
        return value
    raise _bad(where, key, "a list", value)


def _any(value: Any, where: str, key: str) -> Any:
    del where, key
    return value


def _interval(value: Any, where: str, key: str) -> list[float] | None:
    return None if value is None else _list(value, where, key)


Decoder = Callable[[Any, str, str], Any]


def _split(data: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[frozenset[str], Json]:
    """The known keys `data` lacks, and the keys it has that are not known."""
    return (frozenset(k for k in keys if k not in data),
            {k: v for k, v in data.items() if k not in keys})


def _encode(value: Any) -> Any:
    if isinstance(value, JsonObject):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


class JsonObject:
    """A JSON object read into a dataclass's fields (named as its keys, in KEYS order, each
    read by its DECODERS entry), with the known keys it lacked (`absent`) and the unknown ones
    it had (`extra`), so that writing it gives back what was read."""

    KEYS: ClassVar[tuple[str, ...]] = ()
    DECODERS: ClassVar[dict[str, Decoder]] = {}
    absent: frozenset[str]
    extra: Json

    @classmethod
    def read(cls, data: Mapping[str, Any], where: str) -> Any:
        """The typed object of `data` (InputError naming `where` and the key for a value of
        the wrong kind)."""
        absent, extra = _split(data, cls.KEYS)
        values = {k: cls.DECODERS.get(k, _any)(data[k], where, k) for k in cls.KEYS
                  if k in data}
        make: Callable[..., Any] = cls  # a dataclass: its fields by name
        return make(**values, absent=absent, extra=extra)

    def to_json(self) -> Json:
        """The JSON object: the known keys it has, then the unknown ones, as read."""
        out = {k: _encode(getattr(self, k)) for k in self.KEYS if k not in self.absent}
        out.update(self.extra)
        return out


def _nested(cls: type[JsonObject]) -> Decoder:
    def decode(value: Any, where: str, key: str) -> Any:
        return cls.read(_object(value, where, key), f"{where} {key}")
    return decode


def _nested_or_null(cls: type[JsonObject]) -> Decoder:
    def decode(value: Any, where: str, key: str) -> Any:
        return None if value is None else _nested(cls)(value, where, key)
    return decode


@dataclass(frozen=True)
class Quantiles(JsonObject):
    """Percentiles of a sample: n, p50/p95/p99 (None for no sample), a mean where one is
    kept (job completion), bootstrap 95% intervals by statistic where computed (`ci95`)."""

    n: int | None = 0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    ci95: dict[str, list[float] | None] | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("n", "p50", "p95", "p99", "mean", "ci95")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "n": _count, "p50": _number, "p95": _number, "p99": _number, "mean": _number,
        "ci95": _object_or_null}

    def at(self, stat: str) -> float | None:
        """The statistic `stat` (p50, p95, p99 or mean); None where it has none."""
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99, "mean": self.mean}[stat]

    def ci_at(self, stat: str) -> list[float] | None:
        """The 95% interval of `stat`; None where none was computed."""
        return (self.ci95 or {}).get(stat)


@dataclass(frozen=True)
class Trajectories(JsonObject):
    """Task counts over root trajectories (harness.metrics.outcomes.trajectory_outcomes);
    `subagent_failed` and the sub-agents' own counts (`subagents`) are in `extra`."""

    total: int | None = 0
    succeeded: int | None = 0
    cancelled: int | None = 0
    failed: int | None = 0
    interrupted: int | None = 0
    slo_violating: int | None = 0
    incomplete: int | None = 0
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("total", "succeeded", "cancelled", "failed",
                                       "interrupted", "slo_violating", "incomplete")
    DECODERS: ClassVar[dict[str, Decoder]] = dict.fromkeys(KEYS, _count)


@dataclass(frozen=True)
class Rate(JsonObject):
    """A share of judged resumes (hint honoured, keep-evictable contexts kept): `rate` of
    `judged`; the counts by pause bucket and the rest in `extra`."""

    rate: float | None = None
    judged: int | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("rate", "judged")
    DECODERS: ClassVar[dict[str, Decoder]] = {"rate": _number, "judged": _count}


@dataclass(frozen=True)
class OutcomeIntervals(JsonObject):
    """Bootstrap 95% intervals over trajectories of the outcome metrics."""

    success_rate: list[float] | None = None
    goodput_per_min: list[float] | None = None
    memory_time_token_s: list[float] | None = None
    memory_time_mib_s: list[float] | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("success_rate", "goodput_per_min",
                                       "memory_time_token_s", "memory_time_mib_s")
    DECODERS: ClassVar[dict[str, Decoder]] = dict.fromkeys(KEYS, _interval)


@dataclass(frozen=True)
class HealthCheck(JsonObject):
    """One health check of a run: its name, status (fail, warn, ok, info) and detail."""

    check: str | None = None
    status: str | None = None
    detail: str | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("check", "status", "detail")
    DECODERS: ClassVar[dict[str, Decoder]] = dict.fromkeys(KEYS, _text)


def _health(value: Any, where: str, key: str) -> list[HealthCheck]:
    return [HealthCheck.read(_object(c, where, key), f"{where} {key}")
            for c in _list(value, where, key)]


_QUANTILES = _nested(Quantiles)


@dataclass(frozen=True, eq=False)
class Summary(JsonObject, Mapping[str, Any]):
    """summary.json: the headline metrics of one run (harness.metrics.summary.summarize).

    Every field is summary.json's key of the same name. Equal to another summary, or to a
    dict, with the same JSON form."""

    runtime: str | None = None
    policy: str | None = None
    trajectories: Trajectories = field(default_factory=Trajectories)
    resume_latency_ms: Quantiles = field(default_factory=Quantiles)
    resume_parts_ms: Json = field(default_factory=dict)
    client_lag_ms: Quantiles = field(default_factory=Quantiles)
    ttft_ms: Quantiles = field(default_factory=Quantiles)
    tpot_ms: Quantiles = field(default_factory=Quantiles)
    itl_ms: Quantiles = field(default_factory=Quantiles)
    itl_source: str | None = None
    e2e_ms: Quantiles = field(default_factory=Quantiles)
    request_throughput_per_s: float | None = None
    output_token_throughput_per_s: float | None = None
    tokens_recomputed: int | None = None
    bytes_moved: int | None = None
    cache_mismatches: int | None = None
    cache_mismatch_list: list[Json] = field(default_factory=list)
    hint_honoured: Rate | None = None
    effective_retention: Rate | None = None
    job_completion_s: Quantiles = field(default_factory=Quantiles)
    makespan_s: float | None = None
    memory_time_token_s: float | None = None
    memory_time_mib_s: float | None = None
    kv_paused_peak_tokens: float | None = None
    kv_paused_mean_tokens: float | None = None
    kv_active_peak_tokens: float | None = None
    kv_active_mean_tokens: float | None = None
    goodput_per_min: float | None = None
    outcome_ci95: OutcomeIntervals = field(default_factory=OutcomeIntervals)
    bystander_ttft_ms: Quantiles = field(default_factory=Quantiles)
    by_tool_class: Json = field(default_factory=dict)
    by_pause_bucket: Json = field(default_factory=dict)
    reuse: Json | None = None
    routing: Json | None = None
    server_occupancy: Json | None = None
    server_times_ms: Json | None = None
    duration_s: float | None = None
    pauses: int | None = None
    pause_actions: dict[str, int] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    kv_bytes_per_token: float | None = None
    warnings: list[str] = field(default_factory=list)
    health: list[HealthCheck] = field(default_factory=list)
    run_id: str | None = None
    summary_version: str | None = SUMMARY_VERSION
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = SUMMARY_KEYS
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "runtime": _text, "policy": _text, "trajectories": _nested(Trajectories),
        "resume_latency_ms": _QUANTILES, "resume_parts_ms": _object,
        "client_lag_ms": _QUANTILES, "ttft_ms": _QUANTILES, "tpot_ms": _QUANTILES,
        "itl_ms": _QUANTILES, "itl_source": _text, "e2e_ms": _QUANTILES,
        "request_throughput_per_s": _number, "output_token_throughput_per_s": _number,
        "tokens_recomputed": _count, "bytes_moved": _count, "cache_mismatches": _count,
        "cache_mismatch_list": _list, "hint_honoured": _nested_or_null(Rate),
        "effective_retention": _nested_or_null(Rate), "job_completion_s": _QUANTILES,
        "makespan_s": _number, "memory_time_token_s": _number, "memory_time_mib_s": _number,
        "kv_paused_peak_tokens": _number, "kv_paused_mean_tokens": _number,
        "kv_active_peak_tokens": _number, "kv_active_mean_tokens": _number,
        "goodput_per_min": _number, "outcome_ci95": _nested(OutcomeIntervals),
        "bystander_ttft_ms": _QUANTILES, "by_tool_class": _object, "by_pause_bucket": _object,
        "reuse": _object_or_null, "routing": _object_or_null,
        "server_occupancy": _object_or_null, "server_times_ms": _object_or_null,
        "duration_s": _number, "pauses": _count, "pause_actions": _object, "slo": _object,
        "kv_bytes_per_token": _number, "warnings": _list, "health": _health,
        "run_id": _text, "summary_version": _text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = SUMMARY_JSON) -> Summary:
        """The summary of summary.json's content (see the module's note on older and newer
        keys); InputError naming `where` and the key for a value of the wrong kind."""
        summary: Summary = cls.read(data, where)
        return summary

    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        if key in self.KEYS and key not in self.absent:
            return _encode(getattr(self, key))
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (k for k in self.KEYS if k not in self.absent)
        yield from self.extra

    def __len__(self) -> int:
        return len(self.KEYS) - len(self.absent) + len(self.extra)


def save_summary(directory: Path, summary: Summary) -> None:
    """Write `summary` as the directory's summary.json (atomically)."""
    write_json(directory / SUMMARY_JSON, summary.to_json())


def read_summary(directory: Path) -> Summary:
    """The directory's summary.json; InputError when it is missing or not a summary."""
    path = directory / SUMMARY_JSON
    if not path.is_file():
        raise InputError(f"{path}: no summary (the run did not finish writing its results)")
    return Summary.from_json(read_json(path), str(path))
