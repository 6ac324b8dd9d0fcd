"""The adapter Protocol: everything the executor needs from a runtime, and nothing more.

The seam speaks pauses, not slots: at each tool pause the core asks the adapter to hold a
trajectory's context (pinned, out of the engine's eviction), hand it to the engine's own evictable
cache, offload it to host memory, drop it, restore it, or release everything it holds. Each
runtime maps these onto its own mechanism (llama.cpp onto the slots the harness owns, vLLM onto
the KV connector the project ships, SGLang onto streaming sessions); `Capabilities` says which
actions an adapter executes, and the executor never pretends an unsupported action ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.adapters.http import TIMEOUT_PREFIX, HttpClient
from harness.adapters.models import kv_bytes_per_token
from harness.policies.pin_release import PinSettings


class Unsupported(Exception):
    """The runtime cannot execute this operation; the caller records it as unsupported."""


@dataclass(frozen=True)
class Capabilities:
    harness_slots: bool  # the client picks the KV slot of each request (llama.cpp id_slot)
    # actions executable per pause (harness.policies.base.PAUSE_ACTIONS: keep is pinned)
    pause_actions: frozenset[str]
    local_dump_files: bool = False  # swap files sit on this machine's disk (we can delete them)
    # Offloaded copies are files the client names (llama.cpp's dumps); False: they live in the
    # server's memory, and restore and release free them.
    dump_files: bool = True
    # Each call may carry a scheduling priority the server orders its waiting calls by (and
    # preempts the lowest of): vLLM under --scheduling-policy priority.
    call_priority: bool = False
    # The server reports what became of each pause's hint (`Adapter.hint_reports`: held until
    # the resume, released early, applied late). False: what the server holds is the harness's
    # own state (slots it owns), and a hint the server carried out is accepted at the resume.
    hint_reports: bool = False


@dataclass(frozen=True)
class PausedKv:
    """A trajectory's context on the server, as a pause action names it."""

    session: str  # the trajectory id; adapters derive the names their server accepts
    slot: int | None = None  # the slot the harness gave it (runtimes with harness_slots)
    tokens: int = 0  # the context's length
    step: int | None = None  # the pause's step (the tag of its hint); None outside a pause


@dataclass(frozen=True)
class HintReport:
    """What the server reported of one pause's hint (harness.policies.pin_release's
    vocabulary): `outcome` accepted, clipped (`held_s`: how long it was held before the
    server released it), deferred (`delay_s`: how late the server applied it) or rejected, and
    why in the server's terms."""

    session: str  # the trajectory id (PausedKv.session)
    step: int  # the pause's step (PausedKv.step)
    outcome: str
    reason: str | None = None
    held_s: float | None = None
    delay_s: float | None = None
    detail: str | None = None


@dataclass(frozen=True)
class ServerInfo:
    runtime: str
    server_version: str
    model: str
    vocab_size: int
    slots: int | None
    ctx_per_slot: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    # Prefix reuse in whole blocks of this many tokens (vLLM): up to one block of a kept
    # context is prefilled again, and is no cache mismatch.
    cache_block_tokens: int | None = None
    # Whether a resumed call reuses the KV of the tokens the call before it generated (False:
    # only prompt blocks are cached, as Dynamo's mocker does; None: not known, taken as True).
    reuses_output: bool | None = None


@dataclass(frozen=True)
class CompletionRequest:
    prompt: list[int]
    max_tokens: int
    slot: int | None = None
    abort_after_first_token: bool = False
    cache_salt: str | None = None  # runtimes with a salt: a fresh salt forbids prefix reuse
    # The conversation the call belongs to (the trajectory id): runtimes that route or pin by
    # session use it; the others ignore it.
    session: str | None = None
    # Hold the call's context (pinned) once it ends, for the pause that follows: the pause's
    # decision then keeps, unpins, offloads or drops it. Runtimes without pinning ignore it.
    hold: bool = False
    # Lower is served first (runtimes with Capabilities.call_priority; the others ignore it).
    priority: int | None = None
    # The longest pause planned in the call's trajectory, s: how long the server may be asked
    # to hold its context (SGLang sizes a session's timeout by it); None: not known.
    hold_s: float | None = None


@dataclass
class CompletionResult:
    status: str  # ok | error | timeout | aborted
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens the server reused
    prompt_n: int | None = None  # prompt tokens the server processed
    prompt_ms: float | None = None
    decode_ms: float | None = None
    # the server's own report of the call's wait in its queue before it was first scheduled
    queue_ms: float | None = None
    error: str | None = None
    served_by: str | None = None  # the server-side worker that served it, where it says


def failed_result(error: str, tokens: list[int]) -> CompletionResult:
    """The result of a call whose stream ended in `error`: status `timeout` when the server went
    silent (HttpClient's TIMEOUT_PREFIX), else `error`; the tokens streamed before it kept."""
    status = "timeout" if error.startswith(TIMEOUT_PREFIX) else "error"
    return CompletionResult(status=status, error=error, tokens=tokens)


def add_streamed_tokens(result: CompletionResult, tokens: list[int], req: CompletionRequest,
                        on_tokens: Callable[[], object]) -> bool:
    """Append a streamed chunk's tokens to `result` and call `on_tokens` for every chunk that
    carries some (its first call is the first token; the caller times the rest, the per-token
    ITL). When `req` asks to hang up after the first tokens, mark the result aborted and return
    False (the caller stops reading, so the server stops generating)."""
    if not tokens:
        return True
    first = not result.tokens
    result.tokens.extend(tokens)
    on_tokens()
    if first and req.abort_after_first_token:
        result.status = "aborted"
        return False
    return True


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
        self, req: CompletionRequest, on_tokens: Callable[[], object]
    ) -> CompletionResult:
        """Stream one completion; `on_tokens` is called as each chunk of tokens arrives."""
        ...

    # ---- the pause actions --------------------------------------------------------------
    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        """Keep the context pinned while paused. `ttl_s`: when the core will end the hold
        itself (a TTL), for a server-side safety net; None: until resumed or released."""
        ...

    async def unpin(self, kv: PausedKv) -> int:
        """Hand the context to the engine's own evictable cache (keep-evictable); returns the
        tokens the server had to prefill again to leave it there (0 where none)."""
        ...

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        """Move the context off the device (to host memory or the file `name`)."""
        ...

    async def drop(self, kv: PausedKv) -> None:
        """Discard the context (the core forbids its reuse with a fresh cache salt where
        the runtime has one)."""
        ...

    async def restore(self, kv: PausedKv, name: str) -> SlotIO | None:
        """Bring an offloaded context back before the resumed call; None when the runtime
        restores it on the call itself."""
        ...

    async def release(self, kv: PausedKv) -> None:
        """The trajectory ended: free whatever the server holds for it."""
        ...

    async def delete_dump(self, name: str) -> bool:
        """Delete an offloaded copy that sits in a file on this machine."""
        ...

    async def held(self) -> list[str] | None:
        """What the server still holds for this run (pins, sessions, host copies): the
        end-of-run leftover check; None where it cannot be seen."""
        ...

    def hint_reports(self) -> list[HintReport]:
        """The server's reports of pauses' hints that arrived since the last call (each once);
        [] where the server reports none (Capabilities.hint_reports False)."""
        ...

    async def scrape(self) -> list[tuple[str, str, str, float]]: ...

    async def slots_idle(self) -> bool | None: ...


# ---- the runtime seam: what the core asks of a runtime, and what it gets back ---------------
@dataclass(frozen=True)
class ServerOptions:
    """What the core asks of a runtime for one run. The runtime decides how: start a local server
    (`url` None) with these settings, or reach the one at `url`."""

    policy: str  # the pause policy the run measures
    run_id: str  # unique per run: cache salts, dump file names
    url: str | None = None
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    model: Path | None = None  # a local server's model; the served model's name for `openai`
    server_args: tuple[str, ...] = ()  # extra flags for a local server
    server_cpus: str | None = None  # a local server's CPUs (taskset list), decided by the core
    # The most connections the run's client opens at once: a local server whose HTTP layer
    # serves one connection per thread is given at least as many threads.
    connections: int = 8
    # With `url`: the server was started on this machine by another process of the same run
    # (a distributed run's driver), which passes its ServerDetails.shared on.
    shared: dict[str, Any] | None = None
    # The policy wants its calls served in program order (a call priority): a local server
    # that can is started scheduling by priority.
    program_order: bool = False
    # How a local server releases pinned paused contexts when its pool is full, how long its
    # safety net keeps one, and the host memory its offloaded copies may use.
    pins: PinSettings = field(default_factory=PinSettings)


@dataclass(frozen=True)
class PolicyRealisation:
    """How a policy runs on one server: what the executor decides per pause (`harness_policy`)
    and what run.json says was measured (`label`)."""

    harness_policy: str
    label: str


@dataclass
class ServerDetails:
    """What run.json records about the server a run talked to; `flags` is None for a server the
    harness did not start."""

    url: str
    flags: list[str] | None = None
    binary: str | None = None
    build: str | None = None
    python: str | None = None
    env: dict[str, str] | None = None
    start_s: float | None = None
    model: dict[str, Any] | None = None  # name, path, geometry, kv_bytes_per_token
    extra: dict[str, Any] = field(default_factory=dict)  # runtime-specific settings
    # a local server's pid, process group and private folder: what to remove if the run dies
    process: dict[str, Any] | None = None
    # what another process of the run on this machine needs to use this server as its starter
    # does (ServerOptions.shared), e.g. llama-server's dump folder
    shared: dict[str, Any] | None = None

    @property
    def kv_bytes_per_token(self) -> float | None:
        """The model's KV bytes per token, from its geometry, when known."""
        return kv_bytes_per_token(self.model or {})


@dataclass
class RuntimeSession:
    """A server ready for a run, yielded by `Runtime.start`.

    `connect` builds the adapter on the run's HTTP client; `realise` says how the run's policy
    executes once the server's own report is known; `leftover_dumps` lists KV dump files the run
    left on this machine (None: none can be seen from here); `notes` are for the user;
    `server_exited` says why a local server ended, if it has."""

    details: ServerDetails
    connect: Callable[[HttpClient], Adapter]
    realise: Callable[[ServerInfo], PolicyRealisation]
    leftover_dumps: Callable[[str], list[str]] | None = None
    notes: list[str] = field(default_factory=list)
    # A local server's exit, watched during the run: None while it runs, else why it ended.
    server_exited: Callable[[], str | None] | None = None


class Runtime(Protocol):
    """One runtime the harness can drive: `start` brings up (or reaches) a server and stops
    whatever it started when the block exits, however it exits."""

    name: str
    # Whether a local server can be pinned to CPUs of its own (ServerOptions.server_cpus).
    pins_local_server: bool
    # Whether the client controls the server's KV slots (what calibrate measures, and what the
    # simulator models).
    per_slot_control: bool
    # Policies this runtime adds beyond the harness's own: server configurations (a router
    # mode, session affinity), each name -> the per-pause policy the harness runs under it.
    server_policies: Mapping[str, str]
    # What `bench` compares on this runtime when no --policies are given.
    default_policies: tuple[str, ...]

    def start(self, options: ServerOptions, out: Path
              ) -> AbstractContextManager[RuntimeSession]: ...
