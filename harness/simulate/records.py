"""A fast columnar path for simulated records: compact rows in, RECORDS_SCHEMA Parquet parts out.

The event loop appends each event as 8 numbers to one flat list:
`(t_s, event, trajectory, step, slot, a, b, c)`; what a/b/c mean depends on the event (see
`PAYLOAD`). Every string the loop needs (decision reasons, erase and cancel reasons) is
interned once into `texts` and passed as its index. Everything static (tool class and name,
token counts, latencies) is looked up from the workload by (trajectory, step) when a part is
written, vectorised over the part, so a row costs the loop one `list.extend` of a tuple.
Parts are numbered and written to a temporary name then renamed, like `PartWriter`'s.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.records.schema import RECORDS_SCHEMA
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
WIDTH = 8
MAX_PENDING = 2
NS = 1_000_000_000
# What a, b, c of a compact row hold, per event (codes index the tuples above, texts `texts`).
PAYLOAD = {
    "trajectory_start": "a=planned arrival s",
    "call_start": "a=planned s (when the call was due)",
    "call_end": "a=prompt_n (NaN: context overflow error), b=prefill ms, c=decode ms",
    "pause_decision": "a=action code + 8 x detail text, b=predicted wait s, c=reason text",
    "swap_out": "a=retained tokens, b=transfer ms, c=reason text",
    "swap_in": "a=retained tokens, b=transfer ms",
    "erase": "a=reason text", "cancel": "a=reason text", "recompute": "a=tokens",
    "kv_state": "a=kv tokens, b=status code", "slot_wait": "a=seconds waited",
    "tool_end": "a=status code (OUTCOMES)", "trajectory_end": "a=status code, b=reason text",
}
_STRING_COLUMNS = [f.name for f in RECORDS_SCHEMA if pa.types.is_string(f.type)]


class RecordSink:
    """Collects compact rows and writes them as numbered Parquet parts (one thread writes)."""

    def __init__(self, directory: Path, run_id: str, workload: Workload,
                 kv_bytes_per_token: float, ctx_limit: int, flush_rows: int = 400_000) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.w = workload
        self.bpt = kv_bytes_per_token
        self.ctx_limit = ctx_limit
        self.rows: list[float] = []
        self.flush_at = flush_rows * WIDTH
        self.texts: list[str | None] = [None]
        self._text_idx: dict[str | None, int] = {None: 0}
        self.seq = 0
        self._part = 0
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._pending: list[Future[None]] = []
        self._first = np.asarray(workload.first, dtype=np.int64)
        self._ids = pa.array(workload.ids, type=pa.string())
        uniq = sorted(set(workload.priority))
        self._priorities = pa.array(uniq, type=pa.string())
        self._prio = np.searchsorted(np.asarray(uniq, dtype=object), np.asarray(
            workload.priority, dtype=object)).astype(np.int64)
        self.n_rows = 0

    def text(self, s: str | None) -> int:
        """The index of an interned string (0 is null)."""
        i = self._text_idx.get(s)
        if i is None:
            i = self._text_idx[s] = len(self.texts)
            self.texts.append(s)
        return i

    def flush(self) -> None:
        """Hand the buffered rows to the writer thread (they become the next part)."""
        if not self.rows:
            return
        rows = self.rows.copy()
        self.rows.clear()  # the same list object: the event loop holds its bound `extend`
        n = len(rows) // WIDTH
        seq0, self.seq = self.seq, self.seq + n
        self.n_rows += n
        part, self._part = self._part, self._part + 1
        texts = pa.array(list(self.texts), type=pa.string())
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= MAX_PENDING:  # bound the memory of parts not yet written
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write, rows, seq0, part, texts))

    def close(self) -> None:
        """Flush, wait for every part, and re-raise any write error."""
        self.flush()
        for f in self._pending:
            f.result()
        self._pool.shutdown(wait=True)

    def _write(self, rows: list[float], seq0: int, part: int, texts: pa.Array) -> None:
        arr = np.fromiter(rows, dtype=np.float64, count=len(rows)).reshape(-1, WIDTH)
        table = pa.Table.from_arrays(self._decode(arr, seq0, texts), schema=RECORDS_SCHEMA)
        final = self.directory / f"part-{part:05d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd", use_dictionary=_STRING_COLUMNS)
        os.replace(tmp, final)

    def _decode(self, arr: np.ndarray, seq0: int, texts: pa.Array) -> list[pa.Array]:
        """Compact rows -> one Arrow array per RECORDS_SCHEMA column (in schema order)."""
        n = arr.shape[0]
        t, evf, tif, stepf, slotf, a, b, c = np.ascontiguousarray(arr.T)
        ev, ti = evf.astype(np.int64), tif.astype(np.int64)
        step, slot = stepf.astype(np.int64), slotf.astype(np.int64)
        order = np.argsort(ev, kind="stable")
        bounds = np.searchsorted(ev[order], np.arange(len(EVENTS) + 1))
        rows = [order[bounds[k]: bounds[k + 1]] for k in range(len(EVENTS))]
        w = self.w

        def at(*events: int) -> np.ndarray:
            return np.concatenate([rows[e] for e in events])

        def gi(idx: np.ndarray) -> np.ndarray:  # global step index of rows
            return self._first[ti[idx]] + step[idx]

        def col(parts: list[tuple[np.ndarray, Any]], typ: pa.DataType) -> pa.Array:
            is_float = pa.types.is_floating(typ)
            vals = np.zeros(n, dtype=np.float64 if is_float else np.int64)
            valid = np.zeros(n, dtype=bool)
            for idx, v in parts:
                vals[idx] = v
                valid[idx] = True
            if is_float:
                valid &= ~np.isnan(vals)
            return pa.array(vals, type=typ, mask=~valid)

        def strs(parts: list[tuple[np.ndarray, Any]], vocab: pa.Array) -> pa.Array:
            codes = np.full(n, -1, dtype=np.int64)
            for idx, v in parts:
                codes[idx] = v
            return pc.take(vocab, pa.array(np.maximum(codes, 0), mask=codes < 0))

        call_start, call_end, decision = rows[E_CALL_START], rows[E_CALL_END], rows[E_DECISION]
        ok_end = call_end[~np.isnan(a[call_end])]
        err_end = call_end[np.isnan(a[call_end])]
        swaps = at(E_SWAP_OUT, E_SWAP_IN)
        g_start, g_ok = gi(call_start), gi(ok_end)
        prompt_start = w.ctx[g_start] - w.out[g_start]
        prompt_ok = w.ctx[g_ok] - w.out[g_ok]
        tools = at(E_TOOL_START, E_DECISION, E_TOOL_END)
        tool_start = rows[E_TOOL_START]
        g_tool = gi(tool_start)
        dec_a = a[decision].astype(np.int64)
        kv, tend, tool_end = rows[E_KV_STATE], rows[E_TRAJ_END], rows[E_TOOL_END]
        status_vocab = pa.array([*OUTCOMES, *KV_STATUSES, *END_STATUSES])
        # detail: decision text (ttl), priority (trajectory_start) or the overflow message.
        traj_start = rows[E_TRAJ_START]
        g_err = gi(err_end)
        overflow = [f"context overflow: {p} + {o} tokens exceed {self.ctx_limit}"
                    for p, o in zip(w.ctx[g_err] - w.out[g_err], w.out[g_err], strict=True)]
        vocab = pa.concat_arrays([texts, self._priorities,
                                  pa.array(overflow, type=pa.string())])
        n_text, n_prio = len(texts), len(self._priorities)
        detail = strs([(decision, dec_a // 8), (traj_start, n_text + self._prio[ti[traj_start]]),
                       (err_end, n_text + n_prio + np.arange(err_end.size))], vocab)
        constant = pa.array(np.zeros(n, dtype=np.int64))
        return [
            pc.take(pa.array([self.run_id]), constant),
            pa.array(np.arange(seq0, seq0 + n, dtype=np.int64)),
            pa.array(np.rint(t * NS).astype(np.int64)),
            pc.take(pa.array(EVENTS), pa.array(ev)),
            pc.take(self._ids, pa.array(ti)),
            pc.take(pa.array(["agent"]), constant),
            col([(np.flatnonzero(step >= 0), step[step >= 0])], pa.int32()),
            col([(np.flatnonzero(slot >= 0), slot[slot >= 0])], pa.int32()),
            strs([(tools, w.cls[gi(tools)])], pa.array(w.classes, type=pa.string())),
            strs([(tool_start, w.name[g_tool])], pa.array(w.names, type=pa.string())),
            strs([(decision, dec_a % 8)], pa.array(ACTIONS)),
            strs([(decision, c[decision]), (at(E_ERASE, E_CANCEL), a[at(E_ERASE, E_CANCEL)]),
                  (rows[E_SWAP_OUT], c[rows[E_SWAP_OUT]]), (tend, b[tend])], texts),
            strs([(ok_end, 0), (decision, 0), (err_end, 1), (tool_end, a[tool_end]),
                  (kv, 4 + b[kv]), (tend, 7 + a[tend])], status_vocab),
            col([(traj_start, np.rint(a[traj_start] * NS)),
                 (call_start, np.rint(a[call_start] * NS))], pa.int64()),
            col([(call_start, prompt_start)], pa.int64()),
            col([(call_start, w.inp[g_start])], pa.int64()),
            pa.array(step > 0, mask=ev != E_CALL_START),
            col([(ok_end, w.out[g_ok])], pa.int64()),
            col([(ok_end, prompt_ok - a[ok_end])], pa.int64()),
            col([(ok_end, a[ok_end])], pa.int64()),
            col([(decision, w.ctx[gi(decision)]), (swaps, a[swaps])], pa.int64()),
            col([(rows[E_RECOMPUTE], a[rows[E_RECOMPUTE]])], pa.int64()),
            col([(kv, a[kv])], pa.int64()),
            col([(swaps, np.rint(a[swaps] * self.bpt))], pa.int64()),
            col([(ok_end, b[ok_end]), (swaps, b[swaps])], pa.float64()),
            col([(ok_end, c[ok_end])], pa.float64()),
            col([(decision, b[decision]), (tool_start, w.lat[g_tool]),
                 (rows[E_SLOT_WAIT], a[rows[E_SLOT_WAIT]])], pa.float64()),
            col([(tool_start, w.deadline[g_tool])], pa.float64()),
            detail,
        ]
