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

from harness.simulate.workload import OUTCOMES, Workload

EVENTS = ("trajectory_start", "call_start", "first_token", "call_end", "tool_start",
          "pause_decision", "swap_out", "swap_in", "erase", "recompute", "kv_state",
          "slot_wait", "cancel", "tool_end", "trajectory_end")
(E_TRAJ_START, E_CALL_START, E_FIRST_TOKEN, E_CALL_END, E_TOOL_START, E_DECISION, E_SWAP_OUT,
 E_SWAP_IN, E_ERASE, E_RECOMPUTE, E_KV_STATE, E_SLOT_WAIT, E_CANCEL, E_TOOL_END,
 E_TRAJ_END) = range(len(EVENTS))
ACTIONS = ("keep", "swap", "recompute", "ttl")
KV_STATUSES = ("active", "paused", "released")
END_STATUSES = ("completed", "cancelled", "failed")
NS = 1_000_000_000
_EVENT_NAMES = pa.array(EVENTS)
_STATUS_VOCAB = pa.array([*OUTCOMES, *KV_STATUSES, *END_STATUSES])
_ACTION_VOCAB = pa.array(ACTIONS)
_AGENT = pa.array(["agent"])


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
    RECORDS_SCHEMA column."""
    sizes = np.array([len(bk[0]) for bk in blocks], dtype=np.int64)
    n = int(sizes.sum())
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    sl = [slice(int(bounds[e]), int(bounds[e + 1])) for e in range(len(EVENTS))]
    seq, t, ti, step, slot, a, b, c = (np.concatenate([bk[k] for bk in blocks])
                                       for k in range(8))
    seq, ti, step, slot = (x.astype(np.int64) for x in (seq, ti, step, slot))
    ev = np.repeat(np.arange(len(EVENTS), dtype=np.int64), sizes)
    w = r.w

    def g(e: int) -> np.ndarray:  # global step index of an event's rows
        return r.first[ti[sl[e]]] + step[sl[e]]

    def col(parts: dict[int, Any], typ: pa.DataType) -> pa.Array:
        """`parts`: event -> its values (NaN for a float column: null); other events null."""
        chunks = []
        for e in range(len(EVENTS)):
            m = sl[e].stop - sl[e].start
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

    def strs(parts: dict[int, Any], vocab: pa.Array) -> pa.Array:
        codes = np.full(n, -1, dtype=np.int32)
        for e, v in parts.items():
            codes[sl[e]] = v
        return dictionary(codes, vocab, codes < 0)

    end = sl[E_CALL_END]
    err = np.isnan(a[end])
    g_end, g_start, g_tool, g_dec = g(E_CALL_END), g(E_CALL_START), g(E_TOOL_START), g(E_DECISION)
    pn = a[end]  # NaN on an overflow error: the ok-only columns are null there
    dec_a = a[sl[E_DECISION]].astype(np.int64)
    tools = {e: w.cls[g(e)] for e in (E_TOOL_START, E_DECISION, E_TOOL_END)}
    overflow = [f"context overflow: {p} + {o} tokens exceed {r.ctx_limit}"
                for p, o in zip(w.ctx[g_end[err]] - w.out[g_end[err]], w.out[g_end[err]],
                                strict=True)]
    vocab = pa.concat_arrays([texts, r.priorities, pa.array(overflow, type=pa.string())])
    n_text, n_prio = len(texts), len(r.priorities)
    err_detail = np.full(err.size, -1, dtype=np.int64)
    err_detail[err] = n_text + n_prio + np.arange(int(err.sum()))
    ok_or_err = np.where(err, 1, 0)
    swaps = {e: a[sl[e]] for e in (E_SWAP_OUT, E_SWAP_IN)}
    planned = {e: np.rint(a[sl[e]] * NS) for e in (E_TRAJ_START, E_CALL_START)}
    end_num = {E_CALL_END: np.where(err, np.nan, 0.0)}  # NaN marks the error rows

    def ok_only(v: np.ndarray) -> dict[int, Any]:
        return {E_CALL_END: v + end_num[E_CALL_END]}

    zeros = np.zeros(n, dtype=np.int32)
    is_resume = np.zeros(n, dtype=bool)
    is_resume[sl[E_CALL_START]] = step[sl[E_CALL_START]] > 0
    resume_mask = np.ones(n, dtype=bool)
    resume_mask[sl[E_CALL_START]] = False
    return [
        dictionary(zeros, pa.array([r.run_id])),
        pa.array(seq.astype(np.int64)),
        pa.array(np.rint(t * NS).astype(np.int64)),
        dictionary(ev.astype(np.int32), _EVENT_NAMES),
        dictionary(ti.astype(np.int32), r.ids),
        dictionary(zeros, _AGENT),
        pa.array(step.astype(np.int32), mask=step < 0),
        pa.array(slot.astype(np.int32), mask=slot < 0),
        strs(tools, pa.array(w.classes, type=pa.string())),
        strs({E_TOOL_START: w.name[g_tool]}, pa.array(w.names, type=pa.string())),
        strs({E_DECISION: dec_a % 8}, _ACTION_VOCAB),
        strs({E_DECISION: c[sl[E_DECISION]], E_ERASE: a[sl[E_ERASE]],
              E_CANCEL: a[sl[E_CANCEL]], E_SWAP_OUT: c[sl[E_SWAP_OUT]],
              E_TRAJ_END: b[sl[E_TRAJ_END]]}, texts),
        strs({E_CALL_END: ok_or_err, E_DECISION: 0, E_TOOL_END: a[sl[E_TOOL_END]],
              E_KV_STATE: 4 + b[sl[E_KV_STATE]], E_TRAJ_END: 7 + a[sl[E_TRAJ_END]]},
             _STATUS_VOCAB),
        col(planned, pa.int64()),
        col({E_CALL_START: w.ctx[g_start] - w.out[g_start]}, pa.int64()),
        col({E_CALL_START: w.inp[g_start]}, pa.int64()),
        pa.array(is_resume, mask=resume_mask),
        col(ok_only(w.out[g_end].astype(np.float64)), pa.int64()),
        col(ok_only(w.ctx[g_end] - w.out[g_end] - np.nan_to_num(pn)), pa.int64()),
        col(ok_only(np.nan_to_num(pn)), pa.int64()),
        col({E_DECISION: w.ctx[g_dec], **swaps}, pa.int64()),
        col({E_RECOMPUTE: a[sl[E_RECOMPUTE]]}, pa.int64()),
        col({E_KV_STATE: a[sl[E_KV_STATE]]}, pa.int64()),
        col({e: np.rint(v * r.bpt) for e, v in swaps.items()}, pa.int64()),
        col({E_CALL_END: b[end] + end_num[E_CALL_END], E_SWAP_OUT: b[sl[E_SWAP_OUT]],
             E_SWAP_IN: b[sl[E_SWAP_IN]]}, pa.float64()),
        col(ok_only(c[end]), pa.float64()),
        col({E_DECISION: b[sl[E_DECISION]], E_TOOL_START: w.lat[g_tool],
             E_SLOT_WAIT: a[sl[E_SLOT_WAIT]]}, pa.float64()),
        col({E_TOOL_START: w.deadline[g_tool]}, pa.float64()),
        strs({E_DECISION: dec_a // 8, E_TRAJ_START: n_text + r.prio[ti[sl[E_TRAJ_START]]],
              E_CALL_END: err_detail}, vocab),
    ]
