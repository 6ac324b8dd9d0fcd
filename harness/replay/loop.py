"""The event loop a replay runs on: uvloop where it is installed (its lower per-callback cost is
less client lag at load), else asyncio's default; HARNESS_EVENT_LOOP=asyncio forces the latter.
run.json records which loop ran (`event_loop`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop], str] | None:
    if os.environ.get("HARNESS_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    from importlib.metadata import version

    return uvloop.new_event_loop, f"uvloop {version('uvloop')}"


def loop_name() -> str:
    """What `run` will run on: 'uvloop <version>' or 'asyncio'."""
    found = _uvloop_factory()
    return found[1] if found else "asyncio"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the loop `loop_name` names."""
    found = _uvloop_factory()
    with asyncio.Runner(loop_factory=found[0] if found else None) as runner:
        return runner.run(coro)
