"""What became of each pause's hint, one `hint_outcome` record per pause that sent one.

A pause whose policy keeps, swaps, drops or holds for a time-to-live sends the server a hint
(keep-evictable sends none: its figure is the engine's effective retention). Its outcome comes
from what the server did and said, never from the request alone:
- `rejected` at once when the runtime cannot do the action, or the server refuses it (its host
  memory cap);
- `missing` when the control carrying it failed (lost, timed out, answered with an error), or
  the run ended with no report of it;
- from the server's reports (Capabilities.hint_reports: the vLLM connector's account of each
  pin and host copy, SGLang's sessions), `accepted`, `clipped` or `deferred`, when they arrive;
- where the server reports nothing of its own (the harness owns the slots), `accepted` at the
  resume, once the server carried the action out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.adapters.base import Adapter, HintReport
from harness.policies.base import KEEP_EVICTABLE, Decision
from harness.policies.pin_release import ACCEPTED, MISSING, REJECTED
from harness.records.kinds import HintOutcome
from harness.replay.recorder import Recorder


@dataclass
class HintLedger:
    """The open hints of a replay, by (trajectory, step); each outcome goes to the records."""

    rec: Recorder
    adapter: Adapter
    open: dict[tuple[str, int], str] = field(default_factory=dict)  # -> the hint's label

    def sent(self, tid: str, step: int, decision: Decision, supported: bool,
             why: str | None = None) -> bool:
        """The pause at `step` decided; True when it sends the server a hint (recorded
        rejected at once when the runtime cannot carry it out)."""
        if decision.action == KEEP_EVICTABLE:
            return False
        self.open[(tid, step)] = decision.label
        if not supported:
            self.settle(HintReport(tid, step, REJECTED, reason="unsupported",
                                   detail=why or "the runtime cannot do the action"))
        return supported

    def rejected(self, tid: str, step: int, detail: str) -> None:
        """The server refused the hint (e.g. its host memory cap), unless what it reported
        with the refusal settles it first (a pin its valve released before the offload came:
        clipped, not refused)."""
        self.collect()
        self.settle(HintReport(tid, step, REJECTED, reason="refused", detail=detail[:300]))

    def lost(self, tid: str, step: int, exc: BaseException) -> None:
        """The control carrying the hint failed: the server never acknowledged it."""
        self.collect()
        self.settle(HintReport(tid, step, MISSING, reason="control failed",
                               detail=f"{type(exc).__name__}: {exc}"[:300]))

    def resumed(self, tid: str, step: int | None) -> None:
        """The pause's resume: where the server reports nothing of its own, a hint it carried
        out is accepted now."""
        if step is not None and not self.adapter.capabilities.hint_reports:
            self.settle(HintReport(tid, step, ACCEPTED))

    def ended(self, tid: str, step: int | None) -> None:
        """The trajectory ended during the pause (its tool cut off by a deadline): where the
        server reports nothing of its own, its hint was carried out until the harness released
        the context, and is accepted now."""
        if step is not None and not self.adapter.capabilities.hint_reports:
            self.settle(HintReport(tid, step, ACCEPTED, reason="held until the trajectory "
                                   "ended"))

    def collect(self) -> None:
        """Record the server's reports that arrived since the last collection."""
        for report in self.adapter.hint_reports():
            self.settle(report)

    def finish(self) -> None:
        """The run's end: the server's last reports, then every hint still open missing."""
        self.collect()
        for tid, step in list(self.open):
            self.settle(HintReport(tid, step, MISSING, reason="unreported",
                                   detail="the server never reported what became of it"))

    def settle(self, report: HintReport) -> None:
        """Record a hint's outcome, once (a report of a hint already settled, or never sent,
        is dropped)."""
        label = self.open.pop((report.session, report.step), None)
        if label is None:
            return
        self.rec.emit(HintOutcome(
            trajectory_id=report.session, traffic="agent", step=report.step, action=label,
            status=report.outcome, reason=report.reason, held_s=report.held_s,
            hint_delay_s=report.delay_s, detail=report.detail))
