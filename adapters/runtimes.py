"""The runtimes `harness run` knows: name -> module whose `run(ctx: RunContext)` replays.

Each entry point lives beside its adapter, so nothing runtime-specific sits in the core.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from harness.errors import InputError
from harness.replay.options import RunContext

RUNTIMES: dict[str, str] = {
    "llamacpp": "harness.adapters.launchers.llamacpp_run",
    "vllm": "harness.adapters.launchers.vllm_run",
    "sglang": "harness.adapters.launchers.sglang_run",
}


def runtime_entry(name: str) -> Callable[[RunContext], None]:
    """The `run` function of a runtime; InputError for an unknown name."""
    if name not in RUNTIMES:
        raise InputError(f"unknown runtime {name!r}; one of {', '.join(RUNTIMES)}")
    entry: Callable[[RunContext], None] = importlib.import_module(RUNTIMES[name]).run
    return entry
