"""capacity.json as types: the one `CapacityResult` a capacity search returns and its report
reads, one `PolicyResult` per policy searched, each point a `CapacityPoint`.

`save_capacity(root, result)` is the only writer of capacity.json and `read_capacity(root)` its
only reader; reading a file and saving it again gives the same bytes. As with summary.json
(harness.metrics.summary_types), a key a document lacks stays out when it is written again
(`absent`), keys this harness does not know are kept as read (`extra`), values are kept as
read and only their kind is checked: a value of the wrong kind is one InputError naming the
file and the key. Every field may be None (null in the file, or absent).

The search itself (harness.capacity.driver) builds each policy's entry as JSON while it runs;
`PolicyResult.of(entry)` types it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.errors import InputError
from harness.metrics.summary_types import Decoder, Json, JsonObject, Quantiles
from harness.records.store import read_json, write_json

CAPACITY_JSON = "capacity.json"


def _of_kind(ok: Callable[[Any], bool], want: str) -> Decoder:
    """A decoder that keeps a value of the kind `ok` accepts, or None."""
    def decode(value: Any, where: str, key: str) -> Any:
        if value is None or ok(value):
            return value
        raise InputError(f"{where}: {key} must be {want} or null, got {type(value).__name__}")
    return decode


NUMBER = _of_kind(lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")
COUNT = _of_kind(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
TEXT = _of_kind(lambda v: isinstance(v, str), "a string")
FLAG = _of_kind(lambda v: isinstance(v, bool), "true or false")
OBJECT = _of_kind(lambda v: isinstance(v, dict), "a JSON object")
LIST = _of_kind(lambda v: isinstance(v, list), "a list")


def nested(cls: type[JsonObject]) -> Decoder:
    """A decoder of a JSON object read as `cls` (or null)."""
    def decode(value: Any, where: str, key: str) -> Any:
        obj = OBJECT(value, where, key)
        return None if obj is None else cls.read(obj, f"{where} {key}")
    return decode


def _item(cls: type[JsonObject], value: Any, where: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise InputError(f"{where}: each of {key} must be a JSON object, got "
                         f"{type(value).__name__}")
    return cls.read(value, f"{where} {key}")


def nested_list(cls: type[JsonObject]) -> Decoder:
    """A decoder of a list of JSON objects, each read as `cls` (or null for the list)."""
    def decode(value: Any, where: str, key: str) -> Any:
        items = LIST(value, where, key)
        return None if items is None else [_item(cls, x, where, key) for x in items]
    return decode


def nested_map(cls: type[JsonObject]) -> Decoder:
    """A decoder of a JSON object of JSON objects, each read as `cls` (or null for the map)."""
    def decode(value: Any, where: str, key: str) -> Any:
        items = OBJECT(value, where, key)
        return None if items is None else {
            k: _item(cls, x, where, f"{key} {k}") for k, x in items.items()}
    return decode


def encode(value: Any) -> Any:
    """The JSON form of a field's value (typed objects, in lists and maps too)."""
    if isinstance(value, JsonObject):
        return value.to_json()
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


class Document(JsonObject):
    """A JsonObject whose fields may hold maps of typed objects too."""

    def to_json(self) -> Json:
        """The JSON object: the known keys it has, then the unknown ones, as read."""
        out = {k: encode(getattr(self, k)) for k in self.KEYS if k not in self.absent}
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class JudgedTerm(Document):
    """One SLO term judged on a point: its bound, the point's value, how far inside the bound
    (negative: broken), whether it was met, the value's 95% interval and whether the bound lies
    inside it (harness.capacity.slo.Slo.judge)."""

    term: str | None = None
    bound: float | None = None
    value: float | None = None
    margin: float | None = None
    met: bool | None = None
    ci95: list[float | None] | None = None
    bound_in_ci: bool | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("term", "bound", "value", "margin", "met", "ci95",
                                       "bound_in_ci")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "term": TEXT, "bound": NUMBER, "value": NUMBER, "margin": NUMBER, "met": FLAG,
        "ci95": LIST, "bound_in_ci": FLAG}


@dataclass(frozen=True)
class CapacityPoint(Document):
    """One measured point (harness.capacity.driver.judge_point): `agents` closed-loop agents,
    its verdict against the SLO and the window's figures. The figures at a policy's capacity
    (`PolicyResult.at_capacity`) are one too, with only agents, dir and the figures."""

    agents: int | None = None
    repeat: int | None = None
    phase: str | None = None
    dir: str | None = None
    passed: bool | None = None
    server_failed: int | None = None
    close: bool | None = None
    saturated: bool | None = None
    judgement: list[JudgedTerm] | None = None
    text: str | None = None
    resume_latency_ms: Quantiles | None = None
    ttft_ms: Quantiles | None = None
    success_rate: float | None = None
    goodput_per_min: float | None = None
    jobs_per_hour: float | None = None
    kv_paused_mean_mib: float | None = None
    kv_paused_mean_tokens: float | None = None
    queue_growth: float | None = None
    ttft_halves_ms: list[float] | None = None
    tasks: Any = None  # the window's task counts, as it gives them
    calls: Any = None
    measured_s: float | None = None
    wall_s: float | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = (
        "agents", "repeat", "phase", "dir", "passed", "server_failed", "close", "saturated",
        "judgement", "text", "resume_latency_ms", "ttft_ms", "success_rate", "goodput_per_min",
        "jobs_per_hour", "kv_paused_mean_mib", "kv_paused_mean_tokens", "queue_growth",
        "ttft_halves_ms", "tasks", "calls", "measured_s", "wall_s")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "agents": COUNT, "repeat": COUNT, "phase": TEXT, "dir": TEXT, "passed": FLAG,
        "server_failed": COUNT, "close": FLAG, "saturated": FLAG,
        "judgement": nested_list(JudgedTerm), "text": TEXT,
        "resume_latency_ms": nested(Quantiles), "ttft_ms": nested(Quantiles),
        "success_rate": NUMBER, "goodput_per_min": NUMBER, "jobs_per_hour": NUMBER,
        "kv_paused_mean_mib": NUMBER, "kv_paused_mean_tokens": NUMBER, "queue_growth": NUMBER,
        "ttft_halves_ms": LIST, "measured_s": NUMBER, "wall_s": NUMBER}

    def terms(self) -> list[JudgedTerm]:
        """The judged terms (none where the point has no judgement)."""
        return list(self.judgement or [])

    def verdict(self) -> bool | None:
        """Saturated fails; else `passed`, else every term met (None: unknown)."""
        if self.saturated is True:
            return False
        if self.passed is not None:
            return self.passed
        terms = self.terms()
        return all(t.met is True for t in terms) if terms else None


@dataclass(frozen=True)
class Confirmation(Document):
    """A policy's confirmation: its capacity measured again (`at`) and the count above it
    (`above`, None at max agents), and whether they agreed with the search."""

    at: CapacityPoint | None = None
    above: CapacityPoint | None = None
    confirmed: bool | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("at", "above", "confirmed")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "at": nested(CapacityPoint), "above": nested(CapacityPoint), "confirmed": FLAG}


@dataclass(frozen=True)
class PolicyResult(Document):
    """One policy's search (harness.capacity.driver.search_policy): every point, the capacity
    found, the smallest failing count above it, why the search stopped, its confirmation (or
    why it was skipped), the figures at capacity and the time it took."""

    policy: str | None = None
    policy_args: dict[str, str] | None = None
    points: list[CapacityPoint] | None = None
    confirm: Confirmation | None = None
    capacity: int | None = None
    failing_above: int | None = None
    reason: str | None = None
    confirm_skipped: str | None = None
    at_capacity: CapacityPoint | None = None
    elapsed_s: float | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = (
        "policy", "policy_args", "points", "confirm", "capacity", "failing_above", "reason",
        "confirm_skipped", "at_capacity", "elapsed_s")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "policy": TEXT, "policy_args": OBJECT, "points": nested_list(CapacityPoint),
        "confirm": nested(Confirmation), "capacity": COUNT, "failing_above": COUNT,
        "reason": TEXT, "confirm_skipped": TEXT, "at_capacity": nested(CapacityPoint),
        "elapsed_s": NUMBER}

    @classmethod
    def of(cls, entry: Mapping[str, Any], where: str = "capacity search") -> PolicyResult:
        """The typed entry of a search's JSON entry."""
        result: PolicyResult = cls.read(entry, where)
        return result

    def measured(self) -> list[CapacityPoint]:
        """The points measured (none where it has none)."""
        return list(self.points or [])

    @property
    def contradicted(self) -> bool:
        """Whether a confirmation ran and contradicted the search."""
        return self.confirm is not None and not self.confirm.confirmed


@dataclass(frozen=True)
class SloTerm(Document):
    """One term of the search's SLO: its name, bound (ms for a latency) and kind ('latency'
    or 'fraction')."""

    term: str | None = None
    bound: float | None = None
    kind: str | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("term", "bound", "kind")
    DECODERS: ClassVar[dict[str, Decoder]] = {"term": TEXT, "bound": NUMBER, "kind": TEXT}


@dataclass(frozen=True)
class PointLength(Document):
    """How long each point ran and how much of its start was dropped as warm-up."""

    duration_s: float | None = None
    warmup_s: float | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("duration_s", "warmup_s")
    DECODERS: ClassVar[dict[str, Decoder]] = {"duration_s": NUMBER, "warmup_s": NUMBER}


@dataclass(frozen=True)
class CapacityResult(Document):
    """capacity.json: a capacity search of one or more policies on a server under an SLO
    (harness.capacity.run.run_capacity), each policy's result by its name."""

    kind: str | None = "capacity"
    slo: str | None = None
    slo_terms: list[SloTerm] | None = None
    trace: str | None = None
    runtime: str | None = None
    url: str | None = None
    point: PointLength | None = None
    budget_s: float | None = None
    started_at: str | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    policies: dict[str, PolicyResult] | None = None
    elapsed_s: float | None = None
    absent: frozenset[str] = frozenset()
    extra: Json = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = (
        "kind", "slo", "slo_terms", "trace", "runtime", "url", "point", "budget_s",
        "started_at", "slots", "ctx_per_slot", "policies", "elapsed_s")
    DECODERS: ClassVar[dict[str, Decoder]] = {
        "kind": TEXT, "slo": TEXT, "slo_terms": nested_list(SloTerm), "trace": TEXT,
        "runtime": TEXT, "url": TEXT, "point": nested(PointLength), "budget_s": NUMBER,
        "started_at": TEXT, "slots": COUNT, "ctx_per_slot": COUNT,
        "policies": nested_map(PolicyResult), "elapsed_s": NUMBER}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = CAPACITY_JSON) -> CapacityResult:
        """The result of capacity.json's content (see the module's note on missing and unknown
        keys); InputError naming `where` and the key for a value of the wrong kind."""
        result: CapacityResult = cls.read(data, where)
        return result

    def searched(self) -> list[tuple[str, PolicyResult]]:
        """(name, result) of every policy searched, in the order searched."""
        return list((self.policies or {}).items())

    @property
    def contradicted(self) -> bool:
        """Whether any policy's confirmation contradicted its search."""
        return any(p.contradicted for _, p in self.searched())


def save_capacity(root: Path, result: CapacityResult) -> Path:
    """Write `result` as root/capacity.json (the only writer of the file); returns its path."""
    path = root / CAPACITY_JSON
    write_json(path, result.to_json())
    return path


def read_capacity(root: Path) -> CapacityResult:
    """root/capacity.json as written by save_capacity (the only reader of the file);
    InputError for a file that is not a JSON object or holds a value of the wrong kind."""
    path = root / CAPACITY_JSON
    return CapacityResult.from_json(read_json(path), f"{path} (not the shape harness writes)")
