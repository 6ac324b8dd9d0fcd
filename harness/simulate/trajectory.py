"""One trajectory's state in the event loop: a typed object, so that the compiled loop reads
and writes its fields directly (harness.simulate.native)."""

from __future__ import annotations

from typing import Final

# a trajectory's state
RUNNING: Final = 0
KEPT: Final = 1
SWAPPING: Final = 2
WAIT_SWAPOUT: Final = 3
SWAPPED: Final = 4
DROPPED: Final = 5
RESTORING: Final = 6
DONE: Final = 7
DROPPING: Final = 8  # an erase waits for the iteration's end
WAIT_DROP: Final = 9  # ... and the tool has returned
PREEMPTED: Final = 10  # its running call was preempted (vLLM): it waits to be readmitted


class Trajectory:
    """Trajectory `ti` of the workload: its steps are `first` .. `end` - 1 (global indexes)."""

    def __init__(self, ti: int, first: int, end: int) -> None:
        self.ti = ti
        self.first = first
        self.end = end
        self.pos = first  # the step it is at (an LLM call, or the tool it waits for)
        self.state = DONE
        self.gen = 0  # events scheduled for an older generation are void
        self.held = 0  # token pool: the tokens it holds
        self.slot = -1  # slot mode: the slot it holds
        self.host = 0  # a prefix-cache engine: the tokens of its copy in the host tier
        self.need_rc = 0  # tokens to recompute at its next call
        self.ret = 0  # tokens its paused KV holds
        self.due = 0.0  # when its next call was due
        self.ready = 0.0  # when its call asked for admission
        self.rem = 0  # prompt tokens left of the running call
        self.ppos = 0  # where they start
        self.xfer_ms = 0.0  # the running swap's transfer time
        self.swap_reason = 0
        self.after = 0  # what a TTL's expiry does: A_SWAP, A_EVICTABLE, else it drops
        self.prefilling = False  # the running call's prompt has had a chunk
        self.kids_left = 0  # paused at a step that started sub-agents: those still running
        self.rank = 0  # its task's arrival order (program order)
        self.awaiting = False  # its call was sent and has no first token yet (the timeout runs)
        # its pause's control request (Client): 0 none or answered, 1 unanswered, 2 unanswered
        # and the tool has returned (its next call waits for the answer)
        self.ctl = 0
        # memory allocated as calls grow (harness.simulate.growth)
        self.dstart = 0  # the iteration its call started decoding at
        self.dlast = 0  # ... and its last
        self.tok0 = 0  # its tokens then
        self.xseq = -1  # its first block crossing's entry in the scheduler's heap (-1: none)
        self.phase = -1  # its later crossings' phase (-1: not counted)
        self.admitted = 0  # its call's place in the order of admission
        self.pinned = 0  # tokens of its held KV that a pause pinned (they survive a preemption)
        self.oleft = 0  # a preempted call: the tokens it still has to produce
        # a prefix-cache engine: its prefix group (-1: none, or a fresh cache salt since), the
        # whole blocks of its first call that the group shares, and the group whose prefix it
        # holds now (-1: none; then `held` counts it, held once for the group's holders)
        self.grp = -1
        self.pre = 0
        self.sg = -1
        # the pin-release valve (EngineState.relieve): when it arrived, and when its paused
        # context was pinned (-1: it is no pin); the tool step of its pause whose hint's outcome
        # is still open (-1: none)
        self.arrived = 0.0
        self.pin_at = -1.0
        self.hint = -1
        # an offload or drop its pause asked for: when it was asked, and how late the engine
        # applied the latest (its hint is deferred when DEFERRED_AFTER_S or more)
        self.asked = 0.0
        self.late = 0.0


# A step's row of the per-step record fields (harness.simulate.steps.StepColumns): the loop
# stores into `row + F_...` of one float64 buffer, `row` = step x STEP_WIDTH. One row per step
# keeps the fields a call or a pause writes on the same cache lines; an LLM step and a tool step
# use the same columns for different fields. Every seq field follows its time field.
STEP_WIDTH: Final = 15
# LLM step
F_ST_T: Final = 0  # call_start: time
F_ST_SEQ: Final = 1  # ... and seq (its recompute and kv_state rows are seq + 0..2)
F_SLOT: Final = 2  # the slot the call ran on
F_DUE: Final = 3  # when the call was due
F_RC: Final = 4  # tokens recomputed before it
F_PRE_T: Final = 5  # its prompt's first chunk started
F_FT_T: Final = 6  # first token: time
F_FT_SEQ: Final = 7
F_EN_T: Final = 8  # call_end: time
F_EN_SEQ: Final = 9
F_SW_T: Final = 10  # slot_wait (admitted after waiting for memory): time
F_SW_SEQ: Final = 11
F_SW_WAIT: Final = 12  # seconds waited
F_SW_SLOT: Final = 13  # the slot it got
F_SRV: Final = 14  # the server that served it, as its name's text (fleet; 0: not recorded)
# tool step
F_PA_T: Final = 0  # pause_decision (and tool_start, kv_state): time
F_PA_SEQ: Final = 1
F_PA_CODE: Final = 2  # action code + 8 x detail text
F_PA_WAIT: Final = 3  # predicted wait
F_PA_REASON: Final = 4  # reason text
F_TE_T: Final = 5  # tool_end: time
F_TE_SEQ: Final = 6
F_TE_SLOT: Final = 7  # the slot held when the tool returned
F_HO_T: Final = 8  # hint_outcome (a pause that sent a hint): time
F_HO_SEQ: Final = 9
F_HO_CODE: Final = 10  # its outcome (HINT_OUTCOMES index) + 8 x reason text
F_HO_HELD: Final = 11  # clipped: seconds held before the release (NaN: none)
F_HO_DETAIL: Final = 12  # detail text
