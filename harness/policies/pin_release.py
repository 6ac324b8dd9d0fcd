"""The release valve of pinned paused contexts, and what became of each pause's hint.

A pin (a paused context held out of the engine's eviction) that never yields stalls a full
pool: the engine can neither admit a waiting call nor grow a running one. Engines do not
deadlock so: Continuum unpins the pins of the program that arrived last when nothing fits, vLLM
preempts. The valve releases pins, in a declared order, until the engine can go on; a released
pin's blocks go to the engine's evictable cache (a resume that comes soon may still hit them).

The orders (`--pin-release`):
- `latest-program`: the pins of the program (trajectory) that arrived last go first
  (Continuum's);
- `lru`: the pin used longest ago (its call ended first) goes first;
- `largest`: the pin holding the most blocks goes first.
Ties go by the session's name, so every engine that follows an order releases the same pins.

What the server did with a pause's hint (the vocabulary of vLLM's KV-hints RFC, vllm#51428),
one per pause whose policy sent one (keep-evictable sends none):
- `accepted`: held (or offloaded, or dropped) as asked until the resume;
- `clipped`: released early, by the valve or an expiry, with when and why;
- `deferred`: applied late (an offload, drop or restore that waited behind a busy engine);
- `rejected`: refused (not supported by the runtime, host tier full, session limit);
- `missing`: never acknowledged by the server (a lost or timed-out control).

The vLLM connector (which imports nothing of the harness) carries its own copy of the orders;
a unit test checks that both agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

LATEST_PROGRAM, LRU, LARGEST = "latest-program", "lru", "largest"
PIN_RELEASE_ORDERS = (LATEST_PROGRAM, LRU, LARGEST)
DEFAULT_PIN_RELEASE = LATEST_PROGRAM

ACCEPTED, CLIPPED, DEFERRED, REJECTED, MISSING = (
    "accepted", "clipped", "deferred", "rejected", "missing")
HINT_OUTCOMES = (ACCEPTED, CLIPPED, DEFERRED, REJECTED, MISSING)
# A hint the server applied this long after it received it waited behind a busy engine
# (declared: one engine step of a loaded CPU server is of this order).
DEFERRED_AFTER_S = 0.1
# The most a pin or host copy may be held before the server's safety net releases it.
MAX_PIN_EXPIRY_S = 7 * 86_400.0


@dataclass(frozen=True)
class PinSettings:
    """How a server holds pinned paused contexts: the valve's order, the pins' safety-net expiry
    (None: the server's default) and the host memory offloaded copies may use (None: the
    server's default)."""

    release_order: str = DEFAULT_PIN_RELEASE
    expiry_s: float | None = None
    host_cap_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.release_order not in PIN_RELEASE_ORDERS:
            raise ValueError(f"pin release order must be one of {', '.join(PIN_RELEASE_ORDERS)}"
                             f", not {self.release_order!r}")
        if self.expiry_s is not None and not (
                math.isfinite(self.expiry_s) and 0 < self.expiry_s <= MAX_PIN_EXPIRY_S):
            raise ValueError(f"pin expiry must be in (0, {MAX_PIN_EXPIRY_S:g}] seconds, "
                             f"not {self.expiry_s!r}")
        if self.host_cap_bytes is not None and self.host_cap_bytes < 0:
            raise ValueError(f"host cap must be >= 0 bytes, not {self.host_cap_bytes!r}")


@dataclass(frozen=True)
class PinView:
    """What the valve weighs of one pin: its session, when its program arrived, when it was
    last used (pinned) and how many blocks it holds."""

    session: str
    arrived: float
    used: float
    blocks: int


def release_order(pins: Iterable[PinView], order: str) -> list[str]:
    """The sessions of `pins` in the order the valve releases them under `order`."""
    if order == LATEST_PROGRAM:
        ranked = sorted(pins, key=lambda p: (-p.arrived, p.session))
    elif order == LRU:
        ranked = sorted(pins, key=lambda p: (p.used, p.session))
    elif order == LARGEST:
        ranked = sorted(pins, key=lambda p: (-p.blocks, p.session))
    else:
        raise ValueError(f"unknown pin release order {order!r}")
    return [p.session for p in ranked]
