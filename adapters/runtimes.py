"""The runtimes the harness knows: name -> the launcher module whose `RUNTIME` drives it.

Adding a runtime is one adapter module (requests and chunk parsing on the shared HTTP core) and
one launcher module with a `RUNTIME` (see harness.adapters.base.Runtime); nothing in the core
changes.
"""

from __future__ import annotations

import importlib

from harness.adapters.base import Runtime
from harness.errors import InputError

RUNTIMES: dict[str, str] = {
    "llamacpp": "harness.adapters.launchers.llamacpp_server",
    "vllm": "harness.adapters.launchers.vllm_server",
    "sglang": "harness.adapters.launchers.sglang_server",
    "openai": "harness.adapters.launchers.openai_server",
    "dynamo": "harness.adapters.launchers.dynamo_server",
}


def get_runtime(name: str) -> Runtime:
    """The runtime called `name`; InputError for an unknown name."""
    if name not in RUNTIMES:
        raise InputError(f"unknown runtime {name!r}; one of {', '.join(RUNTIMES)}")
    runtime: Runtime = importlib.import_module(RUNTIMES[name]).RUNTIME
    return runtime
