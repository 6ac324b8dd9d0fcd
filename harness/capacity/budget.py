"""A search's time budget: how long it may take in all, shared out as it goes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.errors import InputError

_SPAN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def parse_span(flag: str, text: str, low_s: float, high_s: float) -> float:
    """'10m', '45s', '1.5h', '90' (seconds) as seconds; InputError naming `flag` otherwise or
    outside [low_s, high_s]."""
    m = _SPAN.match(text)
    if m is None:
        raise InputError(f"{flag} {text!r}: expected a time such as 45s, 10m or 1h")
    s = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not low_s <= s <= high_s:
        raise InputError(f"{flag} {text}: must be between {low_s:g} s and {high_s:g} s")
    return s


@dataclass
class Budget:
    """`total_s` of wall time from when it is made; `clock` injected (tests)."""

    total_s: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def left_s(self) -> float:
        return self.total_s - self.elapsed_s()

    def share_s(self, parts_left: int) -> float:
        """An equal share of what is left among `parts_left` parts (the policies to search)."""
        return max(self.left_s(), 0.0) / max(parts_left, 1)
