"""Compact rows of events -> RECORDS_SCHEMA columns, event by event.

The rows of a part are grouped by event (in EVENTS order, by seq within an event): each column is
then a run of segments, one per event, computed only where the event fills the column and null
elsewhere, so building a column costs the values it holds, not a pass over the whole part.
Readers order records by `seq` (harness.records.store.read_records). String columns are built as
dictionary arrays (codes into a vocabulary); the part is written without the Arrow schema, so it
reads back as RECORDS_SCHEMA's plain strings (records.RecordSink).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from harness.policies.pin_release import HINT_OUTCOMES
from harness.records.kinds import KINDS
from harness.records.schema import RECORD_COLUMNS
from harness.simulate.workload import OUTCOMES, Workload

# The event kinds in their declared order (a part's rows are grouped so): codes E_*.
EVENTS = tuple(k.KIND for k in KINDS)
(E_TRAJ_START, E_CALL_START, E_FIRST_TOKEN, E_CALL_END, E_TOOL_START, E_DECISION, E_SWAP_OUT,
 E_SWAP_IN, E_ERASE, E_RECOMPUTE, E_KV_STATE, E_SLOT_WAIT, E_CANCEL, E_TOOL_END,
 E_TRAJ_END, E_HINT_OUTCOME) = range(len(EVENTS))
ACTIONS = ("keep", "swap", "recompute", "ttl", "keep-evictable")
KV_STATUSES = ("active", "paused", "released", "evictable")
END_STATUSES = ("completed", "cancelled", "failed")
TIMEOUT_ERROR = 1  # an error call_end's b (NaN prompt_n): 1 the client's timeout, 0 an overflow
KV_STATUS_AT = len(OUTCOMES)  # where each group starts in the status vocabulary
END_STATUS_AT = KV_STATUS_AT + len(KV_STATUSES)
HINT_STATUS_AT = END_STATUS_AT + len(END_STATUSES)
_DEFERRED = HINT_OUTCOMES.index("deferred")
NS = 1_000_000_000
# The columns `decode` builds, by group; it returns those of RECORDS_SCHEMA in its order.
_IDENTITY = ("run_id", "seq", "t_ns", "event", "trajectory_id", "traffic", "step", "slot")
_LABELS = ("tool_class", "tool_name", "action", "reason", "status")
_COUNTS = ("planned_ns", "prompt_tokens", "appended_tokens", "is_resume", "output_tokens",
           "cached_tokens", "prompt_n", "retained_tokens", "recomputed_tokens", "kv_tokens",
           "bytes")
_TIMES = ("server_ms", "decode_ms", "planned_latency_s", "predicted_wait_s", "slot_wait_s",
          "deadline_s")
_EVENT_NAMES = pa.array(EVENTS)
_STATUS_VOCAB = pa.array([*OUTCOMES, *KV_STATUSES, *END_STATUSES, *HINT_OUTCOMES])
_ACTION_VOCAB = pa.array(ACTIONS)
_AGENT = pa.array(["agent"])
_TRAFFIC = pa.array(["agent", "bystander"])


def dictionary(codes: np.ndarray, vocab: pa.Array, null: np.ndarray | None = None) -> pa.Array:
    """A string column as codes into `vocab` (Parquet writes it dictionary-encoded as it is);
    `null` marks null rows, and so does a code of a null vocabulary entry."""
    vocab = vocab.cast(pa.string())
    if vocab.null_count:
        hole = np.asarray(vocab.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        bad = hole[np.where(null, 0, codes) if null is not None else codes]
        null = bad if null is None else null | bad
        vocab = vocab.fill_null("")
    idx = pa.array(np.where(null, 0, codes) if null is not None else codes, type=pa.int32(),
                   mask=null)
    return pa.DictionaryArray.from_arrays(idx, vocab)


@dataclass(frozen=True)
class RunStatics:
    """What a part's decoding looks up: the workload and the run's constants."""

    run_id: str
    w: Workload
    first: np.ndarray  # first global step of each trajectory
    ids: pa.Array  # trajectory ids
    priorities: pa.Array  # distinct priorities
    prio: np.ndarray  # each trajectory's index into `priorities`
    bpt: float  # KV bytes per token
    ctx_limit: int


def decode(blocks: list[tuple[np.ndarray, ...]], texts: pa.Array,
           r: RunStatics) -> list[pa.Array]:
    """Compact rows by event (harness.simulate.steps.blocks) -> one Arrow array per
    RECORDS_SCHEMA column, in its order."""
    p = _Part(blocks, r)
    ends = _CallEnds(p)
    cols = {**dict(zip(_IDENTITY, _identity_columns(p), strict=True)),
            **dict(zip(_LABELS, _label_columns(p, texts, ends), strict=True)),
            **dict(zip(_COUNTS, _count_columns(p, ends), strict=True)),
            **dict(zip(_TIMES, _time_columns(p, ends), strict=True)),
            "detail": _detail_column(p, texts, ends),
            # a call_end's served_by: the server that served it, as a replay records its worker
            "served_by": p.strings({E_CALL_END: p.d[p.sl[E_CALL_END]]}, texts),
            # no server reports its queue wait in a simulation
            "engine_queue_s": pa.nulls(p.n, pa.float64()),
            # The simulator spaces a call's tokens evenly (decode_ms): no streamed chunk times.
            "token_gaps": pa.nulls(p.n, pa.binary()),
            "parent_id": _parent_column(p),
            # a hint_outcome's b: how long a clipped pin was held, how late a deferred hint's
            # offload or drop was applied
            **_hint_times(p),
            **_start_columns(p)}
    return [cols[name] for name in RECORD_COLUMNS]


class _Part:
    """A part's compact rows, concatenated in EVENTS order: the columns, the slice of each
    event's rows, and the column builders that fill one segment per event."""

    def __init__(self, blocks: list[tuple[np.ndarray, ...]], r: RunStatics) -> None:
        self.r = r
        self.w = r.w
        sizes = np.array([len(bk[0]) for bk in blocks], dtype=np.int64)
        self.n = int(sizes.sum())
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        self.sl = [slice(int(bounds[e]), int(bounds[e + 1])) for e in range(len(EVENTS))]
        seq, self.t, ti, step, slot, self.a, self.b, self.c, self.d = (
            np.concatenate([bk[k] for bk in blocks]) for k in range(9))
        self.seq, self.ti, self.step, self.slot = (x.astype(np.int64)
                                                   for x in (seq, ti, step, slot))
        self.ev = np.repeat(np.arange(len(EVENTS), dtype=np.int64), sizes)

    def steps_of(self, e: int) -> np.ndarray:
        """The global step index of event `e`'s rows."""
        return self.r.first[self.ti[self.sl[e]]] + self.step[self.sl[e]]

    def column(self, parts: dict[int, Any], typ: pa.DataType) -> pa.Array:
        """`parts`: event -> its values (NaN for a float column: null); other events null."""
        chunks = []
        for e in range(len(EVENTS)):
            m = self.sl[e].stop - self.sl[e].start
            if m:
                v = parts.get(e)
                if v is None:
                    chunks.append(pa.nulls(m, typ))
                elif pa.types.is_floating(typ):
                    chunks.append(pa.array(np.asarray(v, dtype=np.float64), type=typ,
                                           from_pandas=True))
                else:
                    v = np.asarray(v)
                    if v.dtype.kind == "f":  # NaN: null
                        nan = np.isnan(v)
                        chunks.append(pa.array(np.where(nan, 0, v).astype(np.int64), type=typ,
                                               mask=nan))
                    else:
                        chunks.append(pa.array(v.astype(np.int64), type=typ))
        return pa.concat_arrays(chunks) if chunks else pa.array([], type=typ)

    def strings(self, parts: dict[int, Any], vocab: pa.Array) -> pa.Array:
        """A string column: `parts`, event -> codes into `vocab`; other events null."""
        codes = np.full(self.n, -1, dtype=np.int32)
        for e, v in parts.items():
            codes[self.sl[e]] = v
        return dictionary(codes, vocab, codes < 0)


class _CallEnds:
    """The call_end rows: an error (NaN prompt_n; b: 0 a context overflow, 1 the client's
    first-token timeout, whose message is text c) or a call that ran."""

    def __init__(self, p: _Part) -> None:
        end = p.sl[E_CALL_END]
        self.err = np.isnan(p.a[end])
        self.timeout = self.err & (p.b[end] == TIMEOUT_ERROR)
        self.overflow = self.err & ~self.timeout
        self.message = p.c[end]  # a timeout's text
        self.steps = p.steps_of(E_CALL_END)
        self.prompt_n = p.a[end]  # NaN on an overflow error: the ok-only columns are null there
        self.nan_on_err = np.where(self.err, np.nan, 0.0)  # add it to null the error rows

    def ok_only(self, v: np.ndarray) -> dict[int, Any]:
        """`v` for the call_end rows, null on the error rows."""
        return {E_CALL_END: v + self.nan_on_err}


def _identity_columns(p: _Part) -> list[pa.Array]:
    """run_id, seq, t_ns, event, trajectory_id, traffic, step, slot."""
    zeros = np.zeros(p.n, dtype=np.int32)
    return [
        dictionary(zeros, pa.array([p.r.run_id])),
        pa.array(p.seq.astype(np.int64)),
        pa.array(np.rint(p.t * NS).astype(np.int64)),
        dictionary(p.ev.astype(np.int32), _EVENT_NAMES),
        dictionary(p.ti.astype(np.int32), p.r.ids),
        # Workload.bystanders: the last trajectories are a replay's bystander requests
        dictionary((p.ti >= p.w.n_trajectories - p.w.bystanders).astype(np.int32), _TRAFFIC)
        if p.w.bystanders else dictionary(zeros, _AGENT),
        # a trajectory_start's step is its parent's spawning step: spawn_step, not step
        pa.array(p.step.astype(np.int32), mask=(p.step < 0) | (p.ev == E_TRAJ_START)),
        pa.array(p.slot.astype(np.int32), mask=p.slot < 0),
    ]


def _label_columns(p: _Part, texts: pa.Array, ends: _CallEnds) -> list[pa.Array]:
    """tool_class, tool_name, action, reason, status."""
    w, a, b, c, sl = p.w, p.a, p.b, p.c, p.sl
    tools = {e: w.cls[p.steps_of(e)] for e in (E_TOOL_START, E_DECISION, E_TOOL_END)}
    dec_a = a[sl[E_DECISION]].astype(np.int64)
    hint_a = a[sl[E_HINT_OUTCOME]].astype(np.int64)  # action code + 8 x outcome
    # OUTCOMES: ok, error (an overflow), timeout
    ok_or_err = np.where(ends.timeout, 2, np.where(ends.err, 1, 0))
    return [
        p.strings(tools, pa.array(w.classes, type=pa.string())),
        p.strings({E_TOOL_START: w.name[p.steps_of(E_TOOL_START)]},
                  pa.array(w.names, type=pa.string())),
        p.strings({E_DECISION: dec_a % 8, E_HINT_OUTCOME: hint_a % 8}, _ACTION_VOCAB),
        p.strings({E_DECISION: c[sl[E_DECISION]], E_ERASE: a[sl[E_ERASE]],
                   E_CANCEL: a[sl[E_CANCEL]], E_SWAP_OUT: c[sl[E_SWAP_OUT]],
                   E_TRAJ_END: b[sl[E_TRAJ_END]], E_HINT_OUTCOME: c[sl[E_HINT_OUTCOME]]},
                  texts),
        p.strings({E_CALL_END: ok_or_err, E_DECISION: 0, E_TOOL_END: a[sl[E_TOOL_END]],
                   E_KV_STATE: KV_STATUS_AT + b[sl[E_KV_STATE]],
                   E_TRAJ_END: END_STATUS_AT + a[sl[E_TRAJ_END]],
                   E_HINT_OUTCOME: HINT_STATUS_AT + hint_a // 8},
                  _STATUS_VOCAB),
    ]


def _count_columns(p: _Part, ends: _CallEnds) -> list[pa.Array]:
    """planned_ns, prompt_tokens, appended_tokens, is_resume, output_tokens, cached_tokens,
    prompt_n, retained_tokens, recomputed_tokens, kv_tokens, bytes."""
    w, a, sl = p.w, p.a, p.sl
    g_start, g_end, pn = p.steps_of(E_CALL_START), ends.steps, ends.prompt_n
    swaps = {e: a[sl[e]] for e in (E_SWAP_OUT, E_SWAP_IN)}
    planned = {e: np.rint(a[sl[e]] * NS) for e in (E_TRAJ_START, E_CALL_START)}
    is_resume = np.zeros(p.n, dtype=bool)
    is_resume[sl[E_CALL_START]] = p.step[sl[E_CALL_START]] > 0
    resume_mask = np.ones(p.n, dtype=bool)
    resume_mask[sl[E_CALL_START]] = False
    return [
        p.column(planned, pa.int64()),
        p.column({E_CALL_START: w.ctx[g_start] - w.out[g_start]}, pa.int64()),
        p.column({E_CALL_START: w.inp[g_start]}, pa.int64()),
        pa.array(is_resume, mask=resume_mask),
        p.column(ends.ok_only(w.out[g_end].astype(np.float64)), pa.int64()),
        p.column(ends.ok_only(w.ctx[g_end] - w.out[g_end] - np.nan_to_num(pn)), pa.int64()),
        p.column(ends.ok_only(np.nan_to_num(pn)), pa.int64()),
        p.column({E_DECISION: w.ctx[p.steps_of(E_DECISION)], **swaps}, pa.int64()),
        p.column({E_RECOMPUTE: a[sl[E_RECOMPUTE]]}, pa.int64()),
        p.column({E_KV_STATE: a[sl[E_KV_STATE]]}, pa.int64()),
        p.column({e: np.rint(v * p.r.bpt) for e, v in swaps.items()}, pa.int64()),
    ]


def _time_columns(p: _Part, ends: _CallEnds) -> list[pa.Array]:
    """server_ms, decode_ms, planned_latency_s, predicted_wait_s, slot_wait_s, deadline_s."""
    w, a, b, sl = p.w, p.a, p.b, p.sl
    end = sl[E_CALL_END]
    g_tool = p.steps_of(E_TOOL_START)
    return [
        p.column({E_CALL_END: b[end] + ends.nan_on_err, E_SWAP_OUT: b[sl[E_SWAP_OUT]],
                  E_SWAP_IN: b[sl[E_SWAP_IN]]}, pa.float64()),
        p.column(ends.ok_only(p.c[end]), pa.float64()),
        p.column({E_TOOL_START: w.lat[g_tool]}, pa.float64()),
        p.column({E_DECISION: b[sl[E_DECISION]]}, pa.float64()),
        p.column({E_SLOT_WAIT: a[sl[E_SLOT_WAIT]]}, pa.float64()),
        # no deadline (a parent waits as long as its sub-agents run): null, as the replay's
        p.column({E_TOOL_START: np.where(np.isfinite(w.deadline[g_tool]), w.deadline[g_tool],
                                         np.nan)}, pa.float64()),
    ]


def _detail_column(p: _Part, texts: pa.Array, ends: _CallEnds) -> pa.Array:
    """detail: a decision's detail text, an error's message, a hint outcome's detail."""
    r, w, err, g_end = p.r, p.w, ends.overflow, ends.steps
    overflow = [f"context overflow: {q} + {o} tokens exceed {r.ctx_limit}"
                for q, o in zip(w.ctx[g_end[err]] - w.out[g_end[err]], w.out[g_end[err]],
                                strict=True)]
    vocab = pa.concat_arrays([texts, pa.array(overflow, type=pa.string())])
    err_detail = np.full(err.size, -1, dtype=np.int64)
    err_detail[err] = len(texts) + np.arange(int(err.sum()))
    err_detail[ends.timeout] = ends.message[ends.timeout].astype(np.int64)
    dec_a = p.a[p.sl[E_DECISION]].astype(np.int64)
    return p.strings({E_DECISION: dec_a // 8, E_CALL_END: err_detail,
                      E_HINT_OUTCOME: p.d[p.sl[E_HINT_OUTCOME]].astype(np.int64)}, vocab)


def _hint_times(p: _Part) -> dict[str, pa.Array]:
    """held_s and hint_delay_s: a hint_outcome's b, by its outcome (deferred: the delay)."""
    b = p.b[p.sl[E_HINT_OUTCOME]]
    deferred = p.a[p.sl[E_HINT_OUTCOME]].astype(np.int64) // 8 == _DEFERRED
    return {"held_s": p.column({E_HINT_OUTCOME: np.where(deferred, np.nan, b)}, pa.float64()),
            "hint_delay_s": p.column({E_HINT_OUTCOME: np.where(deferred, b, np.nan)},
                                     pa.float64())}


def _parent_column(p: _Part) -> pa.Array:
    """parent_id: a sub-agent's parent, on its trajectory_start."""
    codes = np.full(p.n, -1, dtype=np.int64)
    codes[p.sl[E_TRAJ_START]] = p.w.parent[p.ti[p.sl[E_TRAJ_START]]]
    return dictionary(codes.astype(np.int32), p.r.ids, codes < 0)


def _start_columns(p: _Part) -> dict[str, pa.Array]:
    """priority and spawn_step: a trajectory_start's priority and, a sub-agent's, its parent's
    step that spawned it."""
    start = p.sl[E_TRAJ_START]
    spawn = np.full(p.n, -1, dtype=np.int64)
    spawn[start] = p.step[start]
    return {"priority": p.strings({E_TRAJ_START: p.r.prio[p.ti[start]]}, p.r.priorities),
            "spawn_step": pa.array(spawn.astype(np.int32), mask=spawn < 0)}
