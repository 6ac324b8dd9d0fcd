"""The generic OpenAI-compatible runtime (`--runtime openai --url`) end to end against a real
llama-server's /v1 endpoints: the probe finds its controls (ids in logprobs, `cache_prompt:
false` as the way to forbid reuse), keep reuses the kept context and recompute reuses none, as
the server's own cached-token counts say. (vLLM's and SGLang's /v1 endpoints are covered by the
conformance transcripts recorded from them.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.adapters.launchers.llamacpp_server import LocalLlamaServer
from harness.cli import main
from harness.records.store import read_json, read_records
from tests.live.traces import write_one_pause_trace

pytestmark = pytest.mark.live


@pytest.mark.parametrize("policy", ["keep-evictable", "recompute"])
def test_openai_runtime_on_llama_server(llama_server: LocalLlamaServer, tmp_path: Path,
                                        policy: str) -> None:
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    out = tmp_path / policy
    res = CliRunner().invoke(main, ["run", "--runtime", "openai", "--url", llama_server.url,
                                    "--trace", str(trace), "--policy", policy,
                                    "--concurrency", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run, summary = read_json(out / "run.json"), read_json(out / "summary.json")
    probe = run["server_extra"]["openai_probe"]
    assert (probe["output_ids"], probe["cache_salt"]) == ("logprobs", "cache_prompt=false")
    assert run["runtime"] == "openai" and run["capabilities"]["pause_actions"] == [
        "keep-evictable", "recompute"]
    assert run["outcome"]["completed"] == 1 and run["outcome"]["unsupported_actions"] == 0
    assert summary["cache_mismatches"] == 0
    rec = read_records(out)
    ends = rec[(rec.event == "call_end") & (rec.traffic == "agent")].sort_values("step")
    first, resumed = ends.iloc[0], ends.iloc[1]
    # (the first call may meet the same trace's prompt from an earlier test: llama-server has
    # no salt namespace to keep runs apart, only a per-call `cache_prompt: false`)
    assert first.output_tokens == 4
    if policy == "keep-evictable":  # 80 in + 4 out, less the last generated token
        assert resumed.cached_tokens == 83
    else:
        assert resumed.cached_tokens == 0 and resumed.prompt_n == 80 + 4 + 8


def test_openai_runtime_refuses_a_server_without_completions(tmp_path: Path) -> None:
    """No server at the URL: one line, exit 3 (a server problem), never a traceback."""
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    res = CliRunner().invoke(main, ["run", "--runtime", "openai", "--url",
                                    "http://127.0.0.1:9", "--trace", str(trace), "--policy",
                                    "keep", "--out", str(tmp_path / "o"),
                                    "--connect-timeout", "2"])
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_chat_fallback_on_vllm_s_chat_endpoint(tmp_path: Path) -> None:
    """The chat fallback (for servers that refuse token-id prompts) against a real vLLM chat
    endpoint: the plan's ids go as words, the generated text comes back as the assistant turn,
    the server's prefix cache reuses the conversation, and a fresh cache salt forbids it."""
    from harness.adapters.base import CompletionRequest
    from harness.adapters.http import connect
    from harness.adapters.launchers.vllm_server import (
        LocalVllmServer,
        VllmServerConfig,
        vllm_model,
        vllm_python,
    )
    from harness.adapters.openai import OpenAIAdapter

    python = vllm_python()
    with LocalVllmServer(VllmServerConfig(model=vllm_model(python)), tmp_path / "vllm.log",
                         python=python) as server:
        async def go() -> tuple[Any, ...]:
            async with connect(server.url, 2) as http:
                ad = OpenAIAdapter(http, salt="chat-live", chat=True)
                info = await ad.server_info()
                ctx = [300 + 7 * i for i in range(120)]
                first = await ad.complete(CompletionRequest(ctx, 8), lambda: None)
                ctx += first.tokens + [900 + i for i in range(6)]
                kept = await ad.complete(CompletionRequest(ctx, 4), lambda: None)
                fresh = await ad.complete(CompletionRequest(ctx, 4, cache_salt="chat-live-2"),
                                          lambda: None)
                return info, first, kept, fresh

        info, first, kept, fresh = asyncio.run(go())
    probe = info.extra["openai_probe"]
    assert probe["output_ids"] == "chat text" and probe["cache_salt"] == "cache_salt"
    assert probe["text_tokens_per_id"] is not None and probe["text_tokens_per_id"] > 0.5
    assert first.status == "ok" and len(first.tokens) == 8 and first.cached_tokens == 0
    assert kept.cached_tokens is not None and kept.cached_tokens >= 96  # 32-token blocks
    assert fresh.cached_tokens == 0
