"""`harness record` in front of a real llama-server: a short agent loop on its OpenAI (streamed)
and Anthropic endpoints goes through the proxy, the client gets the server's answers, and the
import has the server's own token counts, the tool and user pauses within the client's own
measured bounds, and the sub-agent started while the parent waited."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd
import pytest

from harness.adapters.launchers.llamacpp_server import LocalLlamaServer
from harness.proxy.proxy import ProxyConfig
from harness.proxy.serve import start_recording
from harness.proxy.store import read_recording
from harness.traces.context import context_lengths
from harness.traces.importers import import_trace
from harness.traces.validate import check_frame

pytestmark = pytest.mark.live

SLACK_S = 0.25  # the proxy's wall time lies within the client's gap and this much more


class Loop:
    """A conversation kept as an agent keeps it, with the server's own counts per call."""

    def __init__(self, http: aiohttp.ClientSession, url: str, path: str, system: str) -> None:
        self.http, self.url, self.path, self.system = http, url, path, system
        self.messages: list[dict[str, Any]] = []
        self.counts: list[tuple[int, int]] = []  # (prompt, output) as the server said
        self.answered = 0.0
        self.sent = 0.0

    async def call(self) -> None:
        if self.path == "/v1/messages":
            body: dict[str, Any] = {"model": "m", "system": self.system,
                                    "messages": self.messages}
        else:
            body = {"messages": [{"role": "system", "content": self.system}, *self.messages],
                    "stream": True}
        body.update(max_tokens=8, temperature=0.0)
        self.sent = time.perf_counter()
        async with self.http.post(self.url + self.path, json=body) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:300]
        self.answered = time.perf_counter()
        if self.path == "/v1/messages":
            obj = json.loads(raw)
            u = obj["usage"]
            self.counts.append((u["input_tokens"] + u.get("cache_read_input_tokens", 0)
                                + u.get("cache_creation_input_tokens", 0), u["output_tokens"]))
            self.messages.append({"role": "assistant", "content": obj["content"]})
            return
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines()
                  if line.startswith("data: {")]
        t = next(c["timings"] for c in reversed(chunks) if "timings" in c)
        self.counts.append((t["prompt_n"] + t["cache_n"], t["predicted_n"]))
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c.get("choices"))
        self.messages.append({"role": "assistant", "content": text})

    def own_tool_call(self, cid: str, name: str, output: str) -> None:
        """Write a tool call into the last answer and its result after it."""
        last = self.messages[-1]
        if self.path == "/v1/messages":
            last["content"] = [*last["content"], {"type": "tool_use", "id": cid, "name": name,
                                                  "input": {}}]
            self.messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": cid, "content": output}]})
        else:
            last["tool_calls"] = [{"id": cid, "type": "function",
                                   "function": {"name": name, "arguments": "{}"}}]
            self.messages.append({"role": "tool", "tool_call_id": cid, "content": output})


def _gap(loop: Loop, before: float) -> float:
    return loop.sent - before


async def _run(url: str) -> tuple[Loop, Loop, dict[str, float]]:
    gaps: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        parent = Loop(http, url, "/v1/chat/completions", "You are a helpful coding agent.")
        parent.messages.append({"role": "user", "content": "What is in notes.txt?"})
        await parent.call()
        before = parent.answered
        await asyncio.sleep(0.1)
        parent.own_tool_call("call_1", "read_file", "Release 1.2: fix the cache bug.")
        await parent.call()
        gaps["read_file"] = _gap(parent, before)
        before = parent.answered
        sub = Loop(http, url, "/v1/messages", "You are a sub-agent. Answer in one line.")
        sub.messages.append({"role": "user", "content": "Read todo.txt."})
        await sub.call()
        sub_before = sub.answered
        await asyncio.sleep(0.05)
        sub.own_tool_call("toolu_1", "Read", "1. write the changelog")
        await sub.call()
        gaps["sub_read"] = _gap(sub, sub_before)
        parent.own_tool_call("call_2", "Task", "write the changelog")
        await parent.call()
        gaps["after_sub"] = parent.sent - sub.answered
        before = parent.answered
        await asyncio.sleep(0.2)
        parent.messages.append({"role": "user", "content": "Thanks."})
        await parent.call()
        gaps["user"] = _gap(parent, before)
    return parent, sub, gaps


def test_a_recorded_loop_imports_with_the_servers_counts(llama_server: LocalLlamaServer,
                                                         tmp_path: Path) -> None:
    async def go() -> tuple[Loop, Loop, dict[str, float]]:
        proxy = await start_recording(ProxyConfig(llama_server.url, "127.0.0.1", 0,
                                                  tmp_path / "rec"))
        try:
            return await _run(proxy.url)
        finally:
            await proxy.stop()

    parent, sub, gaps = asyncio.run(go())
    rec = tmp_path / "rec"
    calls = [e for _, e in read_recording(rec).events if e["ev"] == "call"]
    assert [c["usage"]["source"] for c in calls] == ["timings"] * 2 + ["usage"] * 2 + [
        "timings"] * 2
    imp = import_trace("recording", rec, {})
    df = imp.steps
    assert check_frame(df, "live") == []
    rid = read_recording(rec).meta["id"]
    p = df[df["trajectory_id"] == f"{rid}/c1"].reset_index(drop=True)
    c = df[df["trajectory_id"] == f"{rid}/c1/c2"].reset_index(drop=True)
    assert c.loc[0, "parent_id"] == f"{rid}/c1" and c.loc[0, "spawn_step"] == 3
    for t, loop in ((p, parent), (c, sub)):
        llm = (t["kind"] == "llm").to_numpy()
        assert context_lengths(t).prompt[llm].tolist() == [n for n, _ in loop.counts]
        assert t[t["kind"] == "llm"]["output_tokens"].tolist() == [max(o, 1) for _, o in
                                                                   loop.counts]
    tools = p[p["kind"] == "tool"]
    assert tools["tool_name"].tolist() == ["read_file", "Task", "user"]
    assert tools["tool_class"].tolist() == ["local_read", "subagent", "human"]
    lat = tools["latency_s"].tolist()
    assert gaps["read_file"] <= lat[0] <= gaps["read_file"] + SLACK_S
    assert lat[1] <= gaps["after_sub"] + SLACK_S
    assert gaps["user"] <= lat[2] <= gaps["user"] + SLACK_S
    sub_lat = c[c["kind"] == "tool"]["latency_s"].tolist()
    assert len(sub_lat) == 1 and gaps["sub_read"] <= sub_lat[0] <= gaps["sub_read"] + SLACK_S
    totals = imp.provenance.extra["totals"]
    assert (totals["usage_exact"], totals["client_tool_calls"], totals["subagents"]) == (
        6, 3, 1)
    assert totals["prompt_tokens"] == sum(n for n, _ in parent.counts + sub.counts)
    assert not pd.isna(p.loc[0, "start_s"])
