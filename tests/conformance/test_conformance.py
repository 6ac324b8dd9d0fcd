"""Each adapter, replayed against a recorded transcript of its real server, must return the
recorded results exactly and drive the executor through the recorded event sequence."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from tests.conformance.transcript import (
    ACTIONS,
    OPENAI_SERVERS,
    PENDING,
    replay_app,
    run_plan,
)

TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"
OPENAI = [f"openai-{s}" for s in OPENAI_SERVERS]
RUNTIMES = ["llamacpp", "vllm", "sglang", *OPENAI, "dynamo"]
INFO_PATH = {"llamacpp": "/v1/models", "vllm": "/v1/models", "sglang": "/model_info",
             **{r: "/v1/models" for r in [*OPENAI, "dynamo"]}}
COMPLETION_PATH = {"llamacpp": "/completion", "vllm": "/v1/completions", "sglang": "/generate",
                   **{r: "/v1/completions" for r in [*OPENAI, "dynamo"]}}


# The generic client's probe requests before the run (ids, repeat, salts tried until one works)
# (Dynamo: a fresh salt's first request may or may not meet the prompt, so 5 or 6.)
PROBES = {"openai-vllm": (4,), "openai-sglang": (4,), "openai-llamacpp": (8,),
          "dynamo": (5, 6)}
# The generic client's transcripts hold its probe's streams too (one or two of 72 ids).
SIZE_LIMIT = {r: 60_000 for r in PROBES}


def _load(runtime: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TRANSCRIPTS / f"{runtime}.json").read_text())
    return data


def _pause_control(exchange: dict[str, Any]) -> bool:
    """A control request of vLLM's pause connector (its kv_transfer_params name an op)."""
    params = ((exchange.get("request") or {}).get("kv_transfer_params") or {})
    return "op" in (params.get("harness_pause") or {})


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_transcript_is_small_and_complete(runtime: str) -> None:
    path = TRANSCRIPTS / f"{runtime}.json"
    assert path.stat().st_size < SIZE_LIMIT.get(runtime, 40_000)
    t = _load(runtime)
    assert t["runtime"] == runtime and t["actions"] == ACTIONS[runtime]
    paths = {ex["path"].split("?")[0] for ex in t["exchanges"]}
    assert {"/metrics", INFO_PATH[runtime]} <= paths
    # vLLM's pause connector takes its control requests (not streamed) on the same path
    completions = [ex for ex in t["exchanges"] if ex["path"] == COMPLETION_PATH[runtime]
                   and not _pause_control(ex)]
    assert len(completions) - 5 in PROBES.get(runtime, (0,))
    # every completion streamed, but the probe's refused fields (answered with HTTP 400)
    assert all("data:" in ex["body"] for ex in completions if ex["status"] == 200)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_adapter_replays_its_transcript(runtime: str, tmp_path: Path) -> None:
    t = _load(runtime)
    unmatched: list[str] = []

    async def go() -> dict[str, Any]:
        app = replay_app(t["exchanges"], unmatched)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            out = await run_plan(runtime, str(server.make_url("")).rstrip("/"), tmp_path)
        finally:
            await server.close()
        left = [k for k, q in app[PENDING].items() if q and '"POST"' in k]
        assert not left, f"recorded requests never sent: {left}"
        return out

    out = asyncio.run(go())
    assert unmatched == []
    assert out["results"] == t["results"]
    assert out["events"] == t["events"]
    assert out["run"]["status"] == "finished" and out["run"]["outcome"]["completed"] == 2


def test_transcripts_show_each_runtime_s_policies() -> None:
    """What the recorded servers said: cache reuse where kept (SGLang's unsupported swap and
    Dynamo's mocker's unsupported recompute keep the KV), none where recomputed."""
    unsupported = {("dynamo", "recompute")}
    for runtime in RUNTIMES:
        ev = _load(runtime)["events"]
        decisions = [e for e in ev if e[0] == "pause_decision"]
        assert [e[3] for e in decisions] == ACTIONS[runtime]
        resumed = {(e[1], e[2]): e[4] for e in ev if e[0] == "call_end" and e[2] > 0}
        for _, tid, step, action, _ in decisions:
            cached = resumed[(tid, step + 1)]
            recomputed = action == "recompute" and (runtime, action) not in unsupported
            assert (cached == 0) if recomputed else (cached > 0), (runtime, tid)
    llama = [r[0] for r in _load("llamacpp")["results"]]
    assert "save_slot" in llama and "restore_slot" in llama


@pytest.mark.parametrize("runtime", OPENAI)
def test_the_generic_client_found_each_server_s_controls(runtime: str) -> None:
    """What the probe learnt from each real server: where the generated ids come back, that
    cached tokens are reported and outputs reused, and the cache salt it honours."""
    probe = _load(runtime)["probe"]
    salt, ids = {"openai-vllm": ("cache_salt", "token_ids"),
                 "openai-sglang": ("cache_salt", "token_ids"),
                 "openai-llamacpp": ("cache_prompt=false", "logprobs")}[runtime]
    assert (probe["cache_salt"], probe["output_ids"]) == (salt, ids)
    assert probe["cached_tokens_reported"] and probe["output_reused"]


def test_dynamo_s_controls_as_its_mocker_workers_showed_them() -> None:
    """Dynamo 1.6.1 with two mocker workers behind KV-aware routing: ids come back in nvext,
    the mocker caches prompt blocks only and ignores every cache salt (so recompute was
    recorded unsupported and the context stayed cached), and each call names its worker:
    a trajectory's calls stayed on the worker holding their prefix."""
    t = _load("dynamo")
    probe = t["probe"]
    assert probe["output_ids"] == "nvext.completion_token_ids"
    assert probe["output_reused"] is False and probe["cache_salt"] is None
    calls = [r[1] for r in t["results"] if r[0] == "complete"]
    assert all(c["served_by"] for c in calls)
    conf_a = {c["served_by"] for c in calls[:3]}
    assert len(conf_a) == 1  # conf-a's three calls: one worker
    resumed = [e for e in t["events"] if e[0] == "call_end" and e[2] > 0]
    assert all(e[4] > 0 for e in resumed)
