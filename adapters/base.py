"""The adapter Protocol: everything the executor needs from a runtime, and nothing more.

Runtimes differ in who decides what happens to a paused request's KV cache. llama.cpp hands the
client per-slot control, so the harness executes every pause action itself; vLLM and SGLang
decide inside the server, where a policy is a server configuration. `Capabilities` says which
actions an adapter can execute per pause; the executor never pretends an unsupported action ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class Unsupported(Exception):
    """The runtime cannot execute this operation; the caller records it as unsupported."""


@dataclass(frozen=True)
class Capabilities:
    harness_slots: bool  # the client picks the KV slot of each request (llama.cpp id_slot)
    pause_actions: frozenset[str]  # actions executable per pause: keep, swap, recompute
    local_dump_files: bool = False  # swap files sit on this machine's disk (we can delete them)


@dataclass(frozen=True)
class ServerInfo:
    runtime: str
    server_version: str
    model: str
    vocab_size: int
    slots: int | None
    ctx_per_slot: int | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionRequest:
    prompt: list[int]
    max_tokens: int
    slot: int | None = None
    abort_after_first_token: bool = False
    cache_salt: str | None = None  # runtimes with a salt: a fresh salt forbids prefix reuse


@dataclass
class CompletionResult:
    status: str  # ok | error | aborted
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens the server reused
    prompt_n: int | None = None  # prompt tokens the server processed
    prompt_ms: float | None = None
    decode_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class SlotIO:
    bytes: int
    ms: float
    tokens: int


class Adapter(Protocol):
    """One runtime. Methods raise Unsupported where the runtime lacks the operation."""

    runtime: str
    capabilities: Capabilities

    async def server_info(self) -> ServerInfo: ...

    async def complete(
        self, req: CompletionRequest, on_first_token: Callable[[], None]
    ) -> CompletionResult: ...

    async def save_slot(self, slot: int, name: str) -> SlotIO: ...

    async def restore_slot(self, slot: int, name: str) -> SlotIO: ...

    async def erase_slot(self, slot: int) -> None: ...

    async def delete_dump(self, name: str) -> bool: ...

    async def scrape(self) -> list[tuple[str, str, str, float]]: ...

    async def slots_idle(self) -> bool | None: ...
