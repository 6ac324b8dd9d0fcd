"""The pin-release valve inside a local SGLang server's scheduler (SGLang 0.5.23).

A streaming session pins its KV (and its request row) until it is closed. Pins that never
yield stall a full pool: with nothing running, a waiting request that does not fit is never
admitted, and a running one that cannot grow is retracted and then waits for ever. The valve
closes idle streaming sessions, in the declared order, inside the scheduler's own step until
the scheduler can go on. A closed session's first prompt stays in the radix tree as evictable
tokens (SGLang's own close), the rest of its KV is freed.

Where it acts (sglang/srt/managers/scheduler.py, schedule_batch.py):
- `Scheduler.get_new_batch_prefill`: when it formed no batch while requests wait, because a
  waiting request did not fit (SGLang then marks the running batch full) or nothing runs, a
  session is closed and admission is tried again, until a batch forms or no session is left
  to close; under `latest-program` (programs first come, first served, as Continuum serves
  them), while requests run, only sessions of programs that arrived after the first waiting
  request's (a request of no session: after now);
- `ScheduleBatch.check_decode_mem`: when the next decode step does not fit, sessions are
  closed until it does, before SGLang would retract a running request.
Neither costs anything while the pool has room: the valve looks only once SGLang has failed.
A session with a request in flight (or a close pending) is never released.

The orders (`HARNESS_SGLANG_PIN_RELEASE`, the harness's --pin-release; a copy of
harness.policies.pin_release's, which a unit test checks):
- `latest-program`: the session of the program that arrived last (a program is the session
  id without its last `/` part, the harness's `<prefix>/<trajectory>/<n>`; it arrived when
  its first session opened);
- `lru`: the session whose last request ended longest ago;
- `largest`: the session holding the most tokens out of eviction (its own KV and the prefix
  of its first prompt, which its lock protects in the radix tree).
Ties go by the session id.

Each release is kept (the last MAX_KEPT) and served under `harness_session_releases` in the
scheduler's internal state, which SGLang's `/server_info` returns (`internal_states`):
{"session", "at" (Unix time), "held_s" (since its last request ended), "reason"
("valve: <order>"), "tokens", "why"}.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ENV = "HARNESS_SGLANG_PIN_RELEASE"
ORDERS = ("latest-program", "lru", "largest")
RELEASES_KEY = "harness_session_releases"
MAX_KEPT = 10_000
TARGET = "sglang.srt.managers.scheduler"

logger = logging.getLogger("harness.pin_valve")


@dataclass(frozen=True)
class Pin:
    """One releasable session: when its program arrived, when its last request ended
    (monotonic seconds), and the tokens it holds out of eviction."""

    session: str
    arrived: float
    used: float
    tokens: int


def ranked(pins: Iterable[Pin], order: str) -> list[str]:
    """The sessions of `pins` in the order the valve releases them under `order`."""
    if order == "latest-program":
        out = sorted(pins, key=lambda p: (-p.arrived, p.session))
    elif order == "lru":
        out = sorted(pins, key=lambda p: (p.used, p.session))
    elif order == "largest":
        out = sorted(pins, key=lambda p: (-p.tokens, p.session))
    else:
        raise ValueError(f"unknown pin release order {order!r}")
    return [p.session for p in out]


def program(session_id: str) -> str:
    """The program a session belongs to: its id without the last `/` part."""
    return session_id.rsplit("/", 1)[0] if "/" in session_id else session_id


class Valve:
    """The releases one scheduler process made, and how it picks the next."""

    def __init__(self, order: str) -> None:
        self.order = order
        self.scheduler: Any = None  # the scheduler of this process, once built
        self.arrived: dict[str, float] = {}  # program -> its first session's open
        self.releases: list[dict[str, Any]] = []

    def pins(self) -> list[Pin]:
        """The streaming sessions that hold KV and have no request in flight."""
        sched = self.scheduler
        if sched is None:
            return []
        records = sched.tree_cache.session_records()
        out = []
        for sid, session in list(sched.session_controller.sessions.items()):
            kv = records.get(sid)
            if (not session.streaming or session._inflight or session.close_on_finish
                    or kv is None or not kv.holds_kv):
                continue
            used = getattr(session, "harness_ended", session.last_active_time)
            # all it holds out of eviction: its own KV and the prefix its lock protects
            out.append(Pin(sid, self.arrived.get(program(sid), 0.0), used,
                           int(kv.kv_allocated_len)))
        return out

    def arrival(self, req: Any) -> float:
        """When the program of a waiting request arrived (a request of no session, or of one
        not seen open: now)."""
        sid = getattr(req, "session_id", None)
        return self.arrived.get(program(sid), time.monotonic()) if sid else time.monotonic()

    def release_one(self, why: str, after: float | None = None) -> bool:
        """Close the first session in the order (of a program that arrived after `after`,
        unless None); False when none can be released."""
        pins = [p for p in self.pins() if after is None or p.arrived > after]
        if not pins:
            return False
        sid = ranked(pins, self.order)[0]
        pin = next(p for p in pins if p.session == sid)
        now = time.monotonic()
        self.scheduler.session_controller._close(sid)
        self.releases.append({"session": sid, "at": time.time(),
                              "held_s": round(max(0.0, now - pin.used), 6),
                              "reason": f"valve: {self.order}", "tokens": pin.tokens,
                              "why": why})
        del self.releases[:-MAX_KEPT]
        logger.warning("pin-release valve (%s): closed session %s (%d tokens) -- %s",
                       self.order, sid, pin.tokens, why)
        return True


def patch(module: ModuleType, valve: Valve) -> None:
    """Hook the valve into SGLang's scheduler module (and the session and batch classes)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.session.session_controller import Session, SessionController

    scheduler_cls = module.Scheduler
    init, prefill = scheduler_cls.__init__, scheduler_cls.get_new_batch_prefill
    internal, decode_mem = scheduler_cls.get_internal_state, ScheduleBatch.check_decode_mem
    finish, open_ = Session.finish_req, SessionController.open

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        valve.scheduler = self

    def get_new_batch_prefill(self: Any, running_batch: Any) -> Any:
        plan = prefill(self, running_batch)
        # Admission failed for memory (SGLang marks the batch full when a waiting request did
        # not fit, and an empty batch can free nothing): release a session and try again.
        while (plan.batch_to_run is None and self.waiting_queue and self.chunked_req is None
               and (plan.running_batch.is_empty() or plan.running_batch.batch_is_full)
               and valve.release_one("a waiting request could not be admitted", (
                   valve.arrival(self.waiting_queue[0]) if valve.order == "latest-program"
                   and not plan.running_batch.is_empty() else None))):
            # what a leaving request does in SGLang: the freed memory reopens admission
            plan.running_batch.batch_is_full = False
            plan = prefill(self, plan.running_batch)
        return plan

    def check_decode_mem(self: Any, *args: Any, **kwargs: Any) -> bool:
        ok = bool(decode_mem(self, *args, **kwargs))
        while not ok and valve.release_one("a running request could not grow"):
            ok = bool(decode_mem(self, *args, **kwargs))
        return ok

    def get_internal_state(self: Any, recv_req: Any) -> Any:
        out = internal(self, recv_req)
        out.internal_state[RELEASES_KEY] = list(valve.releases)
        out.internal_state["harness_pin_release"] = valve.order
        return out

    def finish_req(self: Any, req: Any) -> None:
        finish(self, req)
        self.harness_ended = time.monotonic()

    def open_session(self: Any, recv_req: Any) -> Any:
        out = open_(self, recv_req)
        if out.success and recv_req.session_id is not None:
            valve.arrived.setdefault(program(recv_req.session_id), time.monotonic())
        return out

    scheduler_cls.__init__ = __init__
    scheduler_cls.get_new_batch_prefill = get_new_batch_prefill
    scheduler_cls.get_internal_state = get_internal_state
    ScheduleBatch.check_decode_mem = check_decode_mem
    Session.finish_req = finish_req
    SessionController.open = open_session


class _Finder(importlib.abc.MetaPathFinder):
    """Patches SGLang's scheduler module as soon as it is imported."""

    def __init__(self, valve: Valve) -> None:
        self.valve = valve

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once: find the real module below this finder
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        valve = self.valve

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module, valve)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> Valve | None:
    """Install the valve when the server was started with one (`HARNESS_SGLANG_PIN_RELEASE`)."""
    order = os.environ.get(ENV)
    if not order:
        return None
    if order not in ORDERS:
        sys.stderr.write(f"harness: {ENV}={order!r} is none of {', '.join(ORDERS)}; "
                         "no pin-release valve\n")
        return None
    valve = Valve(order)
    if TARGET in sys.modules:
        patch(sys.modules[TARGET], valve)
    else:
        sys.meta_path.insert(0, _Finder(valve))
    return valve
