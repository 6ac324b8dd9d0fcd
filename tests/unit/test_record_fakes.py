"""An in-process fake upstream (OpenAI chat and completions, Anthropic messages; streamed or
not; error statuses and cut streams) and a small scripted agent client, for the recording
proxy's tests. The fake answers from a queue of scripted replies with fixed ids, so two runs of
one request give the same bytes. (Its own checks are at the end of this file.)"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.proxy.proxy import Proxy, ProxyConfig
from harness.proxy.serve import start_recording

CHAT, COMPLETIONS, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/messages"


@dataclass
class Reply:
    """One scripted answer: text and tool calls (id, name, arguments), the usage it reports
    (or llama.cpp timings, or none), its status and timing, and where a stream breaks off."""

    text: str = "fine"
    tools: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    prompt: int = 100
    output: int = 7
    cached: int = 0
    usage: str = "usage"  # "usage" | "timings" | "none"
    status: int = 200
    ttft_s: float = 0.0
    gap_s: float = 0.0
    cut_after: int | None = None  # a stream: close the connection after this many events
    gzip: bool = False  # a whole answer: compressed (when the client accepts it)


class FakeUpstream:
    """The fake server; `replies` is consumed one per LLM request (else `default`)."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default = Reply()
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.client_left = 0  # streams whose reader went away before the end
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/{path:.*}", self._llm)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]},
                                 headers={"X-Fake": "1"})

    async def _llm(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.path, dict(request.headers), body))
        reply = self.replies.popleft() if self.replies else self.default
        req = json.loads(body)
        if reply.status >= 400:
            return web.json_response({"error": {"type": "server_error", "message": "boom"}},
                                     status=reply.status)
        await asyncio.sleep(reply.ttft_s)
        if not req.get("stream"):
            resp = web.json_response(whole(request.path, reply), headers={"X-Fake": "1"})
            if reply.gzip:
                resp.enable_compression(web.ContentCoding.gzip)
            return resp
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", "X-Fake": "1"})
        await resp.prepare(request)
        try:
            for i, event in enumerate(stream_events(request.path, reply)):
                if reply.cut_after is not None and i >= reply.cut_after:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if i:
                    await asyncio.sleep(reply.gap_s)
                await resp.write(event)
        except (asyncio.CancelledError, ConnectionError):
            self.client_left += 1
            raise
        await resp.write_eof()
        return resp


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def whole(path: str, r: Reply) -> dict[str, Any]:
    """A non-streamed answer of the API at `path`."""
    usage = {"prompt_tokens": r.prompt, "completion_tokens": r.output,
             "total_tokens": r.prompt + r.output,
             "prompt_tokens_details": {"cached_tokens": r.cached}}
    timings = {"prompt_n": r.prompt - r.cached, "cache_n": r.cached, "predicted_n": r.output}
    extra = {"usage": usage} if r.usage == "usage" else {"timings": timings} \
        if r.usage == "timings" else {}
    if path == MESSAGES:
        content: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text else []
        content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in r.tools]
        au = {"input_tokens": r.prompt - r.cached, "cache_read_input_tokens": r.cached,
              "output_tokens": r.output}
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": "fake",
                "content": content, "stop_reason": "tool_use" if r.tools else "end_turn",
                **({"usage": au} if r.usage == "usage" else {})}
    if path == COMPLETIONS:
        return {"id": "cmpl-1", "object": "text_completion", "model": "fake",
                "choices": [{"index": 0, "text": r.text, "finish_reason": "stop"}], **extra}
    msg: dict[str, Any] = {"role": "assistant", "content": r.text or None}
    if r.tools:
        msg["tool_calls"] = [{"id": i, "type": "function",
                              "function": {"name": n, "arguments": json.dumps(a)}}
                             for i, n, a in r.tools]
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": msg,
                         "finish_reason": "tool_calls" if r.tools else "stop"}], **extra}


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj)}\n\n".encode()


def stream_events(path: str, r: Reply) -> list[bytes]:
    """A streamed answer of the API at `path`, one element per event."""
    if path == MESSAGES:
        return _anthropic_events(r)
    usage = {"prompt_tokens": r.prompt, "completion_tokens": r.output,
             "total_tokens": r.prompt + r.output,
             "prompt_tokens_details": {"cached_tokens": r.cached}}
    timings = {"prompt_n": r.prompt - r.cached, "cache_n": r.cached, "predicted_n": r.output}
    base = {"id": "x-1", "model": "fake", "created": 1}
    out = []
    if path == COMPLETIONS:
        for w in _words(r.text):
            out.append(_sse({**base, "choices": [{"index": 0, "text": w, "finish_reason": None}]}))
        last: dict[str, Any] = {**base, "choices": [{"index": 0, "text": "",
                                                     "finish_reason": "stop"}]}
    else:
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                     "content": None}}]}))
        for w in _words(r.text):
            out.append(_sse({**base, "choices": [{"index": 0, "delta": {"content": w}}]}))
        for k, (i, n, a) in enumerate(r.tools):
            out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": k, "id": i, "type": "function",
                 "function": {"name": n, "arguments": ""}}]}}]}))
            out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": k, "function": {"arguments": json.dumps(a)}}]}}]}))
        last = {**base, "choices": [{"index": 0, "delta": {},
                                     "finish_reason": "tool_calls" if r.tools else "stop"}]}
    if r.usage == "timings":
        last["timings"] = timings
    out.append(_sse(last))
    if r.usage == "usage":
        out.append(_sse({**base, "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    return out


def _anthropic_events(r: Reply) -> list[bytes]:
    start_usage: dict[str, Any] = {"input_tokens": r.prompt - r.cached,
                                   "cache_read_input_tokens": r.cached, "output_tokens": 1}
    out = [_sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake", "content": [],
        **({"usage": start_usage} if r.usage == "usage" else {})}}, "message_start"),
        _sse({"type": "ping"}, "ping")]
    k = 0
    if r.text:
        out.append(_sse({"type": "content_block_start", "index": 0,
                         "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        for w in _words(r.text):
            out.append(_sse({"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": w}}, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        k = 1
    for j, (i, n, a) in enumerate(r.tools, start=k):
        out.append(_sse({"type": "content_block_start", "index": j, "content_block": {
            "type": "tool_use", "id": i, "name": n, "input": {}}}, "content_block_start"))
        out.append(_sse({"type": "content_block_delta", "index": j, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(a)}}, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": j}, "content_block_stop"))
    out.append(_sse({"type": "message_delta", "delta": {
        "stop_reason": "tool_use" if r.tools else "end_turn"},
        **({"usage": {"output_tokens": r.output}} if r.usage == "usage" else {})},
        "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


# ---------------------------------------------------------------- a scripted agent client


def read_answer(path: str, raw: bytes, streamed: bool) -> dict[str, Any]:
    """The assistant message a client keeps: OpenAI {role, content, tool_calls} or Anthropic
    {role, content: [...]}; completions {"text": ...}. Parsed here, independently of the
    proxy's own reader."""
    if not streamed:
        obj = json.loads(raw)
        if path == MESSAGES:
            return {"role": "assistant", "content": obj["content"]}
        if path == COMPLETIONS:
            return {"text": obj["choices"][0]["text"]}
        return dict(obj["choices"][0]["message"])
    datas = [json.loads(line[6:]) for line in raw.decode().splitlines()
             if line.startswith("data: ") and line != "data: [DONE]"]
    if path == MESSAGES:
        blocks: dict[int, dict[str, Any]] = {}
        for d in datas:
            if d["type"] == "content_block_start":
                blocks[d["index"]] = dict(d["content_block"])
            elif d["type"] == "content_block_delta" and d["delta"]["type"] == "text_delta":
                blocks[d["index"]]["text"] += d["delta"]["text"]
            elif d["type"] == "content_block_delta":
                blocks[d["index"]]["input"] = json.loads(d["delta"]["partial_json"])
        return {"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]}
    text = "".join((c.get("delta", {}).get("content") or c.get("text") or "")
                   for d in datas for c in d.get("choices", []))
    if path == COMPLETIONS:
        return {"text": text}
    calls: dict[int, dict[str, Any]] = {}
    for d in datas:
        for c in d.get("choices", []):
            for tc in c.get("delta", {}).get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                slot["function"]["name"] += tc.get("function", {}).get("name", "")
                slot["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


@dataclass
class Agent:
    """A conversation as an agent keeps it: messages, the answers appended as they came."""

    http: aiohttp.ClientSession
    url: str
    path: str = CHAT
    stream: bool = True
    session: str | None = None
    system: str = "You are a careful agent."
    messages: list[dict[str, Any]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    ended_at: float = 0.0  # perf_counter when the last answer was read whole
    sent_at: float = 0.0

    def body(self) -> dict[str, Any]:
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
        if self.path == MESSAGES:
            return {"model": "fake", "max_tokens": 64, "system": self.system,
                    "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
                    "messages": self.messages, "stream": self.stream}
        return {"model": "fake", "messages": [{"role": "system", "content": self.system},
                                              *self.messages],
                "tools": tools, "stream": self.stream}

    async def call(self) -> dict[str, Any]:
        headers = {**self.headers, **({"x-session-id": self.session} if self.session else {})}
        self.sent_at = time.perf_counter()
        async with self.http.post(self.url + self.path, json=self.body(),
                                  headers=headers) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw
        self.ended_at = time.perf_counter()
        msg = read_answer(self.path, raw, self.stream)
        self.messages.append(msg)
        return msg

    def calls_of(self, msg: dict[str, Any]) -> list[tuple[str, str]]:
        if self.path == MESSAGES:
            return [(b["id"], b["name"]) for b in msg["content"] if b["type"] == "tool_use"]
        return [(c["id"], c["function"]["name"]) for c in msg.get("tool_calls") or []]

    def results(self, outputs: dict[str, str], error: bool = False) -> None:
        if self.path == MESSAGES:
            self.messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": i, "content": out,
                 **({"is_error": True} if error else {})} for i, out in outputs.items()]})
        else:
            self.messages.extend({"role": "tool", "tool_call_id": i, "content": out}
                                 for i, out in outputs.items())

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


@asynccontextmanager
async def recording(tmp_path: Path, upstream: str | None = None, userinfo: str = "",
                    **kw: Any
                    ) -> AsyncIterator[tuple[FakeUpstream, Proxy, aiohttp.ClientSession]]:
    """A fake upstream, a recording proxy in front of it (tmp_path/rec; `userinfo`, e.g.
    "user:pw@", in its upstream URL) and a client session; the proxy is stopped (the recording
    closed) on the way out."""
    fake = FakeUpstream()
    await fake.start()
    url = upstream or fake.url.replace("http://", f"http://{userinfo}")
    proxy = await start_recording(ProxyConfig(url, "127.0.0.1", 0, tmp_path / "rec", **kw))
    http = aiohttp.ClientSession(auto_decompress=False)
    try:
        yield fake, proxy, http
    finally:
        await http.close()
        await proxy.stop()
        await fake.stop()


# ---------------------------------------------------------------- the fake's own checks


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, MESSAGES])
def test_the_fake_streams_what_it_answers_whole(path: str) -> None:
    r = Reply(text="two words", tools=[("c1", "bash", {"cmd": "ls"})] if path != COMPLETIONS
              else [])
    a = read_answer(path, json.dumps(whole(path, r)).encode(), False)
    b = read_answer(path, b"".join(stream_events(path, r)), True)
    assert a == b
