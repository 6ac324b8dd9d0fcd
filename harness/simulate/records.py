"""A fast columnar path for simulated records: compact rows in, RECORDS_SCHEMA Parquet parts out.

An event is a compact row of 8 numbers, `(t_s, event, trajectory, step, slot, a, b, c)`; what
a/b/c mean depends on the event (see `PAYLOAD`). The loop stores the frequent events of a call or
a pause into per-step columns (harness.simulate.steps) and appends the others to one flat list,
`(seq, t_s, event, ...)`; every event gets its record `seq` from the loop's counter. Every string
the loop needs (decision reasons, erase and cancel reasons) is interned once into `texts` and
passed as its index. Everything static (tool class and name, token counts, latencies) is looked
up from the workload by (trajectory, step) when a part is written, vectorised over the part
(harness.simulate.decode). A part holds a range of seq, its rows grouped by event; parts are
written by one thread while the loop goes on, numbered, to a temporary name then renamed, like
`PartWriter`'s. The per-step columns take 18 x 8 bytes per step of the trace.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.records.schema import RECORDS_SCHEMA
from harness.simulate import decode as _d
from harness.simulate.decode import (  # noqa: F401 - the event codes the loop emits
    E_CALL_END,
    E_CALL_START,
    E_CANCEL,
    E_DECISION,
    E_ERASE,
    E_FIRST_TOKEN,
    E_KV_STATE,
    E_RECOMPUTE,
    E_SLOT_WAIT,
    E_SWAP_IN,
    E_SWAP_OUT,
    E_TOOL_END,
    E_TOOL_START,
    E_TRAJ_END,
    E_TRAJ_START,
    EVENTS,
    RunStatics,
    decode,
)
from harness.simulate.steps import StepColumns, blocks, step_trajectory
from harness.simulate.workload import Workload

ACTIONS, END_STATUSES, KV_STATUSES = _d.ACTIONS, _d.END_STATUSES, _d.KV_STATUSES
WIDTH = 9  # a row of the loop's flat list: seq, then the compact row
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
    """Collects the loop's events and writes them as numbered Parquet parts (one thread writes).

    The loop numbers its events itself (seq 0, 1, ...) and calls `flush(n)` when it has emitted
    n events in all (every event with a lower seq is complete); `flush_rows` says how often.
    """

    def __init__(self, directory: Path, run_id: str, workload: Workload,
                 kv_bytes_per_token: float, ctx_limit: int, flush_rows: int = 1_000_000) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.w = workload
        self.bpt = kv_bytes_per_token
        self.ctx_limit = ctx_limit
        self.rows: list[float] = []
        self.cols = StepColumns(len(workload.inp))
        self._traj = step_trajectory(workload)
        self.flush_rows = flush_rows
        self.total = 0  # events the loop emitted (set by the loop when it stops)
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
        self._statics = RunStatics(run_id, workload, self._first, self._ids, self._priorities,
                                   self._prio, kv_bytes_per_token, ctx_limit)

    def text(self, s: str | None) -> int:
        """The index of an interned string (0 is null)."""
        i = self._text_idx.get(s)
        if i is None:
            i = self._text_idx[s] = len(self.texts)
            self.texts.append(s)
        return i

    def flush(self, upto: int) -> None:
        """Hand the events with seq below `upto` to the writer thread (the next part)."""
        if upto <= self.seq:
            return
        rows = self.rows.copy()
        self.rows.clear()  # the same list object: the event loop holds its bound `extend`
        lo, self.seq = self.seq, upto
        self.n_rows += upto - lo
        part, self._part = self._part, self._part + 1
        texts = pa.array(list(self.texts), type=pa.string())
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= MAX_PENDING:  # bound the memory of parts not yet written
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write, rows, lo, upto, part, texts))

    def close(self) -> None:
        """Flush up to `total`, wait for every part, and re-raise any write error."""
        try:
            self.flush(self.total)
            for f in self._pending:
                f.result()
        finally:
            self._pool.shutdown(wait=True)

    def _write(self, rows: list[float], lo: int, hi: int, part: int, texts: pa.Array) -> None:
        generic = np.array(rows, dtype=np.float64).reshape(-1, WIDTH)
        parts = blocks(self.cols, self.w, self._traj, lo, hi, generic)
        cols = decode(parts, texts, self._statics)
        table = pa.Table.from_arrays(cols, schema=pa.schema(
            [pa.field(f.name, c.type, f.nullable) for f, c in zip(RECORDS_SCHEMA, cols,
                                                                 strict=True)]))
        final = self.directory / f"part-{part:05d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        # Without the stored Arrow schema the dictionary columns read back as plain strings.
        pq.write_table(table, tmp, compression="zstd", use_dictionary=_STRING_COLUMNS,
                       write_statistics=False, store_schema=False)
        os.replace(tmp, final)
