"""Per-pause KV control through SGLang's sessions, against a real SGLang server (CPU engine, tiny
random-weight Llama) with a small KV pool (1,024 tokens), so that memory pressure is real.

Keep pins the context in a streaming session: it survives filler traffic that evicts the radix
cache, and the resumed call's output log-probabilities equal a full recompute's (token ids alone
would match even on a corrupt KV with this model). Keep-evictable (the radix cache) is lost under
the same pressure, recompute reuses nothing, TTL closes the session at tau, held sessions block
the admission of other requests, and no session is left open after a run, also one stopped by
SIGTERM or Ctrl-C. The server's own view is its log: every open and close says how many
sessions remain (`(active=N)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.base import CompletionRequest, PausedKv
from harness.adapters.http import HttpClient, connect
from harness.adapters.launchers.sglang_server import (
    LocalSglangServer,
    SglangServerConfig,
    sglang_model,
    sglang_python,
)
from harness.adapters.sglang import SglangAdapter
from harness.errors import ServerError
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories
from tests.live.test_sglang_live import UNSUPPORTED, _started

pytestmark = [pytest.mark.live, pytest.mark.sglang]

POOL = 1024  # --max-total-tokens: five 308-token fillers overflow it
VOCAB = 2048


@contextlib.contextmanager
def small_pool(tmp_path_factory: pytest.TempPathFactory, folder: str,
               **config: Any) -> Iterator[LocalSglangServer]:
    """A local server with a POOL-token KV pool (and `config`'s settings), stopped and
    checked on exit."""
    try:
        python = sglang_python()
        model = sglang_model(python)
    except ServerError as exc:
        pytest.fail(f"{UNSUPPORTED}: {exc}")
    log = tmp_path_factory.mktemp(folder) / "server.log"
    with _started(SglangServerConfig(model=model, max_total_tokens=POOL, **config), log,
                  python) as server:
        yield server


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSglangServer]:
    with small_pool(tmp_path_factory, "sglang-sessions") as server:
        print(f"SGLang with streaming sessions started in {server.start_s:.1f} s")
        yield server


def ids(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(256, VOCAB - 256) for _ in range(n)]


def server_sessions(server: LocalSglangServer) -> tuple[int, list[str], list[str]]:
    """The server's own view, from its log: how many sessions are open, and which ids were
    opened and closed."""
    log = server.log_path.read_text(errors="replace")
    active = re.findall(r"Session (?:opened|closed): \S+ \(active=(\d+)\)", log)
    return (int(active[-1]) if active else 0, re.findall(r"Session opened: (\S+) ", log),
            re.findall(r"Session closed: (\S+) ", log))


def open_on_server(server: LocalSglangServer, timeout_s: float = 5.0) -> int:
    """How many sessions the server says are open once it has handled every close sent: it
    answers /close_session before its scheduler closes the session (and logs it)."""
    deadline = time.monotonic() + timeout_s
    while (active := server_sessions(server)[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return active


def run(server: LocalSglangServer, body: Callable[[SglangAdapter], Any],
        http_class: type[HttpClient] | None = None, salt: str = "live") -> Any:
    async def go() -> Any:
        async with connect(server.url, 16) as http:
            client = http if http_class is None else http_class(http.pool, http.timeouts)
            ad = SglangAdapter(client, salt=salt, vocab_size=VOCAB, session_timeout_s=120.0)
            await ad.server_info()
            return await body(ad)

    return asyncio.run(go())


def req(prompt: list[int], n: int, session: str | None = None, hold: bool = False,
        salt: str | None = None) -> CompletionRequest:
    return CompletionRequest(prompt, n, session=session, hold=hold, cache_salt=salt)


async def fillers(ad: SglangAdapter, seed: int, n: int = 5) -> None:
    """Plain traffic that fills the pool: each request under its own salt, nothing shared."""
    for i in range(n):
        r = await ad.complete(req(ids(seed + i, 308), 4, salt=f"filler-{seed}-{i}"),
                              lambda: None)
        assert r.status == "ok", r.error


def test_keep_survives_pressure_keep_evictable_and_recompute_do_not(
        small_server: LocalSglangServer) -> None:
    async def body(ad: SglangAdapter) -> dict[str, Any]:
        assert ad.capabilities.pause_actions == {"keep", "keep-evictable", "recompute"}
        out: dict[str, Any] = {}
        first = {t: ids(s, 200) for t, s in (("kept", 1), ("evictable", 2), ("dropped", 3))}
        done = {}
        for tid, prompt in first.items():
            r = await ad.complete(req(prompt, 8, tid, hold=tid != "evictable"), lambda: None)
            assert r.status == "ok" and r.cached_tokens == 0
            done[tid] = prompt + r.tokens + ids(10, 52)
        await ad.hold(PausedKv("kept", tokens=208), None)
        await ad.drop(PausedKv("dropped", tokens=208))
        await fillers(ad, 100)
        for tid, prompt in done.items():
            salt = "fresh-dropped" if tid == "dropped" else None  # as the core salts it
            r = await ad.complete(req(prompt, 8, tid, hold=tid != "evictable", salt=salt),
                                  lambda: None)
            assert r.status == "ok"
            out[tid] = (r.cached_tokens, len(prompt))
            await ad.release(PausedKv(tid))
        out["held"] = await ad.held()
        return out

    got = run(small_server, body, salt="pressure")
    print("tokens reused on resume after 5 x 308-token fillers:", got)
    assert got["kept"] == (207, 260)  # the whole context but its last generated token
    assert got["evictable"][0] == 0  # evicted by the fillers
    assert got["dropped"][0] == 0
    assert got["held"] == [] and open_on_server(small_server) == 0


def test_a_closed_session_keeps_only_its_first_prompt_and_unpin_republishes(
        small_server: LocalSglangServer) -> None:
    async def body(ad: SglangAdapter) -> dict[str, Any]:
        p1 = ids(20, 150)
        r1 = await ad.complete(req(p1, 8, "u", hold=True), lambda: None)
        p2 = p1 + r1.tokens + ids(21, 40)
        r2 = await ad.complete(req(p2, 8, "u", hold=True), lambda: None)
        context = p2 + r2.tokens
        await ad.drop(PausedKv("u"))  # a plain close: what stays cached?
        after_close = await ad.complete(req(context + ids(22, 4), 2), lambda: None)
        # again, now unpinned: the context is prefilled once more into the radix cache
        q1 = ids(30, 150)
        s1 = await ad.complete(req(q1, 8, "v", hold=True), lambda: None)
        q2 = q1 + s1.tokens + ids(31, 40)
        s2 = await ad.complete(req(q2, 8, "v", hold=True), lambda: None)
        t0 = time.monotonic()
        await ad.unpin(PausedKv("v"))
        unpin_s = time.monotonic() - t0
        republished = ad.republished_tokens
        resumed = await ad.complete(req(q2 + s2.tokens + ids(32, 4), 2, "v", hold=True),
                                    lambda: None)
        await ad.release(PausedKv("v"))
        await ad.release(PausedKv("u"))
        return {"after_close": (after_close.cached_tokens, len(context)),
                "republished": republished, "unpin_s": unpin_s,
                "after_unpin": (resumed.cached_tokens, len(q2) + 8), "held": await ad.held()}

    got = run(small_server, body, salt="closed")
    print("closed session and unpin:", got)
    assert got["after_close"][0] == 150  # the first prompt only: the rest was freed
    assert got["republished"] == 48 + 8  # what closing freed: 40 + 8 of turn 2, 8 of turn 1
    assert got["after_unpin"] == (206, 206)  # served whole from the radix cache
    assert got["held"] == [] and open_on_server(small_server) == 0


class LogprobClient(HttpClient):
    """Asks /generate for the output's log-probabilities and keeps each call's."""

    logprobs: list[list[float]] = []

    async def stream(self, path: str, body: dict[str, Any],
                     on_chunk: Callable[[dict[str, Any]], bool],
                     headers: dict[str, str] | None = None, progress: Any = None) -> str | None:
        last: list[list[float]] = [[]]

        def spy(chunk: dict[str, Any]) -> bool:
            entries = (chunk.get("meta_info") or {}).get("output_token_logprobs")
            if entries:  # SGLang streams the whole list so far
                last[0] = [float(e[0]) for e in entries]
            return on_chunk(chunk)

        error = await super().stream(path, {**body, "return_logprob": True}, spy, headers,
                                     progress)
        LogprobClient.logprobs.append(last[0])
        return error


def test_a_kept_context_gives_the_logprobs_of_a_full_recompute(
        small_server: LocalSglangServer) -> None:
    """The resumed call in the session (its KV reused, only the new ids prefilled) and the same
    context recomputed in full under a fresh salt give the same log-probabilities; one changed
    token of the context moves them (the check can fail)."""
    LogprobClient.logprobs = []

    async def body(ad: SglangAdapter) -> dict[str, Any]:
        p1 = ids(40, 150)
        r1 = await ad.complete(req(p1, 16, "lp", hold=True), lambda: None)
        p2 = p1 + r1.tokens + ids(41, 40)
        await fillers(ad, 200, 3)  # pressure between the turns: the session must hold
        kept = await ad.complete(req(p2, 16, "lp", hold=True), lambda: None)
        await ad.release(PausedKv("lp"))
        full = await ad.complete(req(p2, 16, salt="lp-fresh-1"), lambda: None)
        changed = list(p2)
        changed[-1] = changed[-1] + 1
        other = await ad.complete(req(changed, 16, salt="lp-fresh-2"), lambda: None)
        return {"kept": kept, "full": full, "other": other}

    got = run(small_server, body, LogprobClient, salt="logprob")
    kept_lp, full_lp, other_lp = LogprobClient.logprobs[-3:]
    assert got["kept"].cached_tokens == 150 + 16 - 1 and got["full"].cached_tokens == 0
    assert got["kept"].tokens == got["full"].tokens and len(kept_lp) == 16
    diff = max(abs(a - b) for a, b in zip(kept_lp, full_lp, strict=True))
    control = max(abs(a - b) for a, b in zip(kept_lp, other_lp, strict=True))
    print(f"logprobs: kept vs recompute max |diff| {diff:.3g}, one token changed {control:.3g}")
    assert diff <= 1e-5 and control > 1e-4


def test_held_sessions_block_admission(small_server: LocalSglangServer) -> None:
    async def body(ad: SglangAdapter) -> dict[str, float]:
        for i in range(3):  # 3 x 300 of the 1,024-token pool pinned
            r = await ad.complete(req(ids(50 + i, 292), 8, f"b{i}", hold=True), lambda: None)
            assert r.status == "ok"
        t0 = time.monotonic()
        plain = asyncio.create_task(ad.complete(req(ids(60, 300), 8, salt="plain"),
                                                lambda: None))
        await asyncio.sleep(4.0)
        blocked = not plain.done()
        t1 = time.monotonic()
        await ad.release(PausedKv("b0"))
        r = await plain
        t2 = time.monotonic()
        for i in (1, 2):
            await ad.release(PausedKv(f"b{i}"))
        assert r.status == "ok" and blocked
        return {"waited_s": t1 - t0, "ran_after_close_s": t2 - t1}

    got = run(small_server, body, salt="admission")
    print("admission behind three held sessions:", got)
    assert got["ran_after_close_s"] < 3.0
    assert open_on_server(small_server) == 0


def _ttl_plan() -> Plan:
    tid = "ttl-a"
    return Plan((TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 100, stable_seed(tid, 0), 4),
        ToolStep(1, "search", "remote_read", 1.5, 5.0, "ok", False, True),
        CallStep(2, 16, stable_seed(tid, 2), 4))),), (),
        Arrivals(mode="closed", concurrency=1), 0, Injection())


def test_ttl_closes_the_session_at_tau_then_recomputes(small_server: LocalSglangServer,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "ttl"
    manifest = RunManifest(run_id="live-ttl", policy="ttl")
    clock = RealClock()
    name = "live-ttl/ttl-a/1"
    seen: list[int] = []

    async def watch() -> None:  # when the server logs the session's close, on the run's clock
        while True:
            if f"Session closed: {name} " in small_server.log_path.read_text(errors="replace"):
                seen.append(clock.now_ns())
                return
            await asyncio.sleep(0.02)

    async def go() -> None:
        async with connect(small_server.url, 8) as http:
            ad = SglangAdapter(http, salt=manifest.run_id, vocab_size=VOCAB)
            watcher = asyncio.create_task(watch())
            ttl = make_policy("ttl", {"tau": "0.3", "after": "recompute"})
            await replay(ad, clock, _ttl_plan(), ttl, out, manifest, FALLBACK_RATES,
                         ReplaySettings(0.1))
            await asyncio.wait_for(watcher, 2.0)

    asyncio.run(go())
    rec = read_records(out)
    t0 = int(rec[rec.event == "tool_start"].t_ns.iloc[0])
    tool_end = int(rec[rec.event == "tool_end"].t_ns.iloc[0])
    closed_after_s = (seen[0] - t0) / 1e9
    print(f"ttl: the server logged the close {closed_after_s:.3f} s into the pause (tau 0.3)")
    assert 0.3 <= closed_after_s < 0.8 and seen[0] < tool_end
    resumed = rec[(rec.event == "call_end") & (rec.step == 2)]
    assert resumed.cached_tokens.iloc[0] == 0  # a fresh extra_key after the close
    erase = rec[rec.event == "erase"]
    assert erase.reason.str.contains("ttl-expired").all() and len(erase) == 1
    run_json = manifest.to_dict()
    assert run_json["cleanup"]["held_left"] == []
    active = open_on_server(small_server)
    _, opened, closed = server_sessions(small_server)
    ours = [s for s in opened if s.startswith("live-ttl/")]
    assert ours == [name, "live-ttl/ttl-a/2"] and set(ours) <= set(closed) and active == 0


def _long_pause_trace(path: Path) -> Path:
    rows = []
    for tid in ("sig-a", "sig-b", "sig-c"):
        for row in ({"step": 0, "kind": "llm", "input_tokens": 100, "output_tokens": 4},
                    {"step": 1, "kind": "tool", "tool_class": "remote_read",
                     "tool_name": "wait", "latency_s": 60.0, "deadline_s": 120.0,
                     "outcome": "ok", "mutating": False},
                    {"step": 2, "kind": "llm", "input_tokens": 8, "output_tokens": 4}):
            rows.append({**row, "trajectory_id": tid})
    return write_trajectories(steps_table(rows, dict(SYNTHETIC_DEFAULTS)), path,
                              Provenance("test"))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_run_leaves_no_session_open(small_server: LocalSglangServer, tmp_path: Path,
                                              signum: int, code: int) -> None:
    trace = _long_pause_trace(tmp_path / "t.parquet")
    out = tmp_path / "run"
    before = len(server_sessions(small_server)[1])
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--runtime", "sglang",
                             "--url", small_server.url, "--trace", str(trace), "--policy",
                             "keep", "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(server_sessions(small_server)[1]) < before + 3:  # all three paused, pinned
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the run's sessions never opened"
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signum)
    proc.wait(timeout=30)
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == code, err
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["status"] == "interrupted"
    assert run_json["cleanup"]["held_left"] == [], run_json["cleanup"]
    active = open_on_server(small_server)
    _, opened, closed = server_sessions(small_server)
    ours = [s for s in opened if s.startswith(run_json["run_id"] + "/")]
    assert len(ours) == 3 and set(ours) <= set(closed) and active == 0

