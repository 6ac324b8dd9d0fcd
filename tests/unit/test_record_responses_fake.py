"""An in-process fake of the OpenAI Responses API (`POST /v1/responses`, streamed or not, with
scripted malformed streams) and a small agent client that keeps its conversation as input
items, resending everything or chaining by `previous_response_id`. (Its own checks at the end.)"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from harness.proxy.proxy import Proxy, ProxyConfig
from harness.proxy.serve import start_recording

RESPONSES = "/v1/responses"
SECRET_REASONING = "enc-REASONING-SECRET"


@dataclass
class RReply:
    """One scripted response: text, tool calls (call id, name, arguments), a reasoning item,
    its usage, and how its stream goes wrong (`mode`)."""

    text: str = ""
    tools: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    reasoning: bool = True
    input_tokens: int = 100
    cached: int = 0
    output: int = 7
    # ok | bad-json | no-end | unknown-event | unknown-item | failed | error | no-shape
    mode: str = "ok"


def output_items(r: RReply) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append({"type": "reasoning", "id": "rs_1", "encrypted_content": SECRET_REASONING,
                    "summary": [{"type": "summary_text", "text": "thinking " + SECRET_REASONING}]})
    if r.text:
        out.append({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": r.text, "annotations": []}]})
    out += [{"type": "function_call", "id": f"fc_{i}", "call_id": i, "name": n,
             "arguments": json.dumps(a), "status": "completed"} for i, n, a in r.tools]
    if r.mode == "unknown-item":
        out.append({"type": "web_search_call", "id": "ws_1", "status": "completed"})
    return out


def response_object(r: RReply, rid: str) -> dict[str, Any]:
    usage = {"input_tokens": r.input_tokens, "input_tokens_details": {"cached_tokens": r.cached},
             "output_tokens": r.output, "output_tokens_details": {"reasoning_tokens": 2},
             "total_tokens": r.input_tokens + r.output}
    if r.mode == "failed":
        return {"id": rid, "object": "response", "status": "failed", "model": "fake",
                "output": [], "error": {"code": "server_error", "message": "boom"},
                "usage": usage}
    return {"id": rid, "object": "response", "status": "completed", "model": "fake",
            "output": output_items(r), "usage": usage}


def _sse(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


def stream_events(r: RReply, rid: str) -> list[bytes]:
    """The stream of `r`, one element per event."""
    if r.mode == "no-shape":
        return [f"data: {json.dumps({'n': i})}\n\n".encode() for i in range(4)]
    whole = response_object(r, rid)
    head = {**whole, "status": "in_progress", "output": [], "usage": None}
    out = [_sse({"type": "response.created", "response": head}),
           _sse({"type": "response.in_progress", "response": head})]
    if r.mode == "error":
        return [*out, _sse({"type": "error", "code": "rate_limit_exceeded", "message": "slow"})]
    for k, item in enumerate(whole["output"]):
        start = {**item, "arguments": ""} if item["type"] == "function_call" else (
            {**item, "content": []} if item["type"] == "message" else item)
        out.append(_sse({"type": "response.output_item.added", "output_index": k,
                         "item": start}))
        if item["type"] == "message":
            for w in item["content"][0]["text"].split(" "):
                out.append(_sse({"type": "response.output_text.delta", "output_index": k,
                                 "content_index": 0, "delta": w + " "}))
        elif item["type"] == "function_call":
            out.append(_sse({"type": "response.function_call_arguments.delta",
                             "output_index": k, "delta": item["arguments"]}))
            out.append(_sse({"type": "response.function_call_arguments.done",
                             "output_index": k, "arguments": item["arguments"]}))
        out.append(_sse({"type": "response.output_item.done", "output_index": k, "item": item}))
    if r.mode == "bad-json":
        out.append(b'data: {"type": "response.output_text.delta", "delta": \n\n')
    if r.mode == "unknown-event":
        out.append(_sse({"type": "response.teleported", "x": 1}))
    if r.mode != "no-end":
        end = "response.failed" if r.mode == "failed" else "response.completed"
        out.append(_sse({"type": end, "response": whole}))
    return out


class FakeResponses:
    """The fake server; `replies` is consumed one per request (else a default)."""

    def __init__(self) -> None:
        self.replies: deque[RReply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self.linger_s = 0.0  # held open this long after the stream's end event

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/{path:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        req = await request.json()
        self.requests.append(req)
        r = self.replies.popleft() if self.replies else RReply(text="fine")
        rid = f"resp_{len(self.requests)}"
        if not req.get("stream"):
            if r.mode == "no-shape":
                return web.Response(text="not json at all", content_type="application/json")
            return web.json_response(response_object(r, rid))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in stream_events(r, rid):
            await resp.write(event)
        await asyncio.sleep(self.linger_s)
        await resp.write_eof()
        return resp


def read_output(raw: bytes, streamed: bool) -> tuple[str, list[dict[str, Any]]]:
    """The response id and output items a client keeps, read independently of the proxy."""
    if not streamed:
        obj = json.loads(raw)
        return obj["id"], obj["output"]
    events = [json.loads(line[6:]) for line in raw.decode().splitlines()
              if line.startswith("data: ")]
    done = [e["response"] for e in events if e["type"] == "response.completed"]
    return done[0]["id"], done[0]["output"]


@dataclass
class RAgent:
    """A Responses API client: its items, resent whole, or chained (`chain`)."""

    http: aiohttp.ClientSession
    url: str
    stream: bool = True
    chain: bool = False
    path: str = RESPONSES
    instructions: str = "You are a careful agent."
    items: list[Any] = field(default_factory=list)  # all, as the client sees them
    sent: int = 0  # items the server already holds (chain)
    last_id: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "fake", "instructions": self.instructions, "stream": self.stream,
            "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]}
        if self.chain and self.last_id is not None:
            body.update(previous_response_id=self.last_id, input=self.items[self.sent:])
        else:
            body["input"] = self.items
        return body

    async def call(self) -> list[dict[str, Any]]:
        async with self.http.post(self.url + self.path, json=self.body()) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw
        self.last_id, output = read_output(raw, self.stream)
        self.items.extend(output)
        self.sent = len(self.items)
        return output

    def user(self, text: str) -> None:
        self.items.append({"role": "user", "content": text})

    def results(self, outputs: dict[str, str]) -> None:
        self.items.extend({"type": "function_call_output", "call_id": i, "output": o}
                          for i, o in outputs.items())


@asynccontextmanager
async def responses_recording(tmp_path: Path, **kw: Any
                              ) -> AsyncIterator[tuple[FakeResponses, Proxy,
                                                       aiohttp.ClientSession]]:
    """A fake Responses upstream, a recording proxy before it (tmp_path/rec) and a client
    session; the recording is closed on the way out."""
    fake = FakeResponses()
    await fake.start()
    proxy = await start_recording(ProxyConfig(fake.url, "127.0.0.1", 0, tmp_path / "rec", **kw))
    http = aiohttp.ClientSession()
    try:
        yield fake, proxy, http
    finally:
        await http.close()
        await proxy.stop()
        await fake.stop()


def test_the_fake_streams_what_it_answers_whole() -> None:
    r = RReply(text="two words", tools=[("call_1", "bash", {"cmd": "ls"})])
    whole = json.dumps(response_object(r, "resp_1")).encode()
    assert read_output(whole, False) == read_output(b"".join(stream_events(r, "resp_1")), True)
