"""Per-step record columns: how the event loop stores its frequent events without building rows.

Nine events in ten belong to an LLM call or a pause, at most once per step: the call's start
(with its `kv_state` and, when the context is re-prefilled, its `recompute`), first token and
end; the pause's decision (with `tool_start` and, unless the KV is dropped, a `kv_state`) and the
tool's return. For these the loop stores a few numbers per step into preallocated arrays (a store
costs less than building a row) together with the record `seq` the event got; everything else
the loop emits as a compact row with its `seq`. `blocks` turns both into the compact rows of a
range of `seq`, grouped by event (vectorised, no Python loop per record), which
harness.simulate.decode turns into RECORDS_SCHEMA columns.
"""

from __future__ import annotations

from array import array
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from harness.simulate.decode import (
    E_CALL_END,
    E_CALL_START,
    E_DECISION,
    E_FIRST_TOKEN,
    E_KV_STATE,
    E_RECOMPUTE,
    E_TOOL_END,
    E_TOOL_START,
    EVENTS,
)
from harness.simulate.workload import Workload

# (name, typecode, initial value) of each per-step column
_COLUMNS = (
    ("st_t", "d", 0.0), ("st_seq", "q", -1), ("slot", "q", -1), ("due", "d", 0.0), ("rc", "q", 0),
    ("pre_t", "d", -1.0), ("ft_t", "d", 0.0), ("ft_seq", "q", -1), ("en_t", "d", 0.0),
    ("en_seq", "q", -1), ("pa_t", "d", 0.0), ("pa_seq", "q", -1), ("pa_code", "q", 0),
    ("pa_wait", "d", 0.0), ("pa_reason", "q", 0), ("te_t", "d", 0.0), ("te_seq", "q", -1),
    ("te_slot", "q", -1),
)
_DTYPE = {"d": np.float64, "q": np.int64}
ROW = 8  # a block row: seq, t, trajectory, step, slot, a, b, c
DROP_CODE = 2  # a decision whose action drops the KV: no kv_state row after tool_start


class StepColumns:
    """Preallocated per-step arrays (see the module docstring); indexed by global step.

    LLM step: start time and seq, slot, when it was due, recomputed tokens, prefill start, first
    token time and seq, end time and seq. Tool step: decision time and seq, action code, predicted
    wait, reason text; tool return time, seq and slot.

    `shared`: the columns live in one shared-memory block (typed memoryviews, as fast to index as
    arrays) that a writer process attaches to by `shm_name`; `close` releases it, and the
    creator removes it.
    """

    # array('d') / array('q'), or memoryviews cast to 'd' / 'q' over shared memory
    st_t: Any
    st_seq: Any
    slot: Any
    due: Any
    rc: Any
    pre_t: Any
    ft_t: Any
    ft_seq: Any
    en_t: Any
    en_seq: Any
    pa_t: Any
    pa_seq: Any
    pa_code: Any
    pa_wait: Any
    pa_reason: Any
    te_t: Any
    te_seq: Any
    te_slot: Any

    def __init__(self, n_steps: int, shared: bool = False, attach: str | None = None) -> None:
        self.n = n_steps
        self._shm: SharedMemory | None = None
        self._owner = attach is None
        if not shared and attach is None:
            for name, code, init in _COLUMNS:
                setattr(self, name, array(code, [init]) * n_steps)
            return
        width = 8 * n_steps
        if attach is None:
            self._shm = SharedMemory(create=True, size=max(len(_COLUMNS) * width, 1))
        else:
            # A writer process started by multiprocessing shares its parent's resource tracker,
            # so attaching registers nothing new; the creator alone unlinks the block.
            self._shm = SharedMemory(name=attach)
        buf: Any = self._shm.buf  # typeshed's cast() overloads want literal formats
        for k, (name, code, init) in enumerate(_COLUMNS):
            col = buf[k * width:(k + 1) * width].cast(code)
            if attach is None:
                np.frombuffer(col, dtype=_DTYPE[code])[:] = init
            setattr(self, name, col)

    @property
    def shm_name(self) -> str | None:
        """The shared-memory block's name (None: plain arrays)."""
        return self._shm.name if self._shm is not None else None

    def view(self, name: str) -> np.ndarray:
        """A numpy view of one column (no copy; the loop may go on writing other steps)."""
        col = getattr(self, name)
        code = col.typecode if isinstance(col, array) else col.format
        return np.frombuffer(col, dtype=_DTYPE[code])

    def close(self) -> None:
        """Release the shared memory (and remove it, in the process that created it)."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        try:
            if self._owner:
                shm.unlink()
        finally:
            for name, _, _ in _COLUMNS:
                getattr(self, name).release()
                delattr(self, name)
            shm.close()


def step_trajectory(w: Workload) -> np.ndarray:
    """The trajectory of every global step."""
    return np.repeat(np.arange(w.n_trajectories, dtype=np.int64), np.asarray(w.n_steps))


Block = tuple[np.ndarray, ...]  # seq, t, trajectory, step, slot, a, b, c of one event's rows


def blocks(cols: StepColumns, w: Workload, traj: np.ndarray, lo: int, hi: int,
           generic: np.ndarray) -> list[Block]:
    """The events with seq lo..hi-1, one block per event code (EVENTS order), rows by seq.

    `generic` holds the loop's other rows, (seq, t, event, trajectory, step, slot, a, b, c)
    each; `traj` is step_trajectory(w)."""
    parts: list[list[Block]] = [[] for _ in EVENTS]
    if len(generic):
        order = np.argsort(generic[:, 2], kind="stable")
        gen = generic[order]
        evs = gen[:, 2].astype(np.int64)
        cuts = np.searchsorted(evs, np.arange(len(EVENTS) + 1))
        for e in range(len(EVENTS)):
            if cuts[e + 1] > cuts[e]:
                x = gen[cuts[e]:cuts[e + 1]]
                parts[e].append((x[:, 0].astype(np.int64), x[:, 1], *(
                    x[:, k].astype(np.int64) for k in (3, 4, 5)), x[:, 6], x[:, 7], x[:, 8]))
    first = np.asarray(w.first, dtype=np.int64)
    v = cols.view
    slot = v("slot")

    def rows(seq_name: str) -> tuple[np.ndarray, np.ndarray]:
        seq = v(seq_name)
        g = np.flatnonzero((seq >= lo) & (seq < hi))
        return g, seq[g]

    def put(seq: np.ndarray, t: np.ndarray, ev: int, g: np.ndarray, own_step: bool,
            s: np.ndarray | int, a: np.ndarray | float, b: np.ndarray | float = 0.0,
            c: np.ndarray | float = 0.0) -> None:
        m = len(g)
        if not m:
            return
        ti = traj[g]
        full = np.full
        parts[ev].append((seq, t, ti, g - first[ti] if own_step else full(m, -1),
                          np.asarray(s) if own_step else full(m, -1),
                          *(x if isinstance(x, np.ndarray) else full(m, x) for x in (a, b, c))))

    g, seq = rows("st_seq")
    rc = v("rc")[g]
    t = v("st_t")[g]
    has = rc > 0
    put(seq[has], t[has], E_RECOMPUTE, g[has], True, slot[g][has], rc[has].astype(np.float64))
    put(seq + has, t, E_KV_STATE, g, False, -1, (w.ctx[g] - w.out[g]).astype(np.float64))
    put(seq + has + 1, t, E_CALL_START, g, True, slot[g], v("due")[g])
    g, seq = rows("ft_seq")
    put(seq, v("ft_t")[g], E_FIRST_TOKEN, g, True, slot[g], 0.0)
    g, seq = rows("en_seq")
    ft, en = v("ft_t")[g], v("en_t")[g]
    put(seq, en, E_CALL_END, g, True, slot[g], (w.inp[g] + v("rc")[g]).astype(np.float64),
        (ft - v("pre_t")[g]) * 1000, (en - ft) * 1000)
    g, seq = rows("pa_seq")
    t, code, s = v("pa_t")[g], v("pa_code")[g], slot[g - 1]
    put(seq, t, E_DECISION, g, True, s, code.astype(np.float64), v("pa_wait")[g],
        v("pa_reason")[g].astype(np.float64))
    put(seq + 1, t, E_TOOL_START, g, True, s, 0.0)
    kept = code % 8 != DROP_CODE
    put(seq[kept] + 2, t[kept], E_KV_STATE, g[kept], False, -1,
        w.ctx[g][kept].astype(np.float64), 1.0)
    g, seq = rows("te_seq")
    put(seq, v("te_t")[g], E_TOOL_END, g, True, v("te_slot")[g],
        w.outcome[g].astype(np.float64))
    out: list[Block] = []
    total = 0
    for ps in parts:
        if len(ps) == 1:
            out.append(ps[0])
        else:  # none, or several sources of one event: merge by seq
            cat = tuple(np.concatenate([p[k] for p in ps]) if ps else np.zeros(0)
                        for k in range(ROW))
            order = np.argsort(cat[0], kind="stable")
            out.append(tuple(x[order] for x in cat))
        total += len(out[-1][0])
    if total != hi - lo:
        raise RuntimeError(f"records {lo}..{hi - 1}: {total} events found (simulator bug)")
    return out
