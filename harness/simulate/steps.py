"""Per-step record fields: how the event loop stores its frequent events without building rows.

Nine events in ten belong to an LLM call or a pause, at most once per step: the call's start
(with its `kv_state` and, when the context is re-prefilled, its `recompute`), first token and
end; the pause's decision (with `tool_start` and, unless the KV is dropped, a `kv_state`) and the
tool's return. For these the loop stores a few numbers into the step's row of one preallocated
float64 buffer (a store costs less than building a row, and one row per step keeps a step's
stores on the same cache lines: separate columns cost the 100k-trajectory benchmark ~1.5 s more)
together with the record `seq` the event got; everything else the loop emits as a compact row
with its `seq`. `blocks` turns both into the compact rows of a range of `seq`, grouped by event
(vectorised, no Python loop per record), looking only at the steps the loop touched meanwhile;
harness.simulate.decode turns them into RECORDS_SCHEMA columns.
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
    E_HINT_OUTCOME,
    E_KV_STATE,
    E_RECOMPUTE,
    E_SLOT_WAIT,
    E_TOOL_END,
    E_TOOL_START,
    EVENTS,
    KV_STATUSES,
)
from harness.simulate.trajectory import STEP_WIDTH
from harness.simulate.workload import Workload

# The fields of an LLM step's row and of a tool step's, in column order (trajectory.F_*).
LLM_FIELDS = ("st_t", "st_seq", "slot", "due", "rc", "pre_t", "ft_t", "ft_seq", "en_t", "en_seq",
              "sw_t", "sw_seq", "sw_wait", "sw_slot", "srv")
TOOL_FIELDS = ("pa_t", "pa_seq", "pa_code", "pa_wait", "pa_reason", "te_t", "te_seq", "te_slot",
               "ho_t", "ho_seq", "ho_code", "ho_held", "ho_detail")
FIELD = {**{f: k for k, f in enumerate(LLM_FIELDS)}, **{f: k for k, f in enumerate(TOOL_FIELDS)}}
SEQ_FIELDS = ("st_seq", "ft_seq", "en_seq", "sw_seq", "pa_seq", "te_seq", "ho_seq")
# -1 in every column that holds a seq in either kind of row (no seq range holds it), else 0;
# `rc` must start at 0 (no recompute) and `srv` at 0 (no server named: one server); the rest
# is written before it is read.
_INIT_ROW = [-1.0 if any(FIELD[f] == k for f in SEQ_FIELDS) else 0.0 for k in range(STEP_WIDTH)]
ROW = 9  # a block row: seq, t, trajectory, step, slot, a, b, c, d
DROP_CODE = 2  # a decision whose action drops the KV: no kv_state row after tool_start
EVICTABLE_CODE = 4  # keep-evictable: its kv_state row says so
if (len(LLM_FIELDS) != STEP_WIDTH or len(TOOL_FIELDS) > STEP_WIDTH
        or any(FIELD[f] != FIELD[f.replace("_seq", "_t")] + 1 for f in SEQ_FIELDS)):
    raise RuntimeError("steps' fields and trajectory's F_* disagree (Engine.stamp)")


class StepColumns:
    """The per-step fields (see the module docstring): one row of STEP_WIDTH float64 per global
    step (integers stored exactly as floats), in one buffer `buf` the loop indexes as
    `step * STEP_WIDTH + trajectory.F_...`.

    LLM step: start time and seq, slot, when it was due, recomputed tokens, prefill start, first
    token time and seq, end time and seq, and when it waited for memory: admission time and seq,
    seconds waited, slot; the server that served it (a fleet, harness.simulate.fleet: its
    name's text). Tool step: decision time and seq, action code, predicted wait, reason
    text; tool return time, seq and slot; what became of the pause's hint: time and seq,
    outcome and reason text, seconds held (clipped), detail text.

    `shared`: the buffer is a block of shared memory (a memoryview, as fast to index as an
    array) that a writer process attaches to by `shm_name`; `close` releases it, and the creator
    removes it.
    """

    buf: Any  # array('d'), or a memoryview cast to 'd' over shared memory

    def __init__(self, n_steps: int, shared: bool = False, attach: str | None = None) -> None:
        self.n = n_steps
        self._shm: SharedMemory | None = None
        self._owner = attach is None
        if not shared and attach is None:
            self.buf = array("d", _INIT_ROW) * n_steps
            return
        size = 8 * STEP_WIDTH * n_steps
        if attach is None:
            self._shm = SharedMemory(create=True, size=max(size, 8))
        else:
            # A writer process started by multiprocessing shares its parent's resource tracker,
            # so attaching registers nothing new; the creator alone unlinks the block.
            self._shm = SharedMemory(name=attach)
        mem: Any = self._shm.buf  # typeshed's cast() overloads want literal formats
        self.buf = mem[:size].cast("d")
        if attach is None and n_steps:
            self.rows()[:] = _INIT_ROW

    @property
    def shm_name(self) -> str | None:
        """The shared-memory block's name (None: a plain array)."""
        return self._shm.name if self._shm is not None else None

    def rows(self) -> np.ndarray:
        """The buffer as an (n, STEP_WIDTH) array (no copy)."""
        if not self.n:
            return np.zeros((0, STEP_WIDTH))
        return np.frombuffer(self.buf, dtype=np.float64).reshape(self.n, STEP_WIDTH)

    def view(self, name: str) -> np.ndarray:
        """One field's column over every step, as a float64 view (no copy; the loop may go on
        writing other steps); integer fields hold integers exactly. An LLM field's column holds
        a tool field at tool steps, and the other way round."""
        return self.rows()[:, FIELD[name]]

    def close(self) -> None:
        """Release the shared memory (and remove it, in the process that created it)."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        try:
            if self._owner:
                shm.unlink()
        finally:
            self.buf.release()
            del self.buf
            shm.close()


def step_trajectory(w: Workload) -> np.ndarray:
    """The trajectory of every global step."""
    return np.repeat(np.arange(w.n_trajectories, dtype=np.int64), np.asarray(w.n_steps))


# seq, t, trajectory, step, slot, a, b, c, d of one event's rows; `d`: a text for the reason
# column where the event has none in a/b/c (a call_end's server in a fleet; 0: none)
Block = tuple[np.ndarray, ...]
# an event's a, b, c, d, as far as it has them (harness.simulate.records.PAYLOAD says which
# is what): arrays over its rows, or a scalar for every row
Payload = tuple[np.ndarray | float, ...]


def blocks(cols: StepColumns, w: Workload, traj: np.ndarray, lo: int, hi: int,
           generic: np.ndarray, steps: tuple[int, int] | None = None) -> list[Block]:
    """The events with seq lo..hi-1, one block per event code (EVENTS order), rows by seq.

    `generic` holds the loop's other rows, (seq, t, event, trajectory, step, slot, a, b, c)
    each; `traj` is step_trajectory(w); `steps` the range of steps that can hold these events
    (None: all), so that a part costs the steps active while it was simulated, not the trace."""
    part = _PartBlocks(cols, w, traj, lo, hi, steps)
    part.add_generic(generic)
    part.add_call_events()
    part.add_pause_events()
    return part.merged()


class _PartBlocks:
    """The blocks of one part (the events with seq lo..hi-1) as they are gathered, per event,
    from the loop's generic rows and from the step fields of the steps `steps` (None: all)."""

    def __init__(self, cols: StepColumns, w: Workload, traj: np.ndarray, lo: int, hi: int,
                 steps: tuple[int, int] | None) -> None:
        self.w, self.traj, self.lo, self.hi = w, traj, lo, hi
        self.g0, self.g1 = steps if steps is not None else (0, cols.n)
        self.parts: list[list[Block]] = [[] for _ in EVENTS]
        self.first = np.asarray(w.first, dtype=np.int64)
        self.v = cols.view

    def add_generic(self, generic: np.ndarray) -> None:
        """The loop's compact rows, split by event code."""
        if not len(generic):
            return
        order = np.argsort(generic[:, 2], kind="stable")
        gen = generic[order]
        evs = gen[:, 2].astype(np.int64)
        cuts = np.searchsorted(evs, np.arange(len(EVENTS) + 1))
        for e in range(len(EVENTS)):
            if cuts[e + 1] > cuts[e]:
                x = gen[cuts[e]:cuts[e + 1]]
                self.parts[e].append((x[:, 0].astype(np.int64), x[:, 1], *(
                    x[:, k].astype(np.int64) for k in (3, 4, 5)), x[:, 6], x[:, 7], x[:, 8],
                    np.zeros(len(x))))

    def stamped(self, seq_name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, seq) of the steps whose `seq_name` field holds a seq of this part."""
        v = self.v
        seq = v(seq_name)[self.g0:self.g1]
        g = np.flatnonzero((seq >= self.lo) & (seq < self.hi)) + self.g0
        g = g[(self.w.cls[g] >= 0) == (seq_name in TOOL_FIELDS)]  # the steps of the field's kind
        return g, v(seq_name)[g].astype(np.int64)

    def put(self, ev: int, seq: np.ndarray, t: np.ndarray, g: np.ndarray,
            s: np.ndarray | int | None, payload: Payload) -> None:
        """A block of event `ev` at steps `g` on slots `s` (None: a trajectory-level event, no
        step, no slot); `payload`: its a, b, c, d (those left out 0), a scalar repeated over
        the rows."""
        m = len(g)
        if not m:
            return
        ti = self.traj[g]
        full = np.full
        pad = (*payload, *(0.0,) * (ROW - 5 - len(payload)))
        self.parts[ev].append((seq, t, ti, full(m, -1) if s is None else g - self.first[ti],
                               full(m, -1) if s is None else np.asarray(s),
                               *(x if isinstance(x, np.ndarray) else full(m, x) for x in pad)))

    def add_call_events(self) -> None:
        """An LLM step's events: recompute, kv_state and call_start; first token; call end;
        slot_wait."""
        v, w, put = self.v, self.w, self.put
        slot = v("slot")
        g, seq = self.stamped("st_seq")
        rc = v("rc")[g]
        t = v("st_t")[g]
        has = rc > 0
        s = slot[g].astype(np.int64)
        put(E_RECOMPUTE, seq[has], t[has], g[has], s[has], (rc[has],))
        put(E_KV_STATE, seq + has, t, g, None, ((w.ctx[g] - w.out[g]).astype(np.float64),))
        put(E_CALL_START, seq + has + 1, t, g, s, (v("due")[g],))
        g, seq = self.stamped("ft_seq")
        put(E_FIRST_TOKEN, seq, v("ft_t")[g], g, slot[g].astype(np.int64), ())
        g, seq = self.stamped("en_seq")
        ft, en = v("ft_t")[g], v("en_t")[g]
        put(E_CALL_END, seq, en, g, slot[g].astype(np.int64), (
            w.inp[g] + v("rc")[g], (ft - v("pre_t")[g]) * 1000, (en - ft) * 1000, v("srv")[g]))
        g, seq = self.stamped("sw_seq")
        put(E_SLOT_WAIT, seq, v("sw_t")[g], g, v("sw_slot")[g].astype(np.int64),
            (v("sw_wait")[g],))

    def add_pause_events(self) -> None:
        """A tool step's events: pause_decision, tool_start and (unless the KV is dropped)
        kv_state; tool_end; hint_outcome."""
        v, w, put = self.v, self.w, self.put
        g, seq = self.stamped("pa_seq")
        # the slot the call before the pause ran on (the pause holds it, or held it)
        t, code, s = v("pa_t")[g], v("pa_code")[g], v("slot")[g - 1].astype(np.int64)
        put(E_DECISION, seq, t, g, s, (code, v("pa_wait")[g], v("pa_reason")[g]))
        put(E_TOOL_START, seq + 1, t, g, s, ())
        kept = code % 8 != DROP_CODE
        # paused (held), or evictable (left to the engine's prefix cache)
        status = np.where(code % 8 == EVICTABLE_CODE, KV_STATUSES.index("evictable"),
                          KV_STATUSES.index("paused")).astype(np.float64)
        put(E_KV_STATE, seq[kept] + 2, t[kept], g[kept], None,
            (w.ctx[g][kept].astype(np.float64), status[kept]))
        g, seq = self.stamped("te_seq")
        put(E_TOOL_END, seq, v("te_t")[g], g, v("te_slot")[g].astype(np.int64),
            (w.outcome[g].astype(np.float64),))
        # a: the pause's action code + 8 x the outcome, b: held s, c: reason, d: detail text
        g, seq = self.stamped("ho_seq")
        code = v("ho_code")[g]
        put(E_HINT_OUTCOME, seq, v("ho_t")[g], g, np.full(len(g), -1, dtype=np.int64),
            (v("pa_code")[g] % 8 + 8 * (code % 8), v("ho_held")[g], code // 8,
             v("ho_detail")[g]))

    def merged(self) -> list[Block]:
        """One block per event, rows by seq; checks that the part holds every seq lo..hi-1."""
        out: list[Block] = []
        total = 0
        for ps in self.parts:
            if len(ps) == 1:
                out.append(ps[0])
            else:  # none, or several sources of one event: merge by seq
                cat = tuple(np.concatenate([p[k] for p in ps]) if ps else np.zeros(0)
                            for k in range(ROW))
                order = np.argsort(cat[0], kind="stable")
                out.append(tuple(x[order] for x in cat))
            total += len(out[-1][0])
        if total != self.hi - self.lo:
            raise RuntimeError(f"records {self.lo}..{self.hi - 1}: {total} events found "
                               "(simulator bug)")
        return out
