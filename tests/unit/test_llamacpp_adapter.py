"""The llama.cpp adapter against a fake llama-server over real HTTP (fast, deterministic)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.base import CompletionRequest, Unsupported
from harness.adapters.http import connect
from harness.adapters.llamacpp import LlamaCppAdapter
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
from tests.fakes.llamacpp_server import BYTES_PER_TOKEN, STATE, FakeConfig, make_app

Body = Callable[[LlamaCppAdapter, Any, Path], Coroutine[Any, Any, None]]


def with_server(tmp_path: Path, cfg: FakeConfig, body: Body) -> None:
    async def go() -> None:
        dumps = tmp_path / "dumps"
        dumps.mkdir()
        app = make_app(cfg, dumps)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                adapter = LlamaCppAdapter(http, dump_dir=dumps)
                await body(adapter, app[STATE], dumps)
        finally:
            await server.close()

    asyncio.run(go())


def test_info_complete_and_cache_reuse(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, state: Any, _: Path) -> None:
        info = await ad.server_info()
        assert (info.slots, info.ctx_per_slot, info.vocab_size) == (2, 4096, 1024)
        assert info.server_version == "b0-fake" and info.model == "fake.gguf"
        chunks: list[int] = []  # one call per streamed chunk of tokens
        r1 = await ad.complete(CompletionRequest(list(range(300, 400)), 5, slot=1),
                               lambda: chunks.append(1))
        assert r1.status == "ok" and len(r1.tokens) == 5 and chunks == [1] * 5
        assert (r1.cached_tokens, r1.prompt_n) == (0, 100)
        r2 = await ad.complete(CompletionRequest(list(range(300, 400)) + r1.tokens + [7], 3,
                                                 slot=1), lambda: None)
        assert (r2.cached_tokens, r2.prompt_n) == (105, 1)
        sent = state.requests[-1]
        assert sent["id_slot"] == 1 and sent["cache_prompt"] and sent["ignore_eos"]
        assert sent["n_predict"] == 3 and sent["return_tokens"] and sent["stream"]

    with_server(tmp_path, FakeConfig(), body)


def test_save_restore_erase_and_delete(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, state: Any, dumps: Path) -> None:
        await ad.complete(CompletionRequest(list(range(300, 350)), 2, slot=0), lambda: None)
        io = await ad.save_slot(0, "run-a-1.bin")
        assert (io.tokens, io.bytes, io.ms) == (52, 52 * BYTES_PER_TOKEN, 1.5)
        await ad.erase_slot(0)
        assert 0 not in state.cache
        back = await ad.restore_slot(1, "run-a-1.bin")
        assert back.tokens == 52 and len(state.cache[1]) == 52
        assert await ad.delete_dump("run-a-1.bin")
        assert list(dumps.iterdir()) == []
        with pytest.raises(ValueError):
            await ad.save_slot(0, "../escape.bin")
        assert await ad.slots_idle() is True
        names = {name for _, name, _, _ in await ad.scrape()}
        assert {"llamacpp:prompt_tokens_total", "is_processing"} <= names

    with_server(tmp_path, FakeConfig(), body)


@pytest.mark.parametrize("damage", ["truncate", "rewrite", "delete"])
def test_a_dump_that_changed_while_paused_is_not_restored(tmp_path: Path, damage: str) -> None:
    from harness.adapters.llamacpp import CorruptDump

    async def body(ad: LlamaCppAdapter, state: Any, dumps: Path) -> None:
        await ad.complete(CompletionRequest(list(range(300, 350)), 2, slot=0), lambda: None)
        await ad.save_slot(0, "run-a-1.bin")
        path = dumps / "run-a-1.bin"
        data = path.read_bytes()
        if damage == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif damage == "rewrite":
            path.write_bytes(bytes(reversed(data)))
        else:
            path.unlink()
        before = dict(state.cache)
        with pytest.raises(CorruptDump, match="changed while paused"):
            await ad.restore_slot(1, "run-a-1.bin")
        assert state.cache == before  # the server was never asked to load it

    with_server(tmp_path, FakeConfig(), body)


def test_an_intact_dump_restores(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, state: Any, dumps: Path) -> None:
        await ad.complete(CompletionRequest(list(range(300, 350)), 2, slot=0), lambda: None)
        await ad.save_slot(0, "run-a-1.bin")
        assert (await ad.restore_slot(1, "run-a-1.bin")).tokens == 52

    with_server(tmp_path, FakeConfig(), body)


def test_server_errors_become_results(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, _: Any, __: Path) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 2, slot=0), lambda: None)
        assert r.status == "error" and "HTTP 500" in (r.error or "")
        too_long = await ad.complete(CompletionRequest([300] * 5000, 2, slot=0), lambda: None)
        assert too_long.status == "error" and "exceed_context" in (too_long.error or "")

    with_server(tmp_path, FakeConfig(fail_completion_after=0), body)


def test_abort_after_first_token(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, _: Any, __: Path) -> None:
        r = await ad.complete(CompletionRequest([300] * 10, 50, slot=0,
                                                abort_after_first_token=True), lambda: None)
        assert r.status == "aborted" and len(r.tokens) == 1

    with_server(tmp_path, FakeConfig(decode_s_per_token=0.001), body)


def test_save_unsupported_is_reported(tmp_path: Path) -> None:
    async def body(ad: LlamaCppAdapter, _: Any, __: Path) -> None:
        with pytest.raises(Unsupported):
            await ad.save_slot(0, "x.bin")

    with_server(tmp_path, FakeConfig(slot_save_supported=False), body)


@pytest.mark.parametrize("policy", ["keep", "swap", "recompute", "threshold"])
def test_replay_over_http_cleans_up(tmp_path: Path, policy: str) -> None:
    steps = generate(load_profile("bench-small"), 6, 1)
    plan = make_plan(steps, Injection(never_return_fraction=0.2, default_deadline_s=0.2),
                     Arrivals(concurrency=3, time_scale=0.02), 1)
    out = tmp_path / "out"
    manifest = RunManifest(run_id="http", policy=policy)

    async def body(ad: LlamaCppAdapter, state: Any, dumps: Path) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy), out, manifest, FALLBACK_RATES,
                     ReplaySettings(0.02, lambda: sorted(p.name for p in dumps.glob("http*"))))
        assert state.cache == {} and list(dumps.iterdir()) == []

    with_server(tmp_path, FakeConfig(slots=2), body)
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["status"] == "finished"
    assert run["cleanup"] == {"slots_idle": True, "dump_files_left": [], "errors": [],
                              "remote_dumps_left": [], "errors_total": 0,
                              "held_left": []}
    assert run["outcome"]["completed"] + run["outcome"]["cancelled"] == 6
    resumed = rec[(rec.event == "call_end") & (rec.step > 0)]
    assert not resumed.empty
    if policy in ("keep", "swap"):
        assert (resumed.cached_tokens > 0).all()
    if policy == "recompute":
        assert (resumed.cached_tokens == 0).all()
    assert not read_server_metrics(out).empty


