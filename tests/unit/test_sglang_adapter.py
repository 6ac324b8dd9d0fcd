"""The SGLang adapter against a fake SGLang server over real HTTP (fast, deterministic), the
launcher's configuration, the sgl_kernel CPU stand-in's logic, and the adapter replayed against a
transcript recorded from a real CPU SGLang server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.base import CompletionRequest, PausedKv, Unsupported
from harness.adapters.http import connect
from harness.adapters.launchers.sgl_kernel_cpu import sgl_kernel
from harness.adapters.launchers.sgl_kernel_cpu.sgl_kernel import mamba
from harness.adapters.launchers.sglang_server import (
    RUNTIME,
    SERVER_POLICIES,
    STAND_IN,
    LocalSglangServer,
    SglangServerConfig,
    remote_policy,
    server_policy,
)
from harness.adapters.sglang import SAFE_VOCAB, SglangAdapter
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, make_plan
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records, read_server_metrics
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from tests.fakes.sglang_server import (
    STATE,
    FakeSglangConfig,
    make_app,
)

Body = Callable[[SglangAdapter, Any], Coroutine[Any, Any, None]]


def with_server(cfg: FakeSglangConfig, body: Body, salt: str | None = "run-1",
                vocab: int | None = 2048) -> None:
    async def go() -> None:
        app = make_app(cfg)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                adapter = SglangAdapter(http, salt=salt,
                                        vocab_size=vocab)
                await body(adapter, app[STATE])
        finally:
            await server.close()

    asyncio.run(go())


def test_info_complete_and_token_granular_reuse() -> None:
    async def body(ad: SglangAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert (info.runtime, info.model, info.server_version) == ("sglang", "tiny", "0.0-fake")
        assert (info.slots, info.ctx_per_slot, info.vocab_size) == (None, 4096, 2048)
        assert info.extra["disable_radix_cache"] is False and info.extra["page_size"] == 1
        assert info.extra["cache_salt"] == "extra_key" and "api_key" not in info.extra
        assert not ad.capabilities.harness_slots
        # no streaming sessions on this server: nothing can be pinned
        assert ad.capabilities.pause_actions == {"keep-evictable", "recompute"}
        chunks: list[int] = []  # one call per streamed chunk of tokens
        p = list(range(400, 500))
        r1 = await ad.complete(CompletionRequest(p, 4), lambda: chunks.append(1))
        assert r1.status == "ok" and len(r1.tokens) == 4 and chunks == [1] * 4
        assert (r1.cached_tokens, r1.prompt_n) == (0, 100)
        assert r1.prompt_ms == pytest.approx(2.5) and r1.decode_ms == pytest.approx(4.0)
        assert r1.queue_ms == pytest.approx(0.4)  # SGLang's queue_time, in seconds
        r2 = await ad.complete(CompletionRequest(p + r1.tokens + [700] * 16, 4), lambda: None)
        assert (r2.cached_tokens, r2.prompt_n) == (103, 17)  # all but the last generated token
        sent = state.requests[-1]
        assert sent["input_ids"][:3] == [400, 401, 402] and sent["stream"] is True
        assert sent["sampling_params"] == {"max_new_tokens": 4, "ignore_eos": True,
                                           "temperature": 0.0}
        assert sent["extra_key"] == "run-1"

    with_server(FakeSglangConfig(), body)


def test_a_fresh_extra_key_forbids_reuse() -> None:
    async def body(ad: SglangAdapter, state: Any) -> None:
        p = list(range(300, 400))
        r1 = await ad.complete(CompletionRequest(p, 2), lambda: None)
        again = p + r1.tokens + [5] * 40
        fresh = await ad.complete(CompletionRequest(again, 2, cache_salt="run-1-t-1"),
                                  lambda: None)
        assert fresh.cached_tokens == 0 and state.requests[-1]["extra_key"] == "run-1-t-1"
        kept = await ad.complete(CompletionRequest(again, 2), lambda: None)
        assert kept.cached_tokens == 101

    with_server(FakeSglangConfig(), body)


def test_incremental_streaming_and_legacy_endpoints() -> None:
    async def body(ad: SglangAdapter, _: Any) -> None:
        info = await ad.server_info()
        assert info.server_version == "0.0-fake"
        cumulative = [256 + (sum([300] * 4) + 7 * i) % (2048 - 300) for i in range(5)]
        r = await ad.complete(CompletionRequest([300] * 10, 5), lambda: None)
        assert r.tokens == cumulative

    with_server(FakeSglangConfig(incremental_output=True, legacy_endpoints=True), body)
    with_server(FakeSglangConfig(), body)


def test_no_salt_and_unknown_vocab() -> None:
    async def body(ad: SglangAdapter, state: Any) -> None:
        info = await ad.server_info()
        assert info.vocab_size == SAFE_VOCAB and "fallback" in info.extra["vocab_from"]
        await ad.complete(CompletionRequest([300] * 10, 1), lambda: None)
        assert "extra_key" not in state.requests[-1]

    with_server(FakeSglangConfig(), body, salt=None, vocab=None)


def test_local_model_vocab(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"text_config": {"vocab_size": 4096}}')

    async def body(ad: SglangAdapter, _: Any) -> None:
        info = await ad.server_info()
        assert info.vocab_size == 4096 and info.extra["vocab_from"] == "model_path config.json"
        assert info.extra["model_path"] == str(tmp_path)

    with_server(FakeSglangConfig(model_path=str(tmp_path)), body, vocab=None)


def test_radix_cache_off_leaves_only_recompute() -> None:
    async def body(ad: SglangAdapter, _: Any) -> None:
        await ad.server_info()
        assert ad.capabilities.pause_actions == {"recompute"}
        p = list(range(300, 400))
        r1 = await ad.complete(CompletionRequest(p, 2), lambda: None)
        r2 = await ad.complete(CompletionRequest(p + r1.tokens, 2), lambda: None)
        assert r2.cached_tokens == 0 and r2.prompt_n == 102

    with_server(FakeSglangConfig(disable_radix_cache=True), body)


def test_errors_become_results() -> None:
    async def body(ad: SglangAdapter, _: Any) -> None:
        too_long = await ad.complete(CompletionRequest([300] * 4095, 2), lambda: None)
        assert too_long.status == "error" and "HTTP 400" in (too_long.error or "")
        assert "context length" in (too_long.error or "")

    with_server(FakeSglangConfig(), body)

    async def injected(ad: SglangAdapter, _: Any) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 2), lambda: None)
        assert r.status == "error" and "injected failure" in (r.error or "")

    with_server(FakeSglangConfig(fail_generate_after=0), injected)

    async def aborted(ad: SglangAdapter, _: Any) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 3), lambda: None)
        assert r.status == "error" and "aborted by the server: retracted" in (r.error or "")
        assert len(r.tokens) == 3

    with_server(FakeSglangConfig(abort_generate_after=0), aborted)

    async def dead() -> None:
        async with connect("http://127.0.0.1:9", 8) as http:
            ad = SglangAdapter(http, vocab_size=2048)
            r = await ad.complete(CompletionRequest([300] * 4, 1), lambda: None)
            assert r.status == "error" and "Connect" in (r.error or "")

    asyncio.run(dead())


def test_abort_after_first_token() -> None:
    async def body(ad: SglangAdapter, state: Any) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 50, abort_after_first_token=True),
                              lambda: None)
        assert r.status == "aborted" and len(r.tokens) == 1
        await asyncio.sleep(0.1)
        assert state.running == 0 and state.disconnects == 1

    with_server(FakeSglangConfig(decode_s_per_token=0.005), body)


def test_pause_actions_without_sessions_and_metrics_filtered() -> None:
    async def body(ad: SglangAdapter, state: Any) -> None:
        with pytest.raises(Unsupported, match="HiCache"):
            await ad.offload(PausedKv("t", tokens=10), "x.bin")
        assert await ad.restore(PausedKv("t"), "x.bin") is None
        with pytest.raises(Unsupported):
            await ad.complete(CompletionRequest([300], 1, slot=0), lambda: None)
        # held on a server without sessions: a plain call, nothing to open, hold or close
        await ad.complete(CompletionRequest([300] * 8, 1, session="t", hold=True),
                          lambda: None)
        assert "session_params" not in state.requests[-1]
        for action in (ad.unpin, ad.drop, ad.release):
            await action(PausedKv("t"))
        await ad.hold(PausedKv("t"), None)
        assert len(state.requests) == 1 and await ad.held() == []
        assert await ad.delete_dump("x.bin") is False
        samples = await ad.scrape()
        names = {name for _, name, _, _ in samples}
        assert names == {"sglang:num_running_reqs", "sglang:num_queue_reqs",
                         "sglang:token_usage", "sglang:kv_evictable_tokens",
                         "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds_sum",
                         "sglang:time_to_first_token_seconds_count"}
        labels = json.loads(next(lb for _, n, lb, _ in samples if n == "sglang:token_usage"))
        assert labels["model_name"] == "tiny"
        assert await ad.slots_idle() is True
        assert await ad.flush_cache() is True

    with_server(FakeSglangConfig(), body)


@pytest.mark.parametrize("policy", ["keep-evictable", "recompute", "keep", "swap"])
def test_replay_over_http_without_sessions(tmp_path: Path, policy: str) -> None:
    """Whole runs on a server without streaming sessions: keep-evictable reuses, recompute
    salts, keep and swap are recorded unsupported (and the radix cache still serves them)."""
    steps = generate(load_profile("bench-small"), 5, 1)
    plan = make_plan(steps, Injection(never_return_fraction=0.2, default_deadline_s=0.2),
                     Arrivals(concurrency=3, time_scale=0.02), 1)
    out = tmp_path / "out"
    manifest = RunManifest(run_id="http", policy=policy)

    async def body(ad: SglangAdapter, state: Any) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy), out, manifest, FALLBACK_RATES,
                     ReplaySettings(0.02))
        assert state.running == 0

    with_server(FakeSglangConfig(), body, salt="http")
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["status"] == "finished" and run["slots"] is None
    assert run["capabilities"]["pause_actions"] == ["keep-evictable", "recompute"]
    assert run["cleanup"]["held_left"] == [] and run["cleanup"]["errors"] == []
    assert run["cleanup"]["slots_idle"] is True
    assert run["outcome"]["completed"] + run["outcome"]["cancelled"] == 5
    resumed = rec[(rec.event == "call_end") & (rec.step > 0)]
    assert not resumed.empty
    decisions = rec[rec.event == "pause_decision"]
    if policy != "recompute":  # nothing done, or left to the radix cache: the KV stays cached
        assert (resumed.cached_tokens > 0).all()
    if policy == "recompute":
        assert (resumed.cached_tokens == 0).all()
        assert (rec[rec.event == "erase"].reason.str.contains("fresh cache salt")).all()
    if policy in ("keep", "swap"):
        assert (decisions.status == "unsupported").all()
        assert run["outcome"]["unsupported_actions"] == len(decisions)
    assert read_json(out / "summary.json")["cache_mismatches"] == 0
    assert not read_server_metrics(out).empty


def test_server_policies_are_labelled() -> None:
    keep = server_policy("keep")
    assert keep.harness_policy == "keep" and "streaming session" in keep.label
    assert "pins" in keep.label
    evictable = server_policy("keep-evictable")
    assert evictable.harness_policy == "keep-evictable" and "not pinned" in evictable.label
    rec = server_policy("recompute")
    assert rec.harness_policy == "recompute" and "extra_key" in rec.label
    swap = SERVER_POLICIES["swap"]
    assert swap.harness_policy == "swap" and "not run" in swap.label
    assert "cudaHostRegister" in swap.label and "unsupported" in swap.label
    ttl = server_policy("ttl")
    assert ttl.harness_policy == "ttl" and "closes the session" in ttl.label
    assert "safety net" in ttl.label and "after=swap decisions are recorded as unsupported" \
        in ttl.label
    preferred = server_policy("keep-preferred")
    assert preferred.harness_policy == "keep-evictable"
    assert "--enable-session-radix-cache" in preferred.label
    assert RUNTIME.server_policies == {"keep-preferred": "keep-evictable"}
    assert "keep-evictable" in RUNTIME.default_policies
    threshold = server_policy("threshold")
    assert threshold.harness_policy == "threshold" and "keep (a pinned" in threshold.label


def test_remote_policy_follows_what_the_server_runs() -> None:
    url = "http://gpu:30000"
    sessions = {"enable_streaming_session": True}
    hicache = remote_policy("swap", {"enable_hierarchical_cache": True}, url)
    assert hicache.harness_policy == "keep-evictable" and "HiCache on the server" in hicache.label
    plain = remote_policy("swap", {"enable_hierarchical_cache": False}, url)
    assert plain.harness_policy == "swap" and "without HiCache" in plain.label
    no_radix = remote_policy("keep", {"disable_radix_cache": True, **sessions}, url)
    assert no_radix.harness_policy == "keep" and "--disable-radix-cache" in no_radix.label
    assert remote_policy("recompute", sessions, url) == server_policy("recompute")
    assert remote_policy("keep", sessions, url) == server_policy("keep")
    unpinned = remote_policy("keep", {}, url)
    assert unpinned.harness_policy == "keep" and "nothing can be pinned" in unpinned.label
    untagged = remote_policy("keep-preferred", sessions, url)
    assert "without --enable-session-radix-cache" in untagged.label
    tagged = {"enable_session_radix_cache": True}
    assert remote_policy("keep-preferred", tagged, url) == server_policy("keep-preferred")


def test_launcher_flags_env_and_cleanup(tmp_path: Path) -> None:
    cfg = SglangServerConfig(model=tmp_path, context_length=2048, max_total_tokens=8192,
                             disable_radix_cache=True, max_running_requests=3)
    srv = LocalSglangServer(cfg, tmp_path / "log", python=Path("/usr/bin/python3"))
    try:
        flags = srv.flags
        assert flags[flags.index("--host") + 1] == "127.0.0.1"
        assert flags[flags.index("--device") + 1] == "cpu"
        assert flags[flags.index("--max-total-tokens") + 1] == "8192"
        assert flags[flags.index("--context-length") + 1] == "2048"
        assert flags[flags.index("--max-running-requests") + 1] == "3"
        for f in ("--disable-radix-cache", "--disable-overlap-schedule", "--enable-metrics",
                  "--enable-cache-report", "--disable-cuda-graph", "--sleep-on-idle",
                  "--enable-streaming-session"):
            assert f in flags
        assert "--enable-session-radix-cache" not in flags
        assert srv.env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert srv.env["PYTHONPATH"].split(":")[0] == str(STAND_IN)
        assert (STAND_IN / "sgl_kernel" / "__init__.py").is_file()
        assert srv.command()[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
        assert (srv.tmp_dir.stat().st_mode & 0o777) == 0o700
        assert not srv.group_alive()
    finally:
        srv.stop()
    assert not srv.tmp_dir.exists()
    default = LocalSglangServer(SglangServerConfig(model=tmp_path), tmp_path / "log2",
                                python=Path("/usr/bin/python3"))
    default.stop()
    assert "--disable-radix-cache" not in default.flags
    assert "--enable-streaming-session" in default.flags
    radix = LocalSglangServer(SglangServerConfig(model=tmp_path, session_radix_cache=True),
                              tmp_path / "log3", python=Path("/usr/bin/python3"))
    radix.stop()
    assert "--enable-session-radix-cache" in radix.flags
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in default.env  # unpinned: SGLang binds itself
    pinned = LocalSglangServer(SglangServerConfig(model=tmp_path, server_cpus="1"),
                               tmp_path / "log4", python=Path("/usr/bin/python3"))
    pinned.stop()
    # its threads on the server's CPUs; its KV pool sized by the flag, as always
    assert pinned.env["SGLANG_CPU_OMP_THREADS_BIND"] == "1"
    assert "--max-total-tokens" in pinned.flags


def test_stand_in_assigns_each_request_its_locations() -> None:
    """The stand-in's kernel on numpy arrays (it only indexes, as it does torch tensors)."""
    table = np.zeros((4, 8), dtype=np.int32)
    # request rows 2 and 0: row 2 gets positions 1..3, row 0 gets position 5; a no-op row 3
    sgl_kernel.assign_req_to_token_pool_cpu(
        np.array([2, 3, 0]), table, np.array([1, 4, 5]), np.array([4, 4, 6]),
        np.array([11, 12, 13, 14], dtype=np.int64), 8)
    assert table[2].tolist() == [0, 11, 12, 13, 0, 0, 0, 0]
    assert table[0].tolist() == [0, 0, 0, 0, 0, 14, 0, 0]
    assert not table[[1, 3]].any()
    with pytest.raises(IndexError, match="pool width"):
        sgl_kernel.assign_req_to_token_pool_cpu([1], table, [6], [9], [1, 2, 3], 8)


def test_stand_in_refuses_every_other_kernel_when_called() -> None:
    from harness.adapters.launchers.sgl_kernel_cpu.sgl_kernel import (  # type: ignore[attr-defined]
        copy_all_layer_kv_cache_cpu,
    )

    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        copy_all_layer_kv_cache_cpu(1, 2)
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.mamba\.causal_conv1d_fn_cpu"):
        mamba.causal_conv1d_fn_cpu()
    assert not hasattr(sgl_kernel, "__wrapped__")
    assert sgl_kernel.__version__.endswith("stand-in")
