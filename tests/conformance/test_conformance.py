"""Each adapter, replayed against a recorded transcript of its real server, must return the
recorded results exactly and drive the executor through the recorded event sequence."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from tests.conformance.transcript import ACTIONS, PENDING, replay_app, run_plan

TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"
RUNTIMES = ["llamacpp", "vllm", "sglang"]
INFO_PATH = {"llamacpp": "/v1/models", "vllm": "/v1/models", "sglang": "/model_info"}
COMPLETION_PATH = {"llamacpp": "/completion", "vllm": "/v1/completions", "sglang": "/generate"}


def _load(runtime: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TRANSCRIPTS / f"{runtime}.json").read_text())
    return data


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_transcript_is_small_and_complete(runtime: str) -> None:
    path = TRANSCRIPTS / f"{runtime}.json"
    assert path.stat().st_size < 40_000
    t = _load(runtime)
    assert t["runtime"] == runtime and t["actions"] == ACTIONS[runtime]
    paths = {ex["path"].split("?")[0] for ex in t["exchanges"]}
    assert {"/metrics", INFO_PATH[runtime]} <= paths
    completions = [ex for ex in t["exchanges"] if ex["path"] == COMPLETION_PATH[runtime]]
    assert len(completions) == 5 and all("data:" in ex["body"] for ex in completions)


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
    """What the recorded servers said: cache reuse where kept (SGLang's unsupported swap keeps
    the KV), none where recomputed."""
    for runtime in RUNTIMES:
        ev = _load(runtime)["events"]
        decisions = [e for e in ev if e[0] == "pause_decision"]
        assert [e[3] for e in decisions] == ACTIONS[runtime]
        resumed = {(e[1], e[2]): e[4] for e in ev if e[0] == "call_end" and e[2] > 0}
        for _, tid, step, action, _ in decisions:
            cached = resumed[(tid, step + 1)]
            assert (cached == 0) if action == "recompute" else (cached > 0), (runtime, tid)
    llama = [r[0] for r in _load("llamacpp")["results"]]
    assert "save_slot" in llama and "restore_slot" in llama
