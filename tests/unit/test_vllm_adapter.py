"""The vLLM adapter against a fake vLLM server over real HTTP (fast, deterministic); the pause
connector's control channel is answered in front of it by the connector's own bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.adapters.base import (
    CompletionRequest,
    PausedKv,
    ServerOptions,
    SlotIO,
    Unsupported,
)
from harness.adapters.http import connect
from harness.adapters.launchers.vllm_connector.harness_pause_connector.book import (
    Book,
    Limits,
)
from harness.adapters.launchers.vllm_server import (
    CONNECTOR_DIR,
    RUNTIME,
    SERVER_POLICIES,
    SITE_DIR,
    LocalVllmServer,
    VllmServerConfig,
    realisation,
    server_policy,
)
from harness.adapters.models import local_vocab
from harness.adapters.vllm import (
    CONNECTOR_MODULE,
    TTL_GRACE_S,
    PauseControlError,
    VllmAdapter,
    session_key,
)
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, make_plan
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_records, read_server_metrics
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from tests.fakes.vllm_server import STATE, FakeVllmConfig, make_app
from tests.unit.test_vllm_pause_book import FakeBlock, FakePool

Body = Callable[[VllmAdapter, Any], Coroutine[Any, Any, None]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BLOCK = 32


class FakeConnector:
    """The connector's side of the protocol in front of the fake server: control requests are
    answered by the real Book on a counting pool (the worker's copy reported at once), and a
    session's call pins its prompt's full blocks when it ends."""

    def __init__(self, host_cap_bytes: int = 1 << 20) -> None:
        self.pool = FakePool()
        self.book = Book(Limits(BLOCK, 16384, host_cap_bytes, 900.0), self.pool,
                         time.monotonic)
        self.controls: list[dict[str, Any]] = []  # the control requests' bodies
        self.fail_status: int | None = None  # answer control requests with this HTTP status
        self._ids = itertools.count(1)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or request.path != "/v1/completions":
            return await handler(request)
        body = await request.json()
        params = (body.get("kv_transfer_params") or {}).get("harness_pause")
        if params is not None and "op" in params:
            self.controls.append(body)
            if self.fail_status is not None:
                return web.json_response({"error": "down"}, status=self.fail_status)
            ans = self.book.control(params)
            orders = self.book.take_orders()
            self.book.worker_report({cid: {"bytes": len(ids) * 16384, "ms": 0.25,
                                           "error": None} for cid, ids in orders.saves}, None)
            return web.json_response({"id": "ctl", "choices": [{"text": "ab"}],
                                      "kv_transfer_params": {"harness_pause":
                                                             self.book.answer(ans)}})
        response = await handler(request)
        if params is not None:
            prompt = [int(t) for t in body["prompt"]]
            blocks = [FakeBlock(next(self._ids)) for _ in range(len(prompt) // BLOCK)]
            self.book.finished(params["session"], bool(params.get("hold")), blocks, prompt,
                               body.get("cache_salt"))
        return response


def with_server(cfg: FakeVllmConfig, body: Body, salt: str | None = "run-1",
                vocab: int | None = 2048, connector: FakeConnector | None = None) -> None:
    async def go() -> None:
        app = make_app(cfg)
        if connector is not None:
            app.middlewares.append(connector.middleware)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                adapter = VllmAdapter(http, salt=salt, vocab_size=vocab)
                await body(adapter, app[STATE])
        finally:
            await server.close()

    asyncio.run(go())


def test_info_complete_and_block_granular_reuse() -> None:
    async def body(ad: VllmAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert (info.runtime, info.model, info.server_version) == ("vllm", "tiny", "0.0-fake")
        assert (info.slots, info.ctx_per_slot, info.vocab_size) == (None, 4096, 2048)
        assert info.extra["cache_config"]["block_size"] == "32"
        assert info.extra["kv_transfer_config"] is None
        assert info.extra["pause_connector"] is None  # the plain fake runs no connector
        assert not ad.capabilities.harness_slots and not ad.capabilities.dump_files
        assert ad.capabilities.pause_actions == {"keep-evictable", "recompute"}
        chunks: list[int] = []  # one call per streamed chunk of tokens
        p = list(range(400, 500))
        r1 = await ad.complete(CompletionRequest(p, 4), lambda: chunks.append(1))
        assert r1.status == "ok" and len(r1.tokens) == 4 and chunks == [1] * 4
        assert (r1.cached_tokens, r1.prompt_n, r1.prompt_ms, r1.decode_ms) == (0, 100, 2.5, 4.0)
        assert r1.queue_ms == 0.1  # the engine's queue, as its per-request metrics say
        r2 = await ad.complete(CompletionRequest(p + r1.tokens + [700] * 16, 4, session="t",
                                                 hold=True), lambda: None)
        assert (r2.cached_tokens, r2.prompt_n) == (96, 24)  # three full 32-token blocks
        sent = state.requests[-1]
        assert sent["prompt"][:3] == [400, 401, 402] and sent["max_tokens"] == 4
        assert sent["ignore_eos"] and sent["stream"] and sent["return_token_ids"]
        assert sent["stream_options"] == {"include_usage": True}
        assert sent["cache_salt"] == "run-1" and sent["model"] == "tiny"
        assert "kv_transfer_params" not in sent  # nothing to name without the connector

    with_server(FakeVllmConfig(), body)


def test_a_fresh_salt_forbids_reuse() -> None:
    async def body(ad: VllmAdapter, state: Any) -> None:
        p = list(range(300, 400))
        r1 = await ad.complete(CompletionRequest(p, 2), lambda: None)
        again = p + r1.tokens + [5] * 40
        fresh = await ad.complete(CompletionRequest(again, 2, cache_salt="run-1-t-1"),
                                  lambda: None)
        assert fresh.cached_tokens == 0 and state.requests[-1]["cache_salt"] == "run-1-t-1"
        kept = await ad.complete(CompletionRequest(again, 2), lambda: None)
        assert kept.cached_tokens == 96

    with_server(FakeVllmConfig(), body)


def test_no_salt_sends_none_and_vocab_defaults() -> None:
    async def body(ad: VllmAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert info.vocab_size == 32000 and info.extra["vocab_from"] == "default"
        await ad.complete(CompletionRequest([300] * 10, 1), lambda: None)
        assert "cache_salt" not in state.requests[-1]

    with_server(FakeVllmConfig(), body, salt=None, vocab=None)


def test_errors_become_results() -> None:
    async def body(ad: VllmAdapter, _: Any) -> None:
        oov = await ad.complete(CompletionRequest([5000] * 10, 2), lambda: None)
        assert oov.status == "error" and "out of vocabulary" in (oov.error or "")
        too_long = await ad.complete(CompletionRequest([300] * 4095, 2), lambda: None)
        assert too_long.status == "error" and "HTTP 400" in (too_long.error or "")

    with_server(FakeVllmConfig(), body)


def test_injected_failure_and_dead_server() -> None:
    async def body(ad: VllmAdapter, _: Any) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 2), lambda: None)
        assert r.status == "error"

    with_server(FakeVllmConfig(fail_completion_after=0), body)

    async def dead() -> None:
        async with connect("http://127.0.0.1:9", 8) as http:
            ad = VllmAdapter(http, vocab_size=2048)
            r = await ad.complete(CompletionRequest([300] * 4, 1), lambda: None)
            assert r.status == "error" and "Connect" in (r.error or "")

    asyncio.run(dead())


def test_abort_after_first_token() -> None:
    async def body(ad: VllmAdapter, state: Any) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 50, abort_after_first_token=True),
                              lambda: None)
        assert r.status == "aborted" and len(r.tokens) == 1
        await asyncio.sleep(0.05)
        assert state.running == 0

    with_server(FakeVllmConfig(decode_s_per_token=0.002), body)


def test_without_the_connector_keep_and_swap_are_unsupported() -> None:
    async def body(ad: VllmAdapter, _: Any) -> None:
        await ad.server_info()
        kv = PausedKv("t", None, 100)
        with pytest.raises(Unsupported, match="no harness KV connector"):
            await ad.hold(kv, None)
        with pytest.raises(Unsupported, match="no harness KV connector"):
            await ad.offload(kv, "d")
        with pytest.raises(Unsupported):
            await ad.complete(CompletionRequest([300], 1, slot=0), lambda: None)
        # keep-evictable and recompute need nothing of the server but its cache and a salt
        await ad.unpin(kv)
        await ad.drop(kv)
        await ad.release(kv)
        assert await ad.restore(kv, "d") is None
        assert await ad.held() == [] and await ad.release_all() == 0
        assert await ad.delete_dump("x.bin") is False
        names = {name for _, name, _, _ in await ad.scrape()}
        assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                "vllm:time_to_first_token_seconds_count"} <= names
        assert not any(n.endswith("_bucket") or not n.startswith("vllm:") for n in names)
        assert await ad.slots_idle() is True
        assert await ad.reset_prefix_cache() is True

    with_server(FakeVllmConfig(), body)


def test_the_connector_is_detected_and_calls_name_their_session() -> None:
    conn = FakeConnector()

    async def body(ad: VllmAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert ad.capabilities.pause_actions == {"keep", "keep-evictable", "swap", "recompute"}
        assert info.extra["pause_connector"]["connector"] == "HarnessPauseConnector"
        assert info.extra["pause_connector"]["block_size"] == BLOCK
        status = conn.controls[0]
        assert status["prompt"] == [0] and status["max_tokens"] == 2
        assert status["stream"] is False and status["model"] == "tiny"
        assert status["kv_transfer_params"] == {"harness_pause": {"op": "status",
                                                                  "prefix": "run-1/"}}
        await ad.complete(CompletionRequest([300] * 70, 2, session="a/1", hold=True),
                          lambda: None)
        assert state.requests[-1]["kv_transfer_params"] == {
            "harness_pause": {"session": "run-1/a/1", "hold": True}}
        await ad.complete(CompletionRequest([300] * 70, 2), lambda: None)  # a bystander
        assert "kv_transfer_params" not in state.requests[-1]
        assert await ad.held() == ["pinned run-1/a/1 (64 tokens)"]

    with_server(FakeVllmConfig(), body, connector=conn)


def test_hold_unpin_drop_release_through_the_connector() -> None:
    conn = FakeConnector()

    async def body(ad: VllmAdapter, _: Any) -> None:
        await ad.server_info()
        for tid in ("a", "b", "c"):
            await ad.complete(CompletionRequest([300] * 100, 2, session=tid, hold=True),
                              lambda: None)
        await ad.hold(PausedKv("a", None, 102), 5.0)
        sent = conn.controls[-1]["kv_transfer_params"]["harness_pause"]
        assert sent == {"op": "hold", "session": "run-1/a", "ttl_s": 5.0 + TTL_GRACE_S}
        assert conn.book.pins["run-1/a"].expires_at - time.monotonic() > 60
        await ad.hold(PausedKv("b", None, 102), None)
        assert "ttl_s" not in conn.controls[-1]["kv_transfer_params"]["harness_pause"]
        await ad.unpin(PausedKv("a", None, 102))
        await ad.drop(PausedKv("b", None, 102))
        assert await ad.held() == ["pinned run-1/c (96 tokens)"]
        await ad.release(PausedKv("c", None, 102))
        assert await ad.held() == []
        # a context of a block or more that the server did not pin is passed on
        await ad.hold(PausedKv("gone", None, 200), None)
        await ad.hold(PausedKv("tiny", None, 20), None)  # under a block: nothing to pin
        assert ad.pause_report["nothing_pinned"] == {"count": 1, "first": "gone"}
        assert ad.pause_report["ops"]["hold"] == 4

    with_server(FakeVllmConfig(), body, connector=conn)
    assert [b for b in conn.pool.discarded] == [4, 5, 6]  # b's three blocks, dropped


def test_offload_reports_the_copy_and_refusals_are_unsupported() -> None:
    conn = FakeConnector(host_cap_bytes=4 * 16384)

    async def body(ad: VllmAdapter, _: Any) -> None:
        await ad.server_info()
        await ad.complete(CompletionRequest([300] * 100, 2, session="a", hold=True),
                          lambda: None)
        io = await ad.offload(PausedKv("a", None, 102), "dump-a")
        assert (io.bytes, io.ms, io.tokens) == (3 * 16384, 0.25, 96)
        assert await ad.restore(PausedKv("a", None, 102), "dump-a") is None
        assert await ad.held() == ["host copy run-1/a (96 tokens, 49152 bytes)"]
        await ad.complete(CompletionRequest([300] * 100, 2, session="b", hold=True),
                          lambda: None)
        with pytest.raises(Unsupported, match="host memory cap"):
            await ad.offload(PausedKv("b", None, 102), "dump-b")
        assert "pinned run-1/b (96 tokens)" in await ad.held()  # the pin stays
        with pytest.raises(Unsupported, match="nothing is pinned"):
            await ad.offload(PausedKv("never", None, 102), "x")
        assert await ad.offload(PausedKv("short", None, 20), "x") == SlotIO(0, 0.0, 0)
        report = ad.pause_report["offload"]
        assert (report["tokens"], report["bytes"], report["failed"]) == (96, 49152, 2)
        assert "host memory cap" in report["first_failure"]
        assert await ad.release_all() == 2 and await ad.held() == []

    with_server(FakeVllmConfig(), body, connector=conn)


def test_a_control_request_the_server_refuses_is_an_error() -> None:
    conn = FakeConnector()

    async def body(ad: VllmAdapter, _: Any) -> None:
        await ad.server_info()
        conn.fail_status = 500
        with pytest.raises(PauseControlError, match="HTTP 500"):
            await ad.release(PausedKv("a", None, 10))

    with_server(FakeVllmConfig(), body, connector=conn)


def test_session_keys_are_scoped_and_bounded() -> None:
    assert session_key("run", "t/sub-1") == "run/t/sub-1"
    assert session_key(None, "t") == "t"
    long = session_key("run", "x" * 500)
    assert len(long) == len("run/") + 200 and long != session_key("run", "x" * 499 + "y")


@pytest.mark.parametrize(("policy", "connector"), [
    ("keep", True), ("keep-evictable", True), ("recompute", True), ("swap", True),
    ("swap", False), ("threshold", True)])
def test_replay_over_http(tmp_path: Path, policy: str, connector: bool) -> None:
    """Whole runs through the executor: with the connector every action runs per pause;
    without it swap is recorded unsupported."""
    steps = generate(load_profile("bench-small"), 5, 1)
    plan = make_plan(steps, Injection(never_return_fraction=0.2, default_deadline_s=0.2),
                     Arrivals(concurrency=3, time_scale=0.02), 1)
    out = tmp_path / "out"
    manifest = RunManifest(run_id="http", policy=policy)
    conn = FakeConnector() if connector else None

    async def body(ad: VllmAdapter, state: Any) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy), out, manifest, FALLBACK_RATES,
                     ReplaySettings(0.02))
        assert state.running == 0

    with_server(FakeVllmConfig(), body, salt="http", connector=conn)
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["status"] == "finished" and run["slots"] is None
    assert set(run["capabilities"]["pause_actions"]) == (
        {"keep", "keep-evictable", "swap", "recompute"} if connector
        else {"keep-evictable", "recompute"})
    assert run["cleanup"]["held_left"] == [] and run["cleanup"]["errors"] == []
    assert run["outcome"]["completed"] + run["outcome"]["cancelled"] == 5
    decisions = rec[rec.event == "pause_decision"]
    if conn is not None:
        assert conn.book.pins == {} and conn.book.copies == {}  # every trajectory released
        ops = [c["kv_transfer_params"]["harness_pause"]["op"] for c in conn.controls]
        assert "release" in ops
        if policy == "swap":
            assert "offload" in ops and (rec[rec.event == "swap_out"].bytes > 0).any()
        if policy == "keep":
            assert "hold" in ops
    if policy == "recompute":
        resumed = rec[(rec.event == "call_end") & (rec.step > 0)]
        assert (resumed.cached_tokens == 0).all()
    if policy == "swap" and not connector:  # no per-pause swap: recorded, not executed
        assert (decisions.status == "unsupported").all()
    assert not read_server_metrics(out).empty


def test_server_policies_are_labelled() -> None:
    assert set(SERVER_POLICIES) == {"keep", "keep-evictable", "swap", "recompute"}
    assert "pinned" in server_policy("keep").label
    assert "not pinned" in server_policy("keep-evictable").label
    assert server_policy("swap").harness_policy == "swap"
    assert "host memory" in server_policy("swap").label
    ttl = server_policy("ttl")
    assert ttl.harness_policy == "ttl" and "after=swap" in ttl.label
    assert server_policy("threshold").harness_policy == "threshold"


AMX_PERMISSION = """
import ctypes, sys
granted = ctypes.c_ulong(0)
ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(granted))  # ARCH_GET_XCOMP_PERM
print("sitecustomize" in sys.modules, granted.value >> 18 & 1)  # XFEATURE_XTILEDATA
"""


def _amx_permission(pythonpath: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", AMX_PERMISSION], env=env, check=True,
                          capture_output=True, text=True).stdout.split()


def test_every_server_process_may_use_amx_tiles() -> None:
    """vLLM's CPU attention kernel uses AMX without asking Linux for it (its worker dies of
    SIGILL at the first decode); the sitecustomize on the server's path asks in every process."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("AMX permission is a Linux x86_64 system call")
    if "amx_tile" not in Path("/proc/cpuinfo").read_text().split():
        pytest.skip("this CPU has no AMX tiles: there is no permission to ask for")
    assert _amx_permission(None) == ["False", "0"]  # a process on its own is not allowed
    assert _amx_permission(str(SITE_DIR)) == ["True", "1"]


def test_launcher_loads_the_connector(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 2048}')
    assert local_vocab(model) == 2048 and local_vocab(tmp_path) is None
    cfg = VllmServerConfig(model=model, num_gpu_blocks_override=17, max_model_len=512,
                           pin_ttl_s=30.0, host_cap_bytes=1 << 20)
    srv = LocalVllmServer(cfg, tmp_path / "log", python=Path("/usr/bin/python3"))
    try:
        flags = srv.flags
        assert flags[flags.index("--host") + 1] == "127.0.0.1"
        assert flags[flags.index("--num-gpu-blocks-override") + 1] == "17"
        assert "--enable-prefix-caching" in flags and "--enable-prompt-tokens-details" in flags
        kv = json.loads(flags[flags.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "HarnessPauseConnector",
                      "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_both",
                      "kv_connector_extra_config": {"default_ttl_s": 30.0,
                                                    "host_cap_bytes": 1 << 20,
                                                    "pin_release": "latest-program"}}
        # only the AMX sitecustomize's and the connector's own folders go on the path (never
        # adapters/, whose http.py would shadow the standard library's)
        assert srv.env["PYTHONPATH"].split(":")[:2] == [str(SITE_DIR), str(CONNECTOR_DIR)]
        assert sorted(p.name for p in SITE_DIR.iterdir()
                      if not p.name.startswith("__")) == ["sitecustomize.py"]
        assert sorted(p.name for p in CONNECTOR_DIR.iterdir()
                      if not p.name.startswith("__")) == ["harness_pause_connector"]
        assert (CONNECTOR_DIR / "harness_pause_connector" / "connector.py").exists()
        assert srv.env["VLLM_SERVER_DEV_MODE"] == "1" and srv.env["HF_HUB_OFFLINE"] == "1"
        assert cfg.connector_record() == {
            "name": "HarnessPauseConnector", "module": CONNECTOR_MODULE,
            "path": str(CONNECTOR_DIR), "default_ttl_s": 30.0, "host_cap_bytes": 1 << 20,
            "pin_release": "latest-program"}
    finally:
        srv.stop()
    bare = LocalVllmServer(VllmServerConfig(model=model, pause_connector=False),
                           tmp_path / "log2", python=Path("/usr/bin/python3"))
    try:
        assert "--kv-transfer-config" not in bare.flags
        assert bare.env["PYTHONPATH"].split(":")[0] == str(SITE_DIR)
        assert str(CONNECTOR_DIR) not in bare.env["PYTHONPATH"].split(":")
        # unpinned: vLLM binds its OpenMP threads itself
        assert "VLLM_CPU_OMP_THREADS_BIND" not in bare.env
    finally:
        bare.stop()
    pinned = LocalVllmServer(VllmServerConfig(model=model, server_cpus="1"), tmp_path / "log3",
                             python=Path("/usr/bin/python3"))
    try:  # the process and its OpenMP threads on the server's CPUs, not the harness's
        assert pinned.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
        if shutil.which("taskset"):
            assert pinned.command()[:3] == ["taskset", "-c", "1"]
    finally:
        pinned.stop()


@contextlib.contextmanager
def _fake_in_thread(connector: FakeConnector) -> Iterator[str]:
    """The fake server with the connector on a loop of its own (a thread), for code that
    talks to it synchronously; yields its URL."""
    loop = asyncio.new_event_loop()
    app = make_app(FakeVllmConfig())
    app.middlewares.append(connector.middleware)
    server = TestServer(app, host="127.0.0.1")
    loop.run_until_complete(server.start_server())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_url_run_scopes_its_sessions_and_releases_them_on_the_way_out(
        tmp_path: Path) -> None:
    conn = FakeConnector()
    with _fake_in_thread(conn) as url:
        # another load generator of the same run holds a context it still needs
        other = session_key("run-9-other", "t")
        conn.book.finished(other, True, [FakeBlock(900)], [1] * 40, None)
        with pytest.raises(KeyboardInterrupt), RUNTIME.start(
                ServerOptions("keep", "run-9", url=url), tmp_path) as session:
            async def go() -> None:
                async with connect(url, 4) as http:
                    ad = session.connect(http)
                    assert isinstance(ad, VllmAdapter)
                    info = await ad.server_info()
                    assert "pinned" in session.realise(info).label
                    await ad.complete(CompletionRequest([300] * 70, 2, session="t", hold=True),
                                      lambda: None)

            asyncio.run(go())
            mine = [s for s in conn.book.pins if s != other]
            assert len(mine) == 1 and mine[0].startswith("run-9-") and mine[0].endswith("/t")
            raise KeyboardInterrupt  # the run is stopped while its context is pinned
        assert list(conn.book.pins) == [other]  # its own released, the other's kept
        ops = [c["kv_transfer_params"]["harness_pause"] for c in conn.controls]
        assert ops[-1]["op"] == "release_all" and ops[-1]["prefix"] == mine[0][:-1]


def test_a_server_without_the_connector_is_labelled_so() -> None:
    async def body(ad: VllmAdapter, _: Any) -> None:
        info = await ad.server_info()
        label = realisation("keep", info).label
        assert "runs no harness KV connector" in label and "recorded unsupported" in label

    with_server(FakeVllmConfig(), body)


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_call_priority_is_sent_only_to_a_server_that_schedules_by_it(policy: str) -> None:
    async def body(ad: VllmAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert info.extra["scheduler_policy"] == policy
        assert ad.capabilities.call_priority == (policy == "priority")
        res = await ad.complete(CompletionRequest([300] * 40, 2, priority=1_000_003),
                                lambda: None)
        assert res.status == "ok"
        sent = state.requests[-1].get("priority")
        assert sent == (1_000_003 if policy == "priority" else None)

    with_server(FakeVllmConfig(scheduling_policy=policy), body)


def test_a_program_order_policy_starts_the_server_scheduling_by_priority(tmp_path: Path) -> None:
    from harness.adapters.base import ServerOptions
    from harness.adapters.launchers.vllm_server import server_config

    def flags(**kw: Any) -> list[str]:
        return server_config(ServerOptions(policy="continuum", run_id="r", **kw),
                             tmp_path).extra_args

    assert flags(program_order=True) == ["--scheduling-policy", "priority"]
    assert flags() == []
    assert flags(program_order=True, server_args=("--scheduling-policy=fcfs",)) == [
        "--scheduling-policy=fcfs"]  # the user's own choice stands


def test_the_pin_flags_reach_the_local_server_s_connector(tmp_path: Path) -> None:
    from harness.adapters.base import ServerOptions
    from harness.adapters.launchers.vllm_server import server_config
    from harness.policies.pin_release import PinSettings

    opts = ServerOptions(policy="keep", run_id="r",
                         pins=PinSettings("largest", expiry_s=12.5, host_cap_bytes=4096))
    cfg = server_config(opts, tmp_path)
    assert (cfg.pin_release, cfg.pin_ttl_s, cfg.host_cap_bytes) == ("largest", 12.5, 4096)
    default = server_config(ServerOptions(policy="keep", run_id="r"), tmp_path)
    assert (default.pin_release, default.pin_ttl_s, default.host_cap_bytes) == (
        "latest-program", 900.0, 1 << 30)
