"""The record events, one declaration each: its name, its columns, and what each column means.

Every event is a frozen dataclass (`Record` subclass) whose fields are its columns; `KIND` is
the event's name. From these declarations come the records' Parquet schema
(harness.records.schema.RECORDS_SCHEMA), the writers' typed rows (a replay builds a `CallEnd(...)`
and hands it to its recorder: a column its event does not have is a type error, and a
TypeError at run time) and the readers' per-event columns (harness.metrics.events reads only
the columns an event declares). A column has one type and one meaning in every event that
has it (COLUMNS); each event's field says what it holds there.

Besides its own columns every row has `run_id`, `seq`, `t_ns` and `event`, stamped by the
writer (STAMPED).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa


@dataclass(frozen=True)
class Column:
    """One records column: its Arrow type and what it holds, in every event that has it."""

    name: str
    type: pa.DataType
    doc: str
    nullable: bool = True


_S, _I32, _I64, _F64 = pa.string(), pa.int32(), pa.int64(), pa.float64()
# Every column in schema order. A column's meaning is the same in every event that has it.
COLUMNS: tuple[Column, ...] = (
    Column("run_id", _S, "the run", nullable=False),
    Column("seq", _I64, "the event's sequence number in the run", nullable=False),
    Column("t_ns", _I64, "when it happened: monotonic ns since the run's origin",
           nullable=False),
    Column("event", _S, "the event's kind (Record.KIND)", nullable=False),
    Column("trajectory_id", _S, "the trajectory (a bystander: its request)"),
    Column("traffic", _S, "agent | bystander"),
    Column("step", _I32, "the trajectory step it belongs to"),
    Column("slot", _I32, "the server KV slot"),
    Column("tool_class", _S, "the tool's class"),
    Column("tool_name", _S, "the tool's name"),
    Column("action", _S, "the pause policy's action"),
    Column("reason", _S, "why"),
    Column("status", _S, "how it went"),
    Column("planned_ns", _I64, "when it was due (t_ns scale)"),
    Column("prompt_tokens", _I64, "the call's prompt tokens (context held + appended)"),
    Column("appended_tokens", _I64, "the tokens the call appends to its context"),
    Column("is_resume", pa.bool_(), "the call resumes a pause"),
    Column("output_tokens", _I64, "tokens generated"),
    Column("cached_tokens", _I64, "prompt tokens the server found cached"),
    Column("prompt_n", _I64, "prompt tokens the server processed"),
    Column("retained_tokens", _I64, "context tokens retained over the pause"),
    Column("recomputed_tokens", _I64, "context tokens prefilled again"),
    Column("kv_tokens", _I64, "device KV tokens the trajectory holds"),
    Column("bytes", _I64, "KV bytes moved"),
    Column("server_ms", _F64, "the server's own time for the work, ms"),
    Column("decode_ms", _F64, "the server's decode time, ms"),
    Column("engine_queue_s", _F64, "the server's report of the call's wait in its queue, s"),
    Column("planned_latency_s", _F64, "the tool's planned latency, s"),
    Column("predicted_wait_s", _F64, "the policy's prediction of the pause, s"),
    Column("slot_wait_s", _F64, "seconds waited for a free slot"),
    Column("deadline_s", _F64, "the tool's deadline, s"),
    Column("detail", _S, "free text"),
    Column("token_gaps", pa.binary(), "client times between streamed chunks, us (uint32 LE)"),
    Column("parent_id", _S, "a sub-agent's parent trajectory"),
    Column("served_by", _S, "the worker that served the call"),
    Column("priority", _S, "the trajectory's priority (the trace's)"),
    Column("spawn_step", _I32, "a sub-agent's: its parent's step that spawned it"),
    Column("held_s", _F64, "how long the server held a context before it released it, s"),
    Column("hint_delay_s", _F64, "how long after it was asked the server applied a hint, s"),
)
BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
STAMPED = ("run_id", "seq", "t_ns", "event")
_DOC, _FRAME = "doc", "frame"
# A merge's note on the trajectory_start and trajectory_end it writes for a lost shard's
# trajectories (harness.records.merge).
WORKER_LOST = "worker-lost"


def col(doc: str, frame: str | None = None) -> Any:
    """An event's column (null unless given) and what it holds in that event. `frame`: the
    name the metrics' tables (harness.metrics.frames) give it, where that differs; the
    declaration says why."""
    meta = {_DOC: doc} if frame is None else {_DOC: doc, _FRAME: frame}
    return field(default=None, metadata=meta)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """What every event has besides the stamped columns."""

    KIND: ClassVar[str] = ""
    trajectory_id: str = field(metadata={_DOC: "the trajectory (a bystander: its request)"})
    traffic: str = field(metadata={_DOC: "agent | bystander"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryStart(Record):
    KIND: ClassVar[str] = "trajectory_start"
    planned_ns: int | None = col("its scheduled arrival")
    priority: str | None = col("its priority (the trace's)")
    parent_id: str | None = col("a sub-agent's parent")
    spawn_step: int | None = col("a sub-agent's: the parent's step that spawned it")
    detail: str | None = col(f"{WORKER_LOST} on the placeholder a merge writes for a lost "
                             "shard's trajectory that never started")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStart(Record):
    KIND: ClassVar[str] = "call_start"
    step: int | None = col("the call's step")
    slot: int | None = col("the slot it runs in")
    planned_ns: int | None = col("when the call was due")
    prompt_tokens: int | None = col("its prompt: the context held plus what it appends")
    appended_tokens: int | None = col("what it appends to the context")
    is_resume: bool | None = col("it resumes a pause")


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstToken(Record):
    KIND: ClassVar[str] = "first_token"
    step: int | None = col("the call's step")
    slot: int | None = col("the call's slot")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEnd(Record):
    KIND: ClassVar[str] = "call_end"
    step: int | None = col("the call's step")
    slot: int | None = col("the call's slot")
    status: str | None = col("ok | error | timeout | aborted")
    output_tokens: int | None = col("tokens generated")
    cached_tokens: int | None = col("prompt tokens the server found cached")
    prompt_n: int | None = col("prompt tokens the server processed")
    server_ms: float | None = col("the server's prompt time, ms")
    decode_ms: float | None = col("the server's decode time, ms")
    detail: str | None = col("an error's text")
    served_by: str | None = col("the worker that served it, where the runtime says "
                                "(Dynamo's worker id)")
    token_gaps: bytes | None = col("the client's time between one streamed chunk of tokens "
                                   "and the next, us, little-endian uint32")
    engine_queue_s: float | None = col("the server's own report of the call's wait in its "
                                       "queue before it was first scheduled, s (vLLM)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStart(Record):
    KIND: ClassVar[str] = "tool_start"
    step: int | None = col("the tool's step")
    slot: int | None = col("the slot the paused context is in (the simulator's)")
    tool_class: str | None = col("the tool's class")
    tool_name: str | None = col("the tool's name")
    # planned_s in the pauses table: the name its metrics and reports have always read
    planned_latency_s: float | None = col("its planned latency, s (hidden from policies)",
                                          frame="planned_s")
    deadline_s: float | None = col("its deadline, s (null: none)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolEnd(Record):
    KIND: ClassVar[str] = "tool_end"
    step: int | None = col("the tool's step")
    slot: int | None = col("the slot the paused context is in (the simulator's)")
    tool_class: str | None = col("the tool's class")
    status: str | None = col("ok | error | timeout | abandoned")
    planned_ns: int | None = col("when the tool was due to end; t_ns is when the harness woke "
                                 "to it, the difference its client lag")


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseDecision(Record):
    KIND: ClassVar[str] = "pause_decision"
    step: int | None = col("the tool's step")
    slot: int | None = col("the slot the context is in")
    tool_class: str | None = col("the tool's class")
    action: str | None = col("keep | swap | recompute | ttl | cancel | keep-evictable")
    reason: str | None = col("the policy's reason")
    status: str | None = col("ok | unsupported (the server cannot do the action)")
    retained_tokens: int | None = col("the context at stake")
    # predicted_s in the pauses table: the name its metrics and reports have always read
    predicted_wait_s: float | None = col("the policy's predicted wait, s", frame="predicted_s")
    detail: str | None = col("the action's parameters (a TTL's)")


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapOut(Record):
    KIND: ClassVar[str] = "swap_out"
    step: int | None = col("the pause's step")
    slot: int | None = col("the slot swapped out")
    bytes: int | None = col("KV bytes written to host")
    server_ms: float | None = col("the server's time for it, ms")
    retained_tokens: int | None = col("tokens swapped out")
    reason: str | None = col("why")
    status: str | None = col("unsupported: the server refused")
    detail: str | None = col("the refusal's text")


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapIn(Record):
    KIND: ClassVar[str] = "swap_in"
    step: int | None = col("the step resumed")
    slot: int | None = col("the slot swapped into")
    bytes: int | None = col("KV bytes read back")
    server_ms: float | None = col("the server's time for it, ms")
    retained_tokens: int | None = col("tokens swapped in")
    detail: str | None = col("on the resumed call: the server restored it with the call, "
                             "whose time holds its own")


@dataclass(frozen=True, slots=True, kw_only=True)
class Erase(Record):
    KIND: ClassVar[str] = "erase"
    step: int | None = col("the pause's step")
    slot: int | None = col("the slot erased")
    reason: str | None = col("why")


@dataclass(frozen=True, slots=True, kw_only=True)
class Recompute(Record):
    KIND: ClassVar[str] = "recompute"
    step: int | None = col("the step resumed")
    slot: int | None = col("the slot it is prefilled into (the simulator's)")
    recomputed_tokens: int | None = col("the context prefilled again")


@dataclass(frozen=True, slots=True, kw_only=True)
class KvState(Record):
    KIND: ClassVar[str] = "kv_state"
    kv_tokens: int | None = col("device KV held by the trajectory from here")
    status: str | None = col("active | paused | released | evictable")
    detail: str | None = col("what it took (an evictable context prefilled again)")


@dataclass(frozen=True, slots=True, kw_only=True)
class HintOutcome(Record):
    KIND: ClassVar[str] = "hint_outcome"
    step: int | None = col("the pause's step")
    action: str | None = col("the hint the pause sent: keep | swap | recompute | ttl")
    status: str | None = col("accepted | clipped | deferred | rejected | missing "
                             "(harness.policies.pin_release)")
    reason: str | None = col("why, in the server's terms (the valve's order, an expiry, a cap)")
    held_s: float | None = col("clipped: how long the server held it before releasing it, s")
    hint_delay_s: float | None = col("deferred: how long after it was asked the server "
                                     "applied it, s")
    detail: str | None = col("the server's own words")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotWait(Record):
    KIND: ClassVar[str] = "slot_wait"
    step: int | None = col("the step that waited")
    slot: int | None = col("the slot it got")
    slot_wait_s: float | None = col("seconds waited for a free slot")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Record):
    KIND: ClassVar[str] = "cancel"
    step: int | None = col("the step at which it was cancelled")
    reason: str | None = col("why")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryEnd(Record):
    KIND: ClassVar[str] = "trajectory_end"
    status: str | None = col("completed | cancelled | failed | interrupted")
    reason: str | None = col("why it ended so")


# Every event kind, in the order a simulated part groups its rows.
KINDS: tuple[type[Record], ...] = (
    TrajectoryStart, CallStart, FirstToken, CallEnd, ToolStart, PauseDecision, SwapOut, SwapIn,
    Erase, Recompute, KvState, SlotWait, Cancel, ToolEnd, TrajectoryEnd, HintOutcome)
BY_KIND: dict[str, type[Record]] = {k.KIND: k for k in KINDS}


def columns_of(kind: type[Record]) -> tuple[str, ...]:
    """An event kind's own columns (the stamped ones aside), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(kind))


def meanings(kind: type[Record]) -> dict[str, str]:
    """An event kind's columns and what each holds in it."""
    return {f.name: str(f.metadata.get(_DOC, BY_NAME[f.name].doc))
            for f in dataclasses.fields(kind)}


# An event's columns: its declared fields; the writers' rows are built from these.
KIND_COLUMNS: dict[str, tuple[str, ...]] = {k.KIND: columns_of(k) for k in KINDS}
# Per event, its columns that the metrics' tables name otherwise (col's `frame`).
FRAME_NAMES: dict[str, dict[str, str]] = {
    k.KIND: {f.name: str(f.metadata[_FRAME]) for f in dataclasses.fields(k)
             if _FRAME in f.metadata}
    for k in KINDS}


def _python_type(typ: pa.DataType) -> str:
    for check, name in ((pa.types.is_boolean, "bool"), (pa.types.is_integer, "int"),
                        (pa.types.is_floating, "float"), (pa.types.is_string, "str"),
                        (pa.types.is_binary, "bytes")):
        if check(typ):
            return name
    raise TypeError(f"no Python type for {typ}")


def _check() -> None:
    """Every declared column is a records column, of a Python type its Arrow type takes."""
    for kind in KINDS:
        for f in dataclasses.fields(kind):
            if f.name not in BY_NAME or f.name in STAMPED:
                raise TypeError(f"{kind.__name__}.{f.name} is not a records column")
            want = _python_type(BY_NAME[f.name].type)
            if str(f.type).split(" | ")[0] != want:
                raise TypeError(f"{kind.__name__}.{f.name}: {f.type}, its column holds {want}")


_check()
