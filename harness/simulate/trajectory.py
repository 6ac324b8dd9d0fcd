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
        self.need_rc = 0  # tokens to recompute at its next call
        self.ret = 0  # tokens its paused KV holds
        self.due = 0.0  # when its next call was due
        self.ready = 0.0  # when its call asked for admission
        self.rem = 0  # prompt tokens left of the running call
        self.ppos = 0  # where they start
        self.xfer_ms = 0.0  # the running swap's transfer time
        self.swap_reason = 0
        self.after_swap = False  # TTL expiry swaps (else drops)
