"""The scheduler side's bookkeeping of pins and host copies, free of vLLM so it can be tested
alone: what is held for which session, until when, what the worker must copy, load and
discard next, and what each control op answers.

Block references go through `PoolOps` (the connector maps them onto vLLM's block pool):
`touch` takes a reference, `free` gives it back to the engine's evictable cache, `discard`
gives it back without its cache entry (the blocks are reused first, never matched again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

KEY = "harness_pause"  # the key of kv_transfer_params this connector reads and answers
CONNECTOR = "HarnessPauseConnector"
VERSION = 1
OPS = ("hold", "unpin", "offload", "drop", "release", "release_all", "status")
DEFAULT_TTL_S = 900.0
DEFAULT_HOST_CAP_BYTES = 1 << 30
# The valve's orders (harness.policies.pin_release, which a unit test checks this agrees with).
RELEASE_ORDERS = ("latest-program", "lru", "largest")


class Block(Protocol):
    """What the book reads of a device block."""

    @property
    def block_id(self) -> int: ...


class PoolOps(Protocol):
    """Reference counting on the device block pool."""

    def touch(self, blocks: Sequence[Any]) -> None: ...

    def free(self, blocks: Sequence[Any]) -> None: ...

    def discard(self, blocks: Sequence[Any]) -> None: ...

    def free_count(self) -> int:
        """Blocks an allocation can take now (free, or cached and evictable)."""
        ...


@dataclass
class Pin:
    """A session's blocks held out of eviction: the first `len(blocks)` blocks of `tokens`.
    `tag`: the pause it is held for (the client's, from its control); `since`: when pinned."""

    blocks: list[Any]
    tokens: list[int]  # the token ids the blocks hold, whole blocks
    salt: str | None
    expires_at: float
    since: float = 0.0
    tag: str | None = None


@dataclass
class HostCopy:
    """A session's blocks copied to host memory by the worker (under `copy_id`)."""

    copy_id: int
    name: str
    tokens: list[int]
    salt: str | None
    blocks: int
    bytes: int
    expires_at: float
    since: float = 0.0  # when its context was pinned
    tag: str | None = None


@dataclass
class Orders:
    """What the worker does in the next step: copy device blocks to host (`saves`: copy id,
    block ids), copy host blocks back (`loads`: copy id, first host block, device block ids;
    the copy is dropped once loaded) and drop host copies (`discards`)."""

    saves: list[tuple[int, list[int]]] = field(default_factory=list)
    loads: list[tuple[int, int, list[int]]] = field(default_factory=list)
    discards: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.saves or self.loads or self.discards)


@dataclass(frozen=True)
class Limits:
    block_size: int
    bytes_per_block: int  # every layer's K and V of one block
    host_cap_bytes: int = DEFAULT_HOST_CAP_BYTES
    default_ttl_s: float = DEFAULT_TTL_S
    release_order: str = RELEASE_ORDERS[0]

    def __post_init__(self) -> None:
        if self.release_order not in RELEASE_ORDERS:
            raise ValueError(f"pin_release must be one of {', '.join(RELEASE_ORDERS)}, not "
                             f"{self.release_order!r}")


@dataclass
class _Plan:
    session: str
    copy_id: int
    first_block: int


class Book:
    """Pins and host copies per session; `clock` gives monotonic seconds."""

    def __init__(self, limits: Limits, pool: PoolOps, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.pool = pool
        self.clock = clock
        self.pins: dict[str, Pin] = {}
        self.copies: dict[str, HostCopy] = {}
        self.orders = Orders()
        self._after_orders: list[Any] = []  # blocks freed once their save order is out
        self._plans: dict[str, _Plan] = {}  # request id -> the load its allocation triggers
        self._next_copy = 1
        self.saved: dict[int, dict[str, Any]] = {}  # copy id -> the worker's report
        self.worker_host_bytes: int | None = None
        self.expired = {"pins": 0, "copies": 0}
        self.restored_tokens = 0
        # What the worker loaded back from host copies, in total: bytes and copy time.
        self.loaded: dict[str, Any] = {"bytes": 0, "ms": 0.0}
        self.arrived: dict[str, float] = {}  # session -> when its first call was seen
        # session -> what became of its tagged pins and copies, until an answer reports it
        self.fates: dict[str, list[dict[str, Any]]] = {}
        # session -> an untagged pin ended early, which the next tagged control adopts
        self._untagged: dict[str, dict[str, Any]] = {}
        self.valve: dict[str, int] = {"released": 0, "blocks": 0}
        self._running: dict[str, str] = {}  # request id -> its session, while scheduled

    # ---- a session's calls --------------------------------------------------------------
    def finished(self, session: str, hold: bool, blocks: Sequence[Any], tokens: Sequence[int],
                 salt: str | None) -> int:
        """A call of `session` ended having computed `blocks` (its full cached blocks, in
        order) over `tokens`: pin them if `hold`, and release what was pinned before (the
        context moved on). A host copy the call did not load is dropped. Returns the tokens
        now pinned."""
        self.expire()
        now = self.clock()
        self.arrived.setdefault(session, now)
        new = None
        if hold and blocks:
            self.pool.touch(blocks)
            n = len(blocks) * self.limits.block_size
            new = Pin(list(blocks), list(tokens[:n]), salt, now + self.limits.default_ttl_s,
                      since=now)
        self._unpin(session, "resumed")
        self._drop_copy(session, "replaced")
        self._untagged.pop(session, None)
        if new is None:
            return 0
        self.pins[session] = new
        return len(new.tokens)

    def restorable(self, request_id: str, session: str, prompt: Sequence[int],
                   salt: str | None, computed: int) -> int:
        """Tokens of `session`'s host copy a new call can load past the `computed` tokens the
        device cache already holds: whole blocks of the copy that the prompt starts with, under
        the same salt, leaving at least one prompt token to compute."""
        self._plans.pop(request_id, None)
        self.arrived.setdefault(session, self.clock())
        copy = self.copies.get(session)
        bs = self.limits.block_size
        if copy is None or copy.salt != salt:
            return 0
        n = min(copy.blocks, (len(prompt) - 1) // bs)
        while n > 0 and list(prompt[:n * bs]) != copy.tokens[:n * bs]:
            n -= 1
        first = computed // bs
        if n <= first:
            return 0
        self._plans[request_id] = _Plan(session, copy.copy_id, first)
        return (n - first) * bs

    def allocated(self, request_id: str, block_ids: Sequence[int], external: int,
                  delay_s: float | None = None) -> None:
        """The scheduler gave the call its blocks, `external` tokens of them to load: order the
        load from the host copy (consumed: dropped once loaded). `delay_s`: how long the call
        waited for it since it arrived."""
        plan = self._plans.pop(request_id, None)
        if plan is None or external <= 0:
            return
        copy = self.copies.get(plan.session)
        if copy is None or copy.copy_id != plan.copy_id:
            return
        n = external // self.limits.block_size
        dst = list(block_ids[plan.first_block:plan.first_block + n])
        self.orders.loads.append((copy.copy_id, plan.first_block, dst))
        del self.copies[plan.session]
        self._fate(plan.session, "copy", "restored", copy.tag, copy.since, delay_s=delay_s)
        self.restored_tokens += n * self.limits.block_size

    def started(self, request_id: str, session: str) -> None:
        """A call of `session` got its blocks: the valve leaves the session's pin alone while
        it runs (its blocks are the call's too; releasing them frees nothing)."""
        self._running[request_id] = session

    def forget_request(self, request_id: str) -> None:
        self._plans.pop(request_id, None)
        self._running.pop(request_id, None)

    # ---- control ops --------------------------------------------------------------------
    def control(self, params: dict[str, Any], delay_s: float | None = None) -> dict[str, Any]:
        """Run one control op now; its answer (the worker's figures filled in by `answer`), with
        what became of the session's tagged pins and copies since its last answer (`fates`).
        `delay_s`: how long the request waited in the engine before the op ran."""
        self.expire()
        out = self._control(params, delay_s)
        session = out.get("session")
        if isinstance(session, str):
            out["fates"] = self.fates.pop(session, [])
        return out

    def _control(self, params: dict[str, Any], delay_s: float | None) -> dict[str, Any]:
        op = params.get("op")
        out: dict[str, Any] = {"connector": CONNECTOR, "version": VERSION, "op": op, "ok": True}
        session = params.get("session")
        tag = params.get("tag")
        if tag is not None:
            out["tag"] = tag = str(tag)
        if delay_s is not None:
            out["delay_s"] = round(delay_s, 4)
        if op not in OPS:
            return _error(out, f"unknown op {op!r} (known: {', '.join(OPS)})")
        if op in ("release_all", "status"):
            prefix = params.get("prefix") or ""
            if not isinstance(prefix, str):
                return _error(out, "prefix must be a string")
            if op == "release_all":
                out["released"] = self._release_all(prefix)
            out.update(self.status(prefix))
            out["fates"] = self.take_fates(prefix)
            return out
        if not isinstance(session, str) or not session:
            return _error(out, f"{op} needs a session")
        out["session"] = session
        pin = self.pins.get(session)
        if tag is not None:
            if pin is not None and pin.tag is None:
                pin.tag = tag
            early = self._untagged.pop(session, None)
            if pin is None and early is not None:  # ended before its pause's control came
                self.fates.setdefault(session, []).append({**early, "tag": tag})
        if op == "hold":
            return self._hold(out, session, params.get("ttl_s"))
        if op == "offload":
            name = params.get("name")
            return self._offload(out, session, name if isinstance(name, str) else session)
        copy = self.copies.get(session)
        out["tokens"] = len(pin.tokens) if pin else 0
        out["host_tokens"] = len(copy.tokens) if copy else 0
        if op == "unpin":
            self._unpin(session, "unpinned")
        elif op == "drop":
            if pin is not None:
                del self.pins[session]
                self.pool.discard(pin.blocks)
            self._drop_copy(session)
        else:  # release: the trajectory ended
            self._unpin(session, "released")
            self._drop_copy(session, "released")
            self.arrived.pop(session, None)
            self._untagged.pop(session, None)
        return out

    def answer(self, out: dict[str, Any]) -> dict[str, Any]:
        """A control op's answer once its request ends: the worker's report of its copy."""
        copy_id = out.pop("copy_id", None)
        report = self.saved.pop(copy_id, None) if copy_id is not None else None
        if report is not None:
            out["ms"] = report["ms"]
            out["worker_bytes"] = report["bytes"]
            if report.get("error"):
                out["ok"] = False
                out["error"] = report["error"]
        if out.get("op") in ("status", "release_all"):
            out["worker_host_bytes"] = self.worker_host_bytes
        return out

    def _hold(self, out: dict[str, Any], session: str, ttl_s: object) -> dict[str, Any]:
        pin = self.pins.get(session)
        if ttl_s is not None and (not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool)
                                  or not math.isfinite(ttl_s) or ttl_s < 0):
            return _error(out, f"ttl_s must be a finite number >= 0, not {ttl_s!r}")
        ttl = self.limits.default_ttl_s if ttl_s is None else float(ttl_s)
        out["tokens"] = len(pin.tokens) if pin else 0
        if pin is not None:
            pin.expires_at = self.clock() + ttl
            out["expires_in_s"] = round(ttl, 3)
        return out

    def _offload(self, out: dict[str, Any], session: str, name: str) -> dict[str, Any]:
        pin = self.pins.get(session)
        if pin is None or not pin.blocks:
            out["tokens"] = 0
            return _error(out, "nothing is pinned for the session: nothing to offload")
        self._drop_copy(session)  # a newer context replaces an older copy
        size = len(pin.blocks) * self.limits.bytes_per_block
        held = self.host_bytes()
        if held + size > self.limits.host_cap_bytes:
            out["tokens"] = len(pin.tokens)
            return _error(out, f"host memory cap: {held} of {self.limits.host_cap_bytes} bytes "
                          f"held, the copy needs {size} more; the context stays pinned")
        copy = HostCopy(self._next_copy, name, pin.tokens, pin.salt, len(pin.blocks), size,
                        self.clock() + self.limits.default_ttl_s, since=pin.since, tag=pin.tag)
        self._next_copy += 1
        self.copies[session] = copy
        del self.pins[session]
        self.orders.saves.append((copy.copy_id, [b.block_id for b in pin.blocks]))
        # The device blocks go only once the save order is handed to the worker, whose copy
        # runs before any later step can write them.
        self._after_orders.extend(pin.blocks)
        out.update(tokens=len(copy.tokens), bytes=size, copy_id=copy.copy_id)
        return out

    # ---- each scheduler step --------------------------------------------------------------
    def take_orders(self) -> Orders:
        """The worker's orders for this step; the device blocks of offloaded pins are freed
        (and never matched again) once their save is ordered."""
        self.expire()
        orders, self.orders = self.orders, Orders()
        if self._after_orders:
            self.pool.discard(self._after_orders)
            self._after_orders = []
        return orders

    def worker_report(self, saved: dict[int, dict[str, Any]], host_bytes: int | None,
                      loaded_bytes: int = 0, loaded_ms: float = 0.0) -> None:
        """What the worker reported for a step: each save's bytes, time and error, the host
        memory it holds, and what it loaded back (bytes, ms)."""
        self.saved.update(saved)
        self.loaded["bytes"] += loaded_bytes
        self.loaded["ms"] = round(self.loaded["ms"] + loaded_ms, 6)
        if host_bytes is not None:
            self.worker_host_bytes = host_bytes
        for copy_id, report in saved.items():
            if report.get("error"):  # the copy failed: nothing to restore from it
                for session, copy in list(self.copies.items()):
                    if copy.copy_id == copy_id:
                        del self.copies[session]
                        self._fate(session, "copy", "failed", copy.tag, copy.since,
                                   reason=str(report.get("error"))[:200])

    def expire(self) -> None:
        """Release every pin and drop every host copy past its expiry."""
        now = self.clock()
        for session in [s for s, p in self.pins.items() if p.expires_at <= now]:
            self._unpin(session, "expired")
            self.expired["pins"] += 1
        for session in [s for s, c in self.copies.items() if c.expires_at <= now]:
            self._drop_copy(session, "expired")
            self.expired["copies"] += 1

    # ---- what is held ---------------------------------------------------------------------
    def host_bytes(self) -> int:
        return sum(c.bytes for c in self.copies.values())

    def status(self, prefix: str = "") -> dict[str, Any]:
        """Every pin and host copy whose session starts with `prefix`."""
        now = self.clock()
        pins = [{"session": s, "tokens": len(p.tokens), "blocks": len(p.blocks),
                 "expires_in_s": round(p.expires_at - now, 3)}
                for s, p in sorted(self.pins.items()) if s.startswith(prefix)]
        copies = [{"session": s, "name": c.name, "tokens": len(c.tokens), "bytes": c.bytes,
                   "expires_in_s": round(c.expires_at - now, 3)}
                  for s, c in sorted(self.copies.items()) if s.startswith(prefix)]
        return {"pins": pins, "host": copies, "host_bytes": self.host_bytes(),
                "host_cap_bytes": self.limits.host_cap_bytes,
                "default_ttl_s": self.limits.default_ttl_s,
                "block_size": self.limits.block_size,
                "bytes_per_block": self.limits.bytes_per_block,
                "expired": dict(self.expired), "restored_tokens": self.restored_tokens,
                "loaded": dict(self.loaded), "release_order": self.limits.release_order,
                "valve": dict(self.valve)}

    def take_fates(self, prefix: str) -> list[dict[str, Any]]:
        """What became of the tagged pins and copies of the sessions that start with `prefix`,
        not reported yet (reported now: each once)."""
        return [f for s in sorted(self.fates) if s.startswith(prefix) for f in self.fates.pop(s)]

    def _release_all(self, prefix: str) -> int:
        sessions = {s for s in [*self.pins, *self.copies] if s.startswith(prefix)}
        for session in sessions:
            self._unpin(session, "released")
            self._drop_copy(session, "released")
        for session in [s for s in [*self.arrived, *self._untagged] if s.startswith(prefix)]:
            self.arrived.pop(session, None)
            self._untagged.pop(session, None)
        return len(sessions)

    # ---- the valve ----------------------------------------------------------------------
    def make_room(self, need: int, exclude: str | None = None) -> int:
        """The engine needs `need` free blocks to admit or grow a call: release pins (but
        `exclude`'s, the call's own, and those of sessions with a call running) in the declared
        order until it has them, if releasing them all would; else none (the call waits for
        the running calls, as with nothing pinned). Under `latest-program` (programs first
        come, first served, as Continuum serves them), while any call runs, only the pins of
        sessions that arrived after the call's own (a call of no session: after now). Their
        blocks go to the evictable cache. Returns how many pins were released (0 at once when
        the pool has room or nothing is pinned)."""
        if not self.pins or self.pool.free_count() >= need:
            return 0
        busy = set(self._running.values())
        order = release_order(self.pins, self.arrived, self.limits.release_order, exclude)
        if self.limits.release_order == "latest-program" and busy:
            now = self.clock()
            mine = now if exclude is None else self.arrived.get(exclude, now)
            order = [s for s in order if self.arrived.get(s, self.pins[s].since) > mine]
        order = [s for s in order if s not in busy]
        if self.pool.free_count() + sum(len(self.pins[s].blocks) for s in order) < need:
            return 0
        released = 0
        for session in order:
            if self.pool.free_count() >= need:
                break
            pin = self.pins[session]
            self.valve["blocks"] += len(pin.blocks)
            self._unpin(session, "valve")
            released += 1
        self.valve["released"] += released
        return released

    def _unpin(self, session: str, end: str | None = None) -> None:
        pin = self.pins.pop(session, None)
        if pin is not None:
            self.pool.free(pin.blocks)
            if end is not None:
                self._fate(session, "pin", end, pin.tag, pin.since)

    def _drop_copy(self, session: str, end: str | None = None) -> None:
        copy = self.copies.pop(session, None)
        if copy is not None:
            self.orders.discards.append(copy.copy_id)
            if end is not None:
                self._fate(session, "copy", end, copy.tag, copy.since)

    def _fate(self, session: str, kind: str, end: str, tag: str | None, since: float,
              reason: str | None = None, delay_s: float | None = None) -> None:
        """What became of a pin or host copy, for the session's next answer; an untagged one
        that ended early waits for its pause's control to tag it."""
        if end == "valve":
            reason = self.limits.release_order
        elif end == "expired":
            reason = f"the server's expiry ({self.limits.default_ttl_s:g} s)"
        fate = {"session": session, "tag": tag, "kind": kind, "end": end, "reason": reason,
                "held_s": round(self.clock() - since, 4),
                "delay_s": None if delay_s is None else round(delay_s, 4)}
        if tag is not None:
            self.fates.setdefault(session, []).append(fate)
        elif end in ("valve", "expired"):
            self._untagged[session] = fate


def release_order(pins: dict[str, Pin], arrived: dict[str, float], order: str,
                  exclude: str | None = None) -> list[str]:
    """The pinned sessions (but `exclude`) in the order the valve releases them: the latest
    program's first (`arrived` latest), the least recently used (pinned earliest), or the
    largest; ties by name."""
    mine = [s for s in pins if s != exclude]
    if order == "latest-program":
        return sorted(mine, key=lambda s: (-arrived.get(s, pins[s].since), s))
    if order == "lru":
        return sorted(mine, key=lambda s: (pins[s].since, s))
    return sorted(mine, key=lambda s: (-len(pins[s].blocks), s))


def _error(out: dict[str, Any], message: str) -> dict[str, Any]:
    out.update(ok=False, error=message)
    return out


def call_params(kv_transfer_params: object) -> dict[str, Any] | None:
    """The connector's part of a request's kv_transfer_params, when it is a dict."""
    if not isinstance(kv_transfer_params, dict):
        return None
    params = kv_transfer_params.get(KEY)
    return params if isinstance(params, dict) else None
