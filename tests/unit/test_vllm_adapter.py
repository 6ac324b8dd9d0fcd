"""The vLLM adapter against a fake vLLM server over real HTTP (fast, deterministic)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.base import CompletionRequest, Unsupported
from harness.adapters.http import connect
from harness.adapters.launchers.vllm_server import (
    SERVER_POLICIES,
    LocalVllmServer,
    VllmServerConfig,
    server_policy,
)
from harness.adapters.models import local_vocab
from harness.adapters.vllm import VllmAdapter
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, make_plan
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_records, read_server_metrics
from harness.replay.clock import RealClock
from harness.replay.runner import replay
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from tests.fakes.vllm_server import STATE, FakeVllmConfig, make_app

Body = Callable[[VllmAdapter, Any], Coroutine[Any, Any, None]]


def with_server(cfg: FakeVllmConfig, body: Body, salt: str | None = "run-1",
                vocab: int | None = 2048) -> None:
    async def go() -> None:
        app = make_app(cfg)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                adapter = VllmAdapter(http, salt=salt,
                                      vocab_size=vocab)
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
        assert not ad.capabilities.harness_slots
        assert ad.capabilities.pause_actions == {"keep", "recompute"}
        chunks: list[int] = []  # one call per streamed chunk of tokens
        p = list(range(400, 500))
        r1 = await ad.complete(CompletionRequest(p, 4), lambda: chunks.append(1))
        assert r1.status == "ok" and len(r1.tokens) == 4 and chunks == [1] * 4
        assert (r1.cached_tokens, r1.prompt_n, r1.prompt_ms, r1.decode_ms) == (0, 100, 2.5, 4.0)
        r2 = await ad.complete(CompletionRequest(p + r1.tokens + [700] * 16, 4), lambda: None)
        assert (r2.cached_tokens, r2.prompt_n) == (96, 24)  # three full 32-token blocks
        sent = state.requests[-1]
        assert sent["prompt"][:3] == [400, 401, 402] and sent["max_tokens"] == 4
        assert sent["ignore_eos"] and sent["stream"] and sent["return_token_ids"]
        assert sent["stream_options"] == {"include_usage": True}
        assert sent["cache_salt"] == "run-1" and sent["model"] == "tiny"

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


def test_slot_operations_are_unsupported_and_metrics_filtered() -> None:
    async def body(ad: VllmAdapter, _: Any) -> None:
        with pytest.raises(Unsupported):
            await ad.save_slot(0, "x.bin")
        with pytest.raises(Unsupported):
            await ad.restore_slot(0, "x.bin")
        with pytest.raises(Unsupported):
            await ad.erase_slot(0)
        with pytest.raises(Unsupported):
            await ad.complete(CompletionRequest([300], 1, slot=0), lambda: None)
        assert await ad.delete_dump("x.bin") is False
        names = {name for _, name, _, _ in await ad.scrape()}
        assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                "vllm:time_to_first_token_seconds_count"} <= names
        assert not any(n.endswith("_bucket") or not n.startswith("vllm:") for n in names)
        assert await ad.slots_idle() is True
        assert await ad.reset_prefix_cache() is True

    with_server(FakeVllmConfig(), body)


@pytest.mark.parametrize("policy", ["keep", "recompute", "swap", "threshold"])
def test_replay_over_http(tmp_path: Path, policy: str) -> None:
    """Whole runs through the executor: keep reuses, recompute salts, swap is unsupported."""
    steps = generate(load_profile("bench-small"), 5, 1)
    plan = make_plan(steps, Injection(never_return_fraction=0.2, default_deadline_s=0.2),
                     Arrivals(concurrency=3, time_scale=0.02), 1)
    out = tmp_path / "out"
    manifest = RunManifest(run_id="http", policy=policy)

    async def body(ad: VllmAdapter, state: Any) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy), out, manifest, FALLBACK_RATES,
                     0.02)
        assert state.running == 0

    with_server(FakeVllmConfig(), body, salt="http")
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["status"] == "finished" and run["slots"] is None
    assert run["capabilities"] == {"harness_slots": False, "pause_actions": ["keep", "recompute"]}
    assert run["cleanup"] == {"slots_idle": True, "dump_files_left": None, "errors": [],
                              "remote_dumps_left": [], "errors_total": 0}
    assert run["outcome"]["completed"] + run["outcome"]["cancelled"] == 5
    resumed = rec[(rec.event == "call_end") & (rec.step > 0)]
    assert not resumed.empty
    decisions = rec[rec.event == "pause_decision"]
    if policy == "keep":
        assert (resumed.cached_tokens > 0).all()
    if policy == "recompute":
        assert (resumed.cached_tokens == 0).all()
        assert (rec[rec.event == "erase"].reason.str.contains("fresh cache salt")).all()
    if policy == "swap":  # no per-pause swap on vLLM: recorded, not executed
        assert (decisions.status == "unsupported").all()
        assert run["outcome"]["unsupported_actions"] == len(decisions)
    assert not read_server_metrics(out).empty


def test_server_policies_are_labelled() -> None:
    assert server_policy("keep").connector is None
    assert "not pinned" in server_policy("keep").label
    swap = SERVER_POLICIES["swap"]
    assert swap.harness_policy == "keep" and swap.connector == "ExampleConnector"
    assert "swap via ExampleConnector (disk)" in swap.label
    ttl = server_policy("ttl")
    assert ttl.harness_policy == "ttl" and "unsupported" in ttl.label


def test_launcher_flags_and_vocab(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 2048}')
    assert local_vocab(model) == 2048 and local_vocab(tmp_path) is None
    cfg = VllmServerConfig(model=model, num_gpu_blocks_override=17, max_model_len=512,
                           connector="ExampleConnector")
    srv = LocalVllmServer(cfg, tmp_path / "log", python=Path("/usr/bin/python3"))
    try:
        flags = srv.flags
        assert flags[flags.index("--host") + 1] == "127.0.0.1"
        assert flags[flags.index("--num-gpu-blocks-override") + 1] == "17"
        assert "--enable-prefix-caching" in flags and "--enable-prompt-tokens-details" in flags
        kv = flags[flags.index("--kv-transfer-config") + 1]
        assert '"ExampleConnector"' in kv and srv.store_dir is not None
        assert str(srv.store_dir) in kv and (srv.store_dir.stat().st_mode & 0o777) == 0o700
        assert srv.env["VLLM_SERVER_DEV_MODE"] == "1" and srv.env["HF_HUB_OFFLINE"] == "1"
    finally:
        srv.stop()
    assert srv.store_dir is not None and not srv.store_dir.exists()
