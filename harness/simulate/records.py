"""A fast columnar path for simulated records: compact rows in, RECORDS_SCHEMA Parquet parts out.

An event is a compact row of 8 numbers, `(t_s, event, trajectory, step, slot, a, b, c)`; what
a/b/c mean depends on the event (see `PAYLOAD`). The loop stores the frequent events of a call or
a pause into per-step columns (harness.simulate.steps) and appends the others to one flat list,
`(seq, t_s, event, ...)`; every event gets its record `seq` from the loop's counter. Every string
the loop needs (decision reasons, erase and cancel reasons) is interned once into `texts` and
passed as its index. Everything static (tool class and name, token counts, latencies) is looked
up from the workload by (trajectory, step) when a part is written, vectorised over the part
(harness.simulate.decode). A part holds a range of seq, its rows grouped by event; parts are
written while the loop goes on, by a thread or a process of their own (harness.simulate.writer),
numbered, to a temporary name then renamed, like `PartWriter`'s. The per-step columns take
15 x 8 bytes per step of the trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.simulate import decode as _d
from harness.simulate.decode import (
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
)
from harness.simulate.steps import StepColumns
from harness.simulate.workload import Workload
from harness.simulate.writer import PartEncoder, ProcessWriter, ThreadWriter, run_statics

# the sink, and the event codes (from decode) the loop emits, re-exported for it
__all__ = ["ACTIONS", "END_STATUSES", "EVENTS", "E_CALL_END", "E_CALL_START", "E_CANCEL",
           "E_DECISION", "E_ERASE", "E_FIRST_TOKEN", "E_KV_STATE", "E_RECOMPUTE", "E_SLOT_WAIT",
           "E_SWAP_IN", "E_SWAP_OUT", "E_TOOL_END", "E_TOOL_START", "E_TRAJ_END", "E_TRAJ_START",
           "KV_STATUSES", "NS", "PAYLOAD", "PROCESS_MIN_STEPS", "WIDTH", "WRITERS", "RecordSink"]
ACTIONS, END_STATUSES, KV_STATUSES = _d.ACTIONS, _d.END_STATUSES, _d.KV_STATUSES
WIDTH = 9  # a row of the loop's flat list: seq, then the compact row
WRITERS = ("auto", "thread", "process")
PROCESS_MIN_STEPS = 200_000  # trace steps from which "auto" writes in a process
NS = 1_000_000_000
# What a, b, c of a compact row hold, per event (codes index the tuples above, texts `texts`).
PAYLOAD = {
    "trajectory_start": "a=planned arrival s",
    "call_start": "a=planned s (when the call was due)",
    "call_end": "a=prompt_n (NaN: an error), b=prefill ms (an error: 0 context overflow, "
                "1 first-token timeout), c=decode ms (a timeout: its message's text)",
    "pause_decision": "a=action code + 8 x detail text, b=predicted wait s, c=reason text",
    "swap_out": "a=retained tokens, b=transfer ms, c=reason text",
    "swap_in": "a=retained tokens, b=transfer ms",
    "erase": "a=reason text", "cancel": "a=reason text", "recompute": "a=tokens",
    "kv_state": "a=kv tokens, b=status code", "slot_wait": "a=seconds waited",
    "tool_end": "a=status code (OUTCOMES)", "trajectory_end": "a=status code, b=reason text",
    "hint_outcome": "a=action code + 8 x outcome (HINT_OUTCOMES), b=held s (NaN: none), "
                    "c=reason text, d=detail text",
}


class RecordSink:
    """Collects the loop's events and writes them as numbered Parquet parts, in order.

    The loop numbers its events itself (seq 0, 1, ...) and calls `flush(n)` when it has emitted
    n events in all (every event with a lower seq is complete); `flush_rows` says how often.
    `writer`: "thread", "process" (harness.simulate.writer) or "auto": a process from
    PROCESS_MIN_STEPS steps on, where it pays for its start.
    """

    def __init__(self, directory: Path, run_id: str, workload: Workload,
                 kv_bytes_per_token: float, ctx_limit: int, flush_rows: int = 500_000,
                 writer: str = "auto") -> None:
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {WRITERS}, got {writer!r}")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.w = workload
        n_steps = len(workload.inp)
        in_process = writer == "process" or (writer == "auto" and n_steps >= PROCESS_MIN_STEPS)
        self.writer = "process" if in_process else "thread"
        self.rows: list[float] = []
        self.cols = StepColumns(n_steps, shared=in_process)
        self.flush_rows = flush_rows
        self.total = 0  # events the loop emitted (set by the loop when it stops)
        self.last_steps: tuple[int, int] | None = None  # ... and the steps they touched since
        self.texts: list[str | None] = [None]
        self._text_idx: dict[str | None, int] = {None: 0}
        self.seq = 0
        self._part = 0
        self.n_rows = 0
        statics = run_statics(run_id, workload, kv_bytes_per_token, ctx_limit)
        try:
            self._backend: ThreadWriter | ProcessWriter = (
                ProcessWriter(directory, statics, self.cols) if in_process
                else ThreadWriter(PartEncoder(directory, statics, self.cols)))
        except BaseException:
            self.cols.close()
            raise

    def text(self, s: str | None) -> int:
        """The index of an interned string (0 is null)."""
        i = self._text_idx.get(s)
        if i is None:
            i = self._text_idx[s] = len(self.texts)
            self.texts.append(s)
        return i

    def flush(self, upto: int, steps: tuple[int, int] | None = None) -> None:
        """Hand the events with seq below `upto` to the writer (the next part). `steps`: the
        range of steps whose fields the loop wrote since the last flush (None: all)."""
        if upto <= self.seq:
            return
        rows = np.array(self.rows, dtype=np.float64).reshape(-1, WIDTH)
        self.rows.clear()  # the same list object: the event loop holds its bound `extend`
        lo, self.seq = self.seq, upto
        self.n_rows += upto - lo
        part, self._part = self._part, self._part + 1
        self._backend.submit(rows, lo, upto, steps or (0, self.cols.n), part, list(self.texts))

    def close(self) -> None:
        """Flush up to `total`, wait for every part, and re-raise any write error; the shared
        step columns are released whatever happens."""
        try:
            try:
                self.flush(self.total, self.last_steps)
            finally:
                self._backend.close()
        finally:
            self.cols.close()
