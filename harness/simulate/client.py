"""The agents' client in the simulation: when a call it sends reaches the engine, and when it
gives up on one.

A call reaches the engine the calibration's request overhead after the client sent it (this
step's draw where the overhead has a distribution: harness.simulate.server). The client's
first-token timeout (a replay's `--first-token-timeout`) fails a call without its first token
that long after it was sent, and with it its trajectory, as a replay's client does; the engine
aborts the call wherever it is and releases what the trajectory held. So a stall, every call
waiting for memory that paused contexts pin, ends as it does on a server. A server that holds
its calls' memory (a token pool: vLLM, SGLang) has them wait inside it, so their timeout runs
from the send; on slots the replay takes a slot (and restores into it) before it sends the
call, so there it runs from the call's start.

Where the server's pause controls are requests (vLLM through the harness's connector: a hold,
unpin, drop or offload at every pause, a release at every trajectory's end), the client sends
one at each pause and at each trajectory's end, a request overhead before it reaches the engine
(drawn like a call's, from a stream of its own), where it runs as a one-token request in the
iterations (harness.simulate.scheduler). The pause's tool runs meanwhile, as the replay's does,
and the call after it waits for the control's answer where the tool returned first (a tool
shorter than its pause's request: the replay's client awaits the action before it goes on). The
release is awaited too: a trajectory's successor (the agent's next trajectory, or its parent's
resume) starts when the release is answered. A TTL's later action sends none in the model.

Where the server's front end is modelled (ServerModel.front_end_s and front_end_cpu_s: vLLM's
API server, SGLang's tokenizer manager), every request, call or control, takes its turn in it on
its way, one at a time in the order sent, and reaches the engine its turn's end plus the rest of
its overhead. Where the front end shares the engine's processors (a server on CPUs), its work
takes the engine's compute: its arrival's share within its turn, its answer's when the engine
answers it (Scheduler.steal), so a burst of requests holds the engine back as it does there.

After idle time a request's way there and back is slower (ServerModel.way_wake_curve: the
wake's part outside the engine, measured by calibrate): the first request sent after the server
idled takes that much longer to reach it, and one sent meanwhile reaches it no earlier; a
request sent while the server works, or right after another reached it, takes no longer.
Unlike the wake's server part (the first iteration's) it holds back no other call.

Timeouts fall due in the order the calls were sent (one timeout for all): one TIMEOUT event at
a time stands for them all, over a FIFO of the waiting calls, not one event per call.

Compiled with mypyc together with harness.simulate.engine (see harness.simulate.native); it
runs unchanged as plain Python.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from harness.model.iteration import curve_at
from harness.simulate.decode import E_CALL_END, TIMEOUT_ERROR
from harness.simulate.server import ServerModel
from harness.simulate.trajectory import DONE, Trajectory

if TYPE_CHECKING:
    from harness.simulate.engine import Engine

SENT: Final = 6  # external events (harness.simulate.engine_state): a call reaches the engine
TIMEOUT: Final = 7  # ... the first-token timeouts' watch fires
CONTROL: Final = 8  # ... a control request reaches the engine (its key: PAUSE_CONTROL, RELEASE)
PAUSE_CONTROL: Final = 0
RELEASE: Final = 1
INF: Final = float("inf")
NAN: Final = float("nan")


class Client:
    """The client's side of the engine's calls (see the module docstring). `timeout_text`: the
    sink's text of the timeout's message, as a replay's client words it."""

    def __init__(self, engine: Engine, server: ServerModel, steps: int, seed: int,
                 timeout_s: float, timeout_text: int, slot_mode: bool,
                 controls: bool = False) -> None:
        self.engine = engine
        self.overhead = server.request_overhead_s
        # per step, where the overhead has a distribution (ServerModel.overhead_draws)
        self.overheads = server.overhead_draws(steps, seed)
        self.controls = controls  # the server's pause controls are requests
        # drawn in turn, where drawn: a stream of their own
        self.ctl_overheads = server.overhead_draws(steps, seed, 1) if controls else []
        # the front end: a request's turn, its arrival's and its answer's compute taken
        self.fe_turn, self.fe_in, self.fe_out = server.front_end()
        self.fe_free = -INF  # when the front end is free next
        # the way's wake after idle time (ServerModel.way_wake_curve; empty: none), and when a
        # request was last sent (one sent just after it finds the way awake)
        self.way_curve = server.way_wake_curve
        self.last_sent = -INF
        self.warm_at = -INF  # when the way is awake again after the last request's wake
        self.sent = 0  # control requests sent
        self.timeout_s = timeout_s
        self.timeout_text = timeout_text
        # where the timeout runs from (Engine.request_call, Engine.start_call read them)
        self.from_send = timeout_s < INF and not slot_mode
        self.from_start = timeout_s < INF and slot_mode
        self.waiting: deque[tuple[float, Trajectory, int]] = deque()  # (due, _, step), as sent
        self.armed = False  # a TIMEOUT event is pending for the first of them

    def reach(self, d: float, t: float) -> float:
        """When a request sent at `t`, with `d` its overhead, reaches the engine: after its turn
        in the front end (behind the requests before it) and the rest of its overhead."""
        if self.way_curve:
            d += self.way_wake(t)
        turn = self.fe_turn
        if turn <= 0.0:
            return t + d
        start = self.occupy(turn, t)
        if self.fe_in > 0.0:
            self.engine.sched.steal(start, start + self.fe_in)
        return start + turn + (d - turn if d > turn else 0.0)

    def way_wake(self, t: float) -> float:
        """What the way of a request sent at `t` adds after idle time: none while the server
        works; else after the time since it went idle or the last request was sent; and a
        request sent while the way still wakes for an earlier one waits for that too."""
        sched = self.engine.sched
        last = self.last_sent
        self.last_sent = t
        w = 0.0
        if sched.idle():
            since = sched.idle_since if sched.idle_since > last else last
            if t > since:
                w = curve_at(self.way_curve, t - since)
        if self.warm_at - t > w:
            return self.warm_at - t
        self.warm_at = t + w
        return w

    def replied(self, n: int, t: float) -> None:
        """The engine answered `n` requests at `t` (calls' last tokens, controls): the front
        end's work on their answers takes the engine's compute, in turn after what it has."""
        c = self.fe_out * n
        if c > 0.0:
            start = self.occupy(c, t)
            self.engine.sched.steal(start, start + c)

    def occupy(self, busy: float, t: float) -> float:
        """The front end works `busy` s for what arrived at `t`, after what it has: when it
        starts."""
        start = t if t > self.fe_free else self.fe_free
        self.fe_free = start + busy
        return start

    def watch(self, tr: Trajectory, t: float) -> None:
        """`tr`'s call waits for its first token from `t` on (Engine.first_token ends it)."""
        tr.awaiting = True
        due = t + self.timeout_s
        self.waiting.append((due, tr, tr.pos))
        if not self.armed:
            self.armed = True
            self.engine.push(due, TIMEOUT, tr, 0)

    def fire(self, t: float) -> None:
        """The watch fired at `t`: the calls due that still wait for their first token time
        out, and the watch is set for the next one (a call sent meanwhile, by a timed-out
        trajectory's successor, joins the FIFO)."""
        q = self.waiting
        while q:
            due, tr, step = q[0]
            if not tr.awaiting or tr.pos != step or tr.state == DONE:
                q.popleft()  # it has had its first token, or its trajectory ended
            elif due <= t:
                q.popleft()
                self.time_out(tr, t)
            else:
                self.engine.push(due, TIMEOUT, tr, 0)
                return
        self.armed = False

    def time_out(self, tr: Trajectory, t: float) -> None:
        """`tr`'s call had no first token in time: the engine aborts it wherever it is (waiting
        for memory, restoring, in its prefill) and the trajectory fails."""
        e = self.engine
        e.t_real = t
        tr.awaiting = False
        e.withdraw(tr, t)
        text = self.timeout_text
        e.emit(t, E_CALL_END, tr.ti, tr.pos - tr.first, tr.slot, NAN, TIMEOUT_ERROR, text)
        e.finish(tr, t, 2, text)

    def event(self, kind: int, tr: Trajectory, key: int, t: float) -> None:
        """The engine's call: the client's external event (SENT, TIMEOUT, CONTROL) at `t`."""
        if kind == TIMEOUT:
            self.fire(t)
        elif kind == CONTROL:
            self.engine.sched.control(key, tr, t)
        elif key == tr.gen:  # SENT, by the trajectory still running
            self.engine.send(tr, t)

    def control(self, kind: int, tr: Trajectory, t: float) -> bool:
        """Send a control request about `tr` at `t` (PAUSE_CONTROL or RELEASE) where the
        server's controls are requests; False where they are not (nothing sent)."""
        if not self.controls:
            return False
        ov = self.ctl_overheads
        d = ov[self.sent % len(ov)] if ov else self.overhead
        self.sent += 1
        self.engine.push(self.reach(d, t), CONTROL, tr, kind)
        return True

    def answered(self, kind: int, tr: Trajectory, t: float) -> None:
        """The scheduler's call: the engine answered a control request at `t`; a release's
        answer lets the trajectory's successor start, a pause's the call its tool's end left
        waiting for it."""
        if kind == RELEASE:
            self.engine.successor(tr, t)
            return
        waiting = tr.ctl == 2 and tr.state != DONE
        tr.ctl = 0
        if waiting:
            self.engine.tool_done(tr, t)
