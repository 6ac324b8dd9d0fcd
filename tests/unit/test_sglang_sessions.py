"""The SGLang adapter's pause actions through server-side sessions, against the fake SGLang
server with a session front (tests.fakes.sglang_sessions) over real HTTP: the request bodies
(only the new ids in a streaming session, session_params, open and close calls), what each pause
action sends, and whole replays through the executor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.base import CompletionRequest, PausedKv, Unsupported
from harness.adapters.http import connect
from harness.adapters.sglang import SglangAdapter
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, make_plan
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from tests.fakes.sglang_server import STATE, FakeSglangConfig, make_app
from tests.fakes.sglang_sessions import FRONT, SessionFront, make_front

Body = Callable[[SglangAdapter, SessionFront], Coroutine[Any, Any, None]]


def with_front(body: Body, streaming: bool = True, radix: bool = False,
               cfg: FakeSglangConfig | None = None) -> None:
    async def go() -> None:
        base = TestServer(make_app(cfg or FakeSglangConfig()))
        await base.start_server()
        front_app = make_front(str(base.make_url("")).rstrip("/"), base.app[STATE], streaming,
                               radix)
        front = TestServer(front_app)
        await front.start_server()
        try:
            async with connect(str(front.make_url("")), 8) as http:
                adapter = SglangAdapter(http, salt="run-1", vocab_size=2048,
                                        session_timeout_s=60.0)
                await adapter.server_info()
                await body(adapter, front_app[FRONT])
        finally:
            await front.close()
            await base.close()

    asyncio.run(go())


def _sent(front: SessionFront, path: str) -> list[dict[str, Any]]:
    return [b for p, b in front.requests if p == path]


def test_capabilities_follow_the_server() -> None:
    async def sessions(ad: SglangAdapter, _: SessionFront) -> None:
        assert ad.capabilities.pause_actions == {"keep", "keep-evictable", "recompute"}
        assert not ad.capabilities.dump_files

    async def plain(ad: SglangAdapter, _: SessionFront) -> None:
        # without streaming sessions nothing can be pinned: keep is not claimed
        assert ad.capabilities.pause_actions == {"keep-evictable", "recompute"}

    with_front(sessions)
    with_front(plain, streaming=False)
    with_front(plain, streaming=False, radix=True)


def test_held_calls_send_only_the_new_ids_in_one_session() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(400, 500))
        r1 = await ad.complete(CompletionRequest(p, 4, session="t1", hold=True), lambda: None)
        assert r1.status == "ok" and (r1.cached_tokens, r1.prompt_n) == (0, 100)
        opened = _sent(front, "/open_session")
        assert opened == [{"capacity_of_str_len": 0, "streaming": True, "timeout": 60.0,
                           "session_id": "run-1/t1/1"}]
        first = _sent(front, "/generate")[-1]
        assert first["input_ids"] == p and first["session_params"] == {"id": "run-1/t1/1"}
        assert first["extra_key"] == "run-1"
        p2 = p + r1.tokens + [700] * 16
        r2 = await ad.complete(CompletionRequest(p2, 4, session="t1", hold=True), lambda: None)
        second = _sent(front, "/generate")[-1]
        assert second["input_ids"] == [700] * 16  # the server appends what it holds itself
        assert second["session_params"] == {"id": "run-1/t1/1"}
        # the server counts the whole context: all of it reused but the last generated token
        assert (r2.cached_tokens, r2.prompt_n) == (103, 17)
        assert len(_sent(front, "/open_session")) == 1 and await ad.held() == ["run-1/t1/1"]
        await ad.hold(PausedKv("t1", tokens=len(p2) + 4), 5.0)  # stays open: nothing sent
        assert len(front.requests) == 3  # one open, two calls
        await ad.release(PausedKv("t1"))
        assert _sent(front, "/close_session") == [{"session_id": "run-1/t1/1"}]
        assert await ad.held() == [] and front.sessions == {}

    with_front(body)


def test_a_cut_context_or_a_fresh_salt_reopens_the_session() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(300, 340))
        r1 = await ad.complete(CompletionRequest(p, 2, session="t", hold=True), lambda: None)
        cut = p[:20] + [900] * 5  # a keep_tokens cut: the prompt no longer extends the session
        await ad.complete(CompletionRequest(cut, 2, session="t", hold=True), lambda: None)
        assert front.closed == ["run-1/t/1"]
        assert _sent(front, "/generate")[-1]["input_ids"] == cut
        assert _sent(front, "/generate")[-1]["session_params"] == {"id": "run-1/t/2"}
        salted = cut + [5] * 3 + r1.tokens
        res = await ad.complete(CompletionRequest(salted, 2, session="t", hold=True,
                                                  cache_salt="run-1-t-3"), lambda: None)
        assert front.closed == ["run-1/t/1", "run-1/t/2"] and res.cached_tokens == 0
        sent = _sent(front, "/generate")[-1]
        assert sent["input_ids"] == salted and sent["extra_key"] == "run-1-t-3"
        await ad.release(PausedKv("t"))
        assert await ad.held() == []

    with_front(body)


def test_a_session_the_server_closed_is_reopened_with_the_whole_context() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(300, 340))
        r1 = await ad.complete(CompletionRequest(p, 2, session="t", hold=True), lambda: None)
        front.sessions.clear()  # its timeout reaped it on the server
        chunks: list[int] = []
        p2 = p + r1.tokens + [800] * 4
        r2 = await ad.complete(CompletionRequest(p2, 2, session="t", hold=True),
                               lambda: chunks.append(1))
        assert r2.status == "ok" and len(r2.tokens) == 2 and chunks == [1, 1]
        refused, retried = _sent(front, "/generate")[-2:]
        assert refused["input_ids"] == [800] * 4 and retried["input_ids"] == p2
        assert retried["session_params"] == {"id": "run-1/t/2"}
        assert await ad.held() == ["run-1/t/2"]
        await ad.release(PausedKv("t"))

    with_front(body)


def test_a_failed_turn_closes_its_session() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 3, session="t", hold=True),
                              lambda: None)
        assert r.status == "error" and "aborted by the server" in (r.error or "")
        assert front.closed == ["run-1/t/1"] and await ad.held() == []

    with_front(body, cfg=FakeSglangConfig(abort_generate_after=0))

    async def hung_up(ad: SglangAdapter, front: SessionFront) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 50, session="t", hold=True,
                                                abort_after_first_token=True), lambda: None)
        assert r.status == "aborted" and front.closed == ["run-1/t/1"]

    with_front(hung_up, cfg=FakeSglangConfig(decode_s_per_token=0.005))


def test_pause_actions() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(300, 400))
        for tid in ("a", "b", "c"):
            r = await ad.complete(CompletionRequest(p, 4, session=tid, hold=True), lambda: None)
            p2 = p + r.tokens + [600 + ord(tid)] * 20
            await ad.complete(CompletionRequest(p2, 4, session=tid, hold=True), lambda: None)
        assert await ad.held() == ["run-1/a/1", "run-1/b/2", "run-1/c/3"]
        with pytest.raises(Unsupported, match="HiCache"):
            await ad.offload(PausedKv("a", tokens=128), "a.bin")
        assert await ad.restore(PausedKv("a"), "a.bin") is None
        assert await ad.delete_dump("a.bin") is False
        # keep-evictable: closing frees all but the first prompt, so the rest is prefilled
        # again by a request that generates nothing, and the context sits in the radix cache
        n = len(_sent(front, "/generate"))
        prefilled = await ad.unpin(PausedKv("b", tokens=128))
        assert front.closed == ["run-1/b/2"]
        assert prefilled == ad.republished_tokens > 0
        republished = _sent(front, "/generate")[n:]
        assert len(republished) == 1 and "session_params" not in republished[0]
        assert republished[0]["sampling_params"]["max_new_tokens"] == 0
        assert republished[0]["stream"] is False and republished[0]["extra_key"] == "run-1"
        assert len(republished[0]["input_ids"]) == 128 and ad.republished_tokens > 0
        resumed = await ad.complete(CompletionRequest(republished[0]["input_ids"] + [5] * 8, 2,
                                                      session="b", hold=True), lambda: None)
        assert resumed.cached_tokens == 128  # served from the radix cache by a new session
        # recompute: the session is closed, nothing else sent
        n = len(front.requests)
        await ad.drop(PausedKv("c"))
        assert front.requests[n:] == [("/close_session", {"session_id": "run-1/c/3"})]
        assert await ad.unpin(PausedKv("never-held")) == 0  # nothing pinned: nothing sent
        await ad.drop(PausedKv("never-held"))
        assert len(front.requests) == n + 1
        for tid in ("a", "b"):
            await ad.release(PausedKv(tid))
        assert await ad.held() == [] and front.sessions == {}

    with_front(body)


def test_a_call_not_held_closes_the_session_first() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(300, 350))
        r = await ad.complete(CompletionRequest(p, 2, session="t", hold=True), lambda: None)
        p2 = p + r.tokens + [9] * 3
        r2 = await ad.complete(CompletionRequest(p2, 2, session="t"), lambda: None)
        assert front.closed == ["run-1/t/1"]
        sent = _sent(front, "/generate")[-1]
        assert sent["input_ids"] == p2 and "session_params" not in sent
        assert r2.cached_tokens == 50  # the session's first prompt stayed in the radix cache
        assert await ad.held() == []

    with_front(body)


def test_radix_sessions_tag_plain_calls_until_released() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        p = list(range(300, 350))
        await ad.complete(CompletionRequest(p, 2, session="t"), lambda: None)
        await ad.complete(CompletionRequest(p + [7] * 4, 2, session="t"), lambda: None)
        tags = [b.get("session_id") for b in _sent(front, "/generate")]
        assert tags == ["run-1/t/r1", "run-1/t/r1"] and _sent(front, "/open_session") == []
        await ad.unpin(PausedKv("t"))  # soft retention stays through the pause
        assert await ad.held() == ["run-1/t/r1"]
        await ad.release(PausedKv("t"))
        assert _sent(front, "/close_session") == [{"session_id": "run-1/t/r1"}]
        assert await ad.held() == []

    with_front(body, streaming=False, radix=True)


def test_a_session_that_cannot_open_fails_the_call() -> None:
    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        front.streaming_sessions = False  # the server stopped accepting them
        r = await ad.complete(CompletionRequest([300] * 10, 2, session="t", hold=True),
                              lambda: None)
        assert r.status == "error" and "open_session: HTTP 400" in (r.error or "")
        assert _sent(front, "/generate") == [] and await ad.held() == []

    with_front(body)


@pytest.mark.parametrize("policy", ["keep", "keep-evictable", "recompute", "swap", "ttl",
                                    "threshold"])
def test_replay_through_sessions(tmp_path: Path, policy: str) -> None:
    """Whole runs through the executor: every session opened is closed by the run's end."""
    steps = generate(load_profile("bench-small"), 5, 1)
    plan = make_plan(steps, Injection(never_return_fraction=0.2, default_deadline_s=0.2),
                     Arrivals(concurrency=3, time_scale=0.02), 1)
    out = tmp_path / "out"
    manifest = RunManifest(run_id="http", policy=policy)
    args = {"tau": "0.01", "after": "recompute"} if policy == "ttl" else None

    async def body(ad: SglangAdapter, front: SessionFront) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy, args), out, manifest,
                     FALLBACK_RATES, ReplaySettings(0.02))
        assert front.sessions == {} and await ad.held() == []
        opened = {b["session_id"] for b in _sent(front, "/open_session")}
        assert set(front.closed) == opened
        if policy in ("keep-evictable", "recompute"):
            assert not opened  # their calls are never held
        else:
            assert opened

    with_front(body)
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["status"] == "finished" and run["cleanup"]["held_left"] == []
    assert run["outcome"]["completed"] + run["outcome"]["cancelled"] == 5
    resumed = rec[(rec.event == "call_end") & (rec.step > 0)]
    assert not resumed.empty and (resumed.status == "ok").all()
    if policy in ("keep", "keep-evictable", "swap"):
        assert (resumed.cached_tokens > 0).all()
    if policy == "recompute":
        assert (resumed.cached_tokens == 0).all()
    if policy == "swap":
        decisions = rec[rec.event == "pause_decision"]
        assert (decisions.status == "unsupported").all()
    assert read_json(out / "summary.json")["cache_mismatches"] == 0
