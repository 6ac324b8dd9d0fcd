"""What the vLLM connector reported of each pause's pin and host copy, as hint outcomes.

Every control answer of the connector carries, under `fates`, what became of the session's
pins and host copies since its last answer (each once), tagged with the pause they were held
for (the step the harness sent with the pause's control):

    {"tag": "3", "kind": "pin" | "copy" | "drop", "end": END, "reason": str | None,
     "held_s": float, "delay_s": float | None}

where END is how it ended: `resumed` (held until the session's next call), `restored` (a host
copy loaded back for it), `released` / `unpinned` / `replaced` (ended by the harness's own
control), `dropped` (a drop applied), `offloaded` (moved to a host copy, whose own fate
follows), or early: `valve` (the pin-release valve made room), `expired` (the server's safety
net) and `failed` (the host copy could not be made). An offload's or drop's answer says how
late the server applied it (`delay_s`, with its `tag`); a hold's lateness is not its hint's (the
context was pinned when the call before the pause ended).

A pause's outcome is final at the first fate that ends its hint: clipped when it ended early,
deferred when any part of it was applied DEFERRED_AFTER_S or more late, else accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.adapters.base import HintReport
from harness.policies.pin_release import ACCEPTED, CLIPPED, DEFERRED, DEFERRED_AFTER_S

EARLY = frozenset({"valve", "expired", "failed"})  # ends that clip the hint
ONGOING = frozenset({"offloaded"})  # ends after which the hint goes on (as a host copy)
LATE_OPS = frozenset({"offload", "drop"})  # the controls whose own lateness defers a hint


class Fates:
    """The connector's fates, read from its answers, turned into one report per pause."""

    def __init__(self) -> None:
        self._delays: dict[tuple[str, int], float] = {}  # the latest application per pause
        self._reports: list[HintReport] = []

    def read(self, answer: dict[str, Any], trajectory_of: Callable[[str], str | None]) -> None:
        """Take what a control's `answer` says; `trajectory_of` maps a connector session to
        its trajectory (None: not this adapter's)."""
        tid = trajectory_of(str(answer.get("session") or ""))
        step = _step(answer.get("tag"))
        # An offload's or drop's own lateness (a hold's is not the hint's: its context was
        # pinned when the call before the pause ended)
        if (tid is not None and step is not None and answer.get("op") in LATE_OPS
                and _number(answer.get("delay_s")) is not None):
            key = (tid, step)
            self._delays[key] = max(self._delays.get(key, 0.0), float(answer["delay_s"]))
        if answer.get("op") == "drop" and tid is not None and step is not None and answer.get(
                "ok"):
            self._end(tid, step, {"end": "dropped"})
        for fate in answer.get("fates") or []:
            if not isinstance(fate, dict):
                continue
            who = trajectory_of(str(fate.get("session") or answer.get("session") or ""))
            tag = _step(fate.get("tag"))
            if who is not None and tag is not None and fate.get("end") not in ONGOING:
                self._end(who, tag, fate)

    def _end(self, tid: str, step: int, fate: dict[str, Any]) -> None:
        delay = max(self._delays.pop((tid, step), 0.0), _number(fate.get("delay_s")) or 0.0)
        end = str(fate.get("end"))
        if end in EARLY:
            self._reports.append(HintReport(
                tid, step, CLIPPED, reason=_reason(end, fate.get("reason")),
                held_s=_number(fate.get("held_s")), detail=_text(fate.get("reason"))))
        elif delay >= DEFERRED_AFTER_S:
            self._reports.append(HintReport(tid, step, DEFERRED, reason=f"applied {delay:.3f} s "
                                            "after it was asked", delay_s=delay))
        else:
            self._reports.append(HintReport(tid, step, ACCEPTED, reason=end))

    def take(self) -> list[HintReport]:
        """The reports made since the last call (each once)."""
        out, self._reports = self._reports, []
        return out


def _reason(end: str, reason: object) -> str:
    text = _text(reason)
    return {"valve": "valve", "expired": "expiry", "failed": "copy failed"}[end] + (
        f": {text}" if text and end == "valve" else "")


def _text(value: object) -> str | None:
    return str(value)[:300] if value is not None else None


def _step(tag: object) -> int | None:
    try:
        return int(str(tag)) if tag is not None else None
    except ValueError:
        return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
