"""SGLang's side of the pause contract under memory pressure, without a server: session timeouts
sized from the plan, the valve's orders (a copy of the harness's), what /server_info says of
the valve's releases, and the adapter's hint reports (keep held, clipped by the valve or by a
timeout, recompute accepted once its close is confirmed), against the fake session front."""

from __future__ import annotations

import random
from typing import Any

import pytest

from harness.adapters.base import CompletionRequest, HintReport, PausedKv
from harness.adapters.launchers.sglang_server import (
    VALVE_ENV,
    LocalSglangServer,
    SglangServerConfig,
)
from harness.adapters.launchers.sglang_site import harness_pin_valve as valve
from harness.adapters.sglang import SglangAdapter
from harness.adapters.sglang_sessions import (
    CALL_MARGIN_S,
    RELEASES_KEY,
    SESSION_TIMEOUT_S,
    session_timeout,
    valve_releases,
)
from harness.policies.pin_release import PIN_RELEASE_ORDERS, PinView, release_order
from tests.fakes.sglang_sessions import SessionFront
from tests.unit.test_sglang_sessions import _sent, with_front


def test_a_session_timeout_is_the_longest_planned_pause_plus_the_call_margin() -> None:
    assert session_timeout(30.0) == 30.0 + CALL_MARGIN_S
    assert session_timeout(0.0) == CALL_MARGIN_S
    assert session_timeout(None) == SESSION_TIMEOUT_S  # plan not known: the cap
    assert session_timeout(10_000.0) == SESSION_TIMEOUT_S  # longer than the cap: clipped
    assert session_timeout(30.0, cap_s=60.0) == 60.0
    assert session_timeout(float("nan")) == SESSION_TIMEOUT_S


def test_the_valve_orders_agree_with_the_harness() -> None:
    assert valve.ORDERS == PIN_RELEASE_ORDERS
    rnd = random.Random(7)
    for _ in range(200):
        pins = [valve.Pin(f"run/t{i}/{rnd.randrange(9)}", rnd.choice([0.0, 1.0, 2.0]),
                          rnd.choice([0.0, 1.0, 2.0]), rnd.choice([10, 20, 30]))
                for i in range(6)]
        views = [PinView(p.session, p.arrived, p.used, p.tokens) for p in pins]
        for order in PIN_RELEASE_ORDERS:
            assert valve.ranked(pins, order) == release_order(views, order)
    assert valve.program("run/t1/3") == "run/t1" and valve.program("plain") == "plain"


class _Kv:
    holds_kv = True

    def __init__(self, tokens: int) -> None:
        self.kv_allocated_len = tokens


class _Session:
    streaming, _inflight, close_on_finish = True, False, False

    def __init__(self, ended: float) -> None:
        self.harness_ended = self.last_active_time = ended


class _Scheduler:
    """What the valve reads of SGLang's scheduler: its sessions and their KV."""

    def __init__(self, sessions: dict[str, tuple[float, int]]) -> None:
        self.closed: list[str] = []
        self.session_controller = self
        self.sessions = {sid: _Session(ended) for sid, (ended, _) in sessions.items()}
        self._kv = {sid: _Kv(tokens) for sid, (_, tokens) in sessions.items()}
        self.tree_cache = self

    def session_records(self) -> dict[str, _Kv]:
        return self._kv

    def _close(self, sid: str) -> None:
        self.closed.append(sid)
        del self.sessions[sid], self._kv[sid]


class _Req:
    def __init__(self, session_id: str | None) -> None:
        self.session_id = session_id


def test_latest_program_closes_only_later_programs_sessions_for_a_waiting_request() -> None:
    v = valve.Valve("latest-program")
    v.scheduler = _Scheduler({"r/a/1": (1.0, 10), "r/b/1": (2.0, 20), "r/c/1": (3.0, 30)})
    v.arrived = {"r/a": 100.0, "r/b": 100.5, "r/c": 100.7}
    after_b = v.arrival(_Req("r/b/2"))
    assert after_b == 100.5 and v.arrival(_Req(None)) > 100.7  # no session: a newcomer
    assert v.release_one("wait", after_b) and v.scheduler.closed == ["r/c/1"]
    assert not v.release_one("wait", after_b)  # a's is earlier than b's program: kept
    assert v.release_one("nothing runs") and v.scheduler.closed == ["r/c/1", "r/b/1"]
    assert [r["session"] for r in v.releases] == ["r/c/1", "r/b/1"]


def test_the_launcher_configures_the_valve(tmp_path: Any) -> None:
    on = LocalSglangServer(SglangServerConfig(model=tmp_path, pin_release="lru"),
                           tmp_path / "log", python=tmp_path / "python")
    assert on.env[VALVE_ENV] == "lru" and "sglang_site" in on.env["PYTHONPATH"]
    off = LocalSglangServer(SglangServerConfig(model=tmp_path), tmp_path / "log",
                            python=tmp_path / "python")
    assert VALVE_ENV not in off.env


class _Info:
    def __init__(self, info: Any) -> None:
        self.info = info

    async def get_json(self, *paths: str) -> Any:
        if isinstance(self.info, Exception):
            raise self.info
        return self.info


async def test_valve_releases_are_read_from_server_info() -> None:
    rel = {"session": "run/a/1", "at": 1.0, "held_s": 2.5, "reason": "valve: lru"}
    got = await valve_releases(_Info({"internal_states": [{RELEASES_KEY: [rel]}]}))  # type: ignore[arg-type]
    assert got == {"run/a/1": rel}
    assert await valve_releases(_Info({"internal_states": [{}]})) is None  # type: ignore[arg-type]
    assert await valve_releases(_Info(TimeoutError("x"))) is None  # type: ignore[arg-type]


def _req(prompt: list[int], tid: str, hold_s: float | None = 30.0) -> CompletionRequest:
    return CompletionRequest(prompt, 4, session=tid, hold=True, hold_s=hold_s)


def _by_step(reports: list[HintReport]) -> dict[int, HintReport]:
    return {r.step: r for r in reports}


def test_hint_reports_of_keep_and_recompute() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        assert ad.capabilities.hint_reports
        p = list(range(400, 500))
        r = await ad.complete(_req(p, "t1", hold_s=30.0), lambda: None)
        assert r.status == "ok"
        # the session's timeout: the longest planned pause plus the call's margin, capped
        # (the adapter's cap here is 60 s)
        assert _sent(front, "/open_session")[0]["timeout"] == min(60.0, 30.0 + CALL_MARGIN_S)
        await ad.hold(PausedKv("t1", step=1), None)
        assert ad.hint_reports() == []  # nothing known before the resume
        p2 = p + r.tokens + list(range(600, 610))
        assert (await ad.complete(_req(p2, "t1"), lambda: None)).status == "ok"
        [kept] = ad.hint_reports()
        assert (kept.session, kept.step, kept.outcome) == ("t1", 1, "accepted")
        await ad.drop(PausedKv("t1", step=3))  # recompute: accepted once closed
        [dropped] = ad.hint_reports()
        assert (dropped.step, dropped.outcome) == (3, "accepted")
        await ad.hold(PausedKv("t2", step=5), None)  # nothing pinned: rejected
        [rejected] = ad.hint_reports()
        assert (rejected.step, rejected.outcome) == (5, "rejected")

    with_front(body)


def test_a_session_the_server_closed_clips_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    releases: dict[str, dict[str, Any]] = {}

    async def fake_releases(http: Any) -> dict[str, dict[str, Any]] | None:
        return releases

    monkeypatch.setattr("harness.adapters.sglang.valve_releases", fake_releases)

    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        contexts = {}
        for tid in ("ta", "tb"):
            p = [400 + i for i in range(50)] if tid == "ta" else [700 + i for i in range(50)]
            r = await ad.complete(_req(p, tid, hold_s=None), lambda: None)
            contexts[tid] = p + r.tokens + [900, 901]
            await ad.hold(PausedKv(tid, step=1), None)
        # the server closes both: ta by its valve, tb by its timeout (the cap, no plan known)
        [a_name, b_name] = sorted(front.sessions)
        releases[a_name] = {"session": a_name, "at": 5.0, "held_s": 1.25,
                            "reason": "valve: latest-program", "tokens": 56,
                            "why": "a waiting request could not be admitted"}
        front.sessions.clear()
        for tid in ("ta", "tb"):
            r = await ad.complete(_req(contexts[tid], tid), lambda: None)
            assert r.status == "ok"  # served again in a new session
        got = {r.session: r for r in ad.hint_reports()}
        assert (got["ta"].outcome, got["ta"].reason, got["ta"].held_s) == (
            "clipped", "valve: latest-program", 1.25)
        assert (got["tb"].outcome, got["tb"].reason, got["tb"].held_s) == (
            "clipped", "session timeout", 60.0)

    with_front(body)


def test_a_keep_cut_off_by_its_tool_s_deadline_is_settled_at_the_release(
        monkeypatch: pytest.MonkeyPatch) -> None:
    releases: dict[str, dict[str, Any]] = {}

    async def fake_releases(http: Any) -> dict[str, dict[str, Any]] | None:
        return releases

    monkeypatch.setattr("harness.adapters.sglang.valve_releases", fake_releases)

    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        for tid, first in (("ta", 400), ("tb", 700)):
            await ad.complete(_req(list(range(first, first + 50)), tid, hold_s=5.0),
                              lambda: None)
            await ad.hold(PausedKv(tid, step=1), None)
        [a_name, _] = sorted(front.sessions)
        releases[a_name] = {"session": a_name, "held_s": 0.5, "reason": "valve: lru"}
        for tid in ("ta", "tb"):  # neither resumes: their tools timed out
            await ad.release(PausedKv(tid, step=None))
        got = {r.session: (r.step, r.outcome, r.reason) for r in ad.hint_reports()}
        assert got == {"ta": (1, "clipped", "valve: lru"),
                       "tb": (1, "accepted", "held until the harness closed the session")}

    with_front(body)
