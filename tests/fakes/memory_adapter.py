"""An in-memory adapter whose time passes only on the injected clock: exact executor tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.adapters.base import (
    Capabilities,
    CompletionRequest,
    CompletionResult,
    HintReport,
    PausedKv,
    ServerInfo,
    SlotIO,
    Unsupported,
)
from harness.replay.clock import NS, Clock

BYTES_PER_TOKEN = 100


@dataclass
class MemoryAdapter:
    clock: Clock
    slots: int = 2
    ctx: int = 4096
    prefill_s_per_token: float = 0.001
    decode_s_per_token: float = 0.01
    save_s: float = 0.002
    restore_s: float = 0.003
    swap_supported: bool = True
    fail_calls: set[int] = field(default_factory=set)  # call indexes answered with an error
    runtime: str = "memory"
    cache: dict[int, list[int]] = field(default_factory=dict)
    files: dict[str, list[int]] = field(default_factory=dict)
    calls: list[CompletionRequest] = field(default_factory=list)
    erased: list[int] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    # False: a server that manages its own memory (no client slots) and pins, unpins, offloads
    # and drops per session, as vLLM with the project's connector and SGLang sessions do.
    slotted: bool = True
    pinned: set[str] = field(default_factory=set)  # sessions held out of eviction
    host: dict[str, list[int]] = field(default_factory=dict)  # offloaded, per session
    pause_log: list[tuple[str, str]] = field(default_factory=list)  # (action, session)
    call_priority: bool = False  # schedules by a call's priority (recorded on `calls`)
    # What the server reports of pauses' hints, drained by hint_reports (with reports_hints,
    # the capabilities say the server reports them)
    reports: list[HintReport] = field(default_factory=list)
    reports_hints: bool = False
    fail_ops: set[str] = field(default_factory=set)  # pause ops whose control is lost

    def __post_init__(self) -> None:
        if self.slotted:
            actions = {"keep", "recompute"} | ({"swap"} if self.swap_supported else set())
            self.capabilities = Capabilities(harness_slots=True,
                                             pause_actions=frozenset(actions),
                                             local_dump_files=True)
            return
        actions = {"keep", "keep-evictable", "recompute"} | (
            {"swap"} if self.swap_supported else set())
        self.capabilities = Capabilities(harness_slots=False, pause_actions=frozenset(actions),
                                         dump_files=False, call_priority=self.call_priority,
                                         hint_reports=self.reports_hints)
        self._sessions: dict[str, list[int]] = {}  # session -> its cached context
        self._salts: dict[str, str | None] = {}  # session -> the salt it was cached under

    def evict_unpinned(self) -> None:
        """Memory pressure: every cached context not pinned is evicted."""
        for session in [k for k in self._sessions if k not in self.pinned]:
            del self._sessions[session]

    async def _sleep(self, s: float) -> None:
        await self.clock.sleep_until(self.clock.now_ns() + round(s * NS))

    async def server_info(self) -> ServerInfo:
        return ServerInfo(self.runtime, "mem-1", "mem-model", 1000, self.slots, self.ctx)

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        index = len(self.calls)
        self.calls.append(req)
        if index in self.fail_calls:
            return CompletionResult(status="error", error="injected failure")
        if not self.slotted:
            return await self._complete_session(req, on_tokens)
        slot = req.slot if req.slot is not None else 0
        old = self.cache.get(slot, [])
        cached = _reused(old, req.prompt)
        new = len(req.prompt) - cached
        await self._sleep(new * self.prefill_s_per_token + self.decode_s_per_token)
        on_tokens()
        tokens = [500 + i for i in range(req.max_tokens)]
        if req.abort_after_first_token:
            self.cache[slot] = req.prompt + tokens[:1]
            return CompletionResult(status="aborted", tokens=tokens[:1])
        for _ in range(req.max_tokens - 1):  # one token per chunk, decode_s_per_token apart
            await self._sleep(self.decode_s_per_token)
            on_tokens()
        self.cache[slot] = req.prompt + tokens
        return CompletionResult(status="ok", tokens=tokens, cached_tokens=cached, prompt_n=new,
                                prompt_ms=new * self.prefill_s_per_token * 1000,
                                decode_ms=req.max_tokens * self.decode_s_per_token * 1000)

    async def _complete_session(self, req: CompletionRequest,
                                on_tokens: Callable[[], object]) -> CompletionResult:
        key = req.session or ""
        if key in self.host:  # restored on the call itself
            self._sessions[key] = self.host.pop(key)
        # A salt other than the one the context was cached under forbids its reuse.
        old = (self._sessions.get(key, []) if self._salts.get(key) == req.cache_salt
               else [])
        self._salts[key] = req.cache_salt
        cached = _reused(old, req.prompt)
        new = len(req.prompt) - cached
        await self._sleep(new * self.prefill_s_per_token + self.decode_s_per_token)
        tokens = [500 + i for i in range(req.max_tokens)]
        on_tokens()
        self._sessions[key] = req.prompt + tokens
        if req.hold:
            self.pinned.add(key)
        return CompletionResult(status="ok", tokens=tokens, cached_tokens=cached, prompt_n=new,
                                prompt_ms=new * self.prefill_s_per_token * 1000,
                                decode_ms=req.max_tokens * self.decode_s_per_token * 1000)

    # ---- the pause actions ---------------------------------------------------------------
    def _control(self, op: str) -> None:
        if op in self.fail_ops:
            raise TimeoutError(f"{op}: the control was never answered")

    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        self._control("hold")
        self.pause_log.append(("hold", kv.session))
        if self.slotted:
            return
        self.pinned.add(kv.session)

    async def unpin(self, kv: PausedKv) -> int:
        if self.slotted:
            raise Unsupported("slots are the harness's")
        self.pause_log.append(("unpin", kv.session))
        self.pinned.discard(kv.session)
        return 0

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        if self.slotted:
            assert kv.slot is not None
            io = await self.save_slot(kv.slot, name)
            await self.erase_slot(kv.slot)
            return io
        if not self.swap_supported:
            raise Unsupported("no offload")
        self._control("offload")
        self.pause_log.append(("offload", kv.session))
        await self._sleep(self.save_s)
        toks = self._sessions.pop(kv.session, [])
        self.pinned.discard(kv.session)
        self.host[kv.session] = toks
        return SlotIO(len(toks) * BYTES_PER_TOKEN, self.save_s * 1000, len(toks))

    async def drop(self, kv: PausedKv) -> None:
        if self.slotted:
            assert kv.slot is not None
            await self.erase_slot(kv.slot)
            return
        self._control("drop")
        self.pause_log.append(("drop", kv.session))
        self.pinned.discard(kv.session)
        self._sessions.pop(kv.session, None)

    async def restore(self, kv: PausedKv, name: str) -> SlotIO | None:
        if self.slotted:
            assert kv.slot is not None
            return await self.restore_slot(kv.slot, name)
        self.pause_log.append(("restore", kv.session))
        return None  # restored on the resumed call

    async def release(self, kv: PausedKv) -> None:
        if self.slotted:
            if kv.slot is not None:
                await self.erase_slot(kv.slot)
            return
        self.pause_log.append(("release", kv.session))
        self.pinned.discard(kv.session)
        self.host.pop(kv.session, None)

    async def held(self) -> list[str] | None:
        if self.slotted:
            return []
        return sorted(self.pinned | set(self.host))

    def hint_reports(self) -> list[HintReport]:
        out, self.reports = self.reports, []
        return out

    async def save_slot(self, slot: int, name: str) -> SlotIO:
        if not self.swap_supported:
            raise Unsupported("no slot save")
        await self._sleep(self.save_s)
        toks = self.cache.get(slot, [])
        self.files[name] = list(toks)
        return SlotIO(len(toks) * BYTES_PER_TOKEN, self.save_s * 1000, len(toks))

    async def restore_slot(self, slot: int, name: str) -> SlotIO:
        await self._sleep(self.restore_s)
        toks = self.files[name]
        self.cache[slot] = list(toks)
        return SlotIO(len(toks) * BYTES_PER_TOKEN, self.restore_s * 1000, len(toks))

    async def erase_slot(self, slot: int) -> None:
        self.erased.append(slot)
        self.cache.pop(slot, None)

    async def delete_dump(self, name: str) -> bool:
        self.deleted.append(name)
        self.files.pop(name, None)
        return True

    async def scrape(self) -> list[tuple[str, str, str, float]]:
        return [("metrics", "fake:busy", "", 0.0)]

    async def slots_idle(self) -> bool | None:
        return True


def _reused(old: list[int], prompt: list[int]) -> int:
    """The prompt's tokens a cached context covers (its common prefix), less the last one,
    which is always computed again."""
    cached = 0
    for a, b in zip(old, prompt, strict=False):
        if a != b:
            break
        cached += 1
    return min(cached, len(prompt) - 1)
