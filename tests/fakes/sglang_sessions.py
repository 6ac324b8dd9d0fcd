"""Streaming and radix sessions in front of the fake SGLang server (tests.fakes.sglang_server).

The front serves what SGLang 0.5.23 does for sessions and passes every other request to the fake
server behind it: `/open_session` (streaming only with `streaming_sessions`; an id already open
is refused), `/close_session` (200 for any id), and `/generate` with `session_params`, whose
`input_ids` are appended to what the session holds (every finished turn's input and output)
before the fake server serves the whole context; a closed id is refused in-stream with a
placeholder token and an abort, as the real server does. Closing a streaming session frees its
KV but its first turn's prompt, as measured on the real server: the fake's cache then keeps only
that prompt of what the session's turns cached. `requests` holds what the client sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.sglang_server import FakeSglangState


@dataclass
class FakeSession:
    name: str
    timeout: float | None
    context: list[int] = field(default_factory=list)
    published: int = 0  # the first turn's prompt, left in the cache when it closes
    cached: list[tuple[str, list[int]]] = field(default_factory=list)  # what its turns cached


@dataclass
class SessionFront:
    base: FakeSglangState
    streaming_sessions: bool = True
    session_radix_cache: bool = False
    sessions: dict[str, FakeSession] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)


FRONT: web.AppKey[SessionFront] = web.AppKey("session_front", SessionFront)


def make_front(base_url: str, base: FakeSglangState, streaming_sessions: bool = True,
               session_radix_cache: bool = False) -> web.Application:
    """The front's application, passing requests on to the fake server at `base_url`."""
    front = SessionFront(base, streaming_sessions, session_radix_cache)
    app = web.Application()
    app[FRONT] = front

    async def passed_on(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as client, client.request(
                request.method, base_url + request.path, data=await request.read(),
                headers={"Content-Type": "application/json"}) as r:
            body = await r.read()
            if request.path == "/server_info":
                info = json.loads(body)
                info["enable_streaming_session"] = front.streaming_sessions
                info["enable_session_radix_cache"] = front.session_radix_cache
                return web.json_response(info)
            return web.Response(body=body, status=r.status, content_type=r.content_type)

    async def open_session(request: web.Request) -> web.Response:
        body = await request.json()
        front.requests.append(("/open_session", body))
        if body.get("streaming") and not front.streaming_sessions:
            return web.json_response({"error": {"message": "Streaming sessions are disabled."}},
                                     status=400)
        name = body.get("session_id")
        if name in front.sessions:
            return web.json_response({"error": {"message": "Failed to open the session."}},
                                     status=400)
        front.sessions[name] = FakeSession(name, body.get("timeout"))
        return web.json_response(name)

    async def close_session(request: web.Request) -> web.Response:
        body = await request.json()
        front.requests.append(("/close_session", body))
        session = front.sessions.pop(body["session_id"], None)
        if session is not None:
            front.closed.append(session.name)
            for key, seq in session.cached:  # its KV is freed, but its first prompt
                with_key = front.base.cached.get(key, [])
                if seq in with_key:
                    with_key.remove(seq)
                with_key.append(session.context[:session.published])
        return web.Response(status=200)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        front.requests.append(("/generate", dict(body)))  # as sent, before it is expanded
        params = body.pop("session_params", None)
        if params is None:
            return await _forward_stream(request, base_url, body)
        session = front.sessions.get(params["id"])
        if session is None:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            gone = {"output_ids": [227], "meta_info": {
                "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "abort", "status_code": 400, "message":
                                  f"Invalid request: session id {params['id']} does not exist"}}}
            await resp.write(f"data: {json.dumps(gone)}\n\ndata: [DONE]\n\n".encode())
            return resp
        first = not session.context
        body["input_ids"] = session.context + list(body["input_ids"])
        resp, output, ok = await _relay(request, base_url, body)
        if ok:
            if first:
                session.published = len(body["input_ids"])
            session.context = body["input_ids"] + output
            session.cached.append((body.get("extra_key") or "", body["input_ids"] + output[:-1]))
        return resp

    app.router.add_post("/open_session", open_session)
    app.router.add_post("/close_session", close_session)
    app.router.add_post("/generate", generate)
    app.router.add_route("*", "/{tail:.*}", passed_on)
    return app


async def _forward_stream(request: web.Request, base_url: str, body: dict[str, Any]
                          ) -> web.StreamResponse:
    resp, _, _ = await _relay(request, base_url, body)
    return resp


async def _relay(request: web.Request, base_url: str, body: dict[str, Any]
                 ) -> tuple[web.StreamResponse, list[int], bool]:
    """Pass a /generate on and its answer back: (the response, the output ids, whether the
    request finished by length)."""
    output: list[int] = []
    ok = False
    last: dict[str, Any] = {"output_ids": [], "meta_info": {}}
    async with aiohttp.ClientSession() as client, client.post(base_url + "/generate",
                                                                json=body) as r:
        if r.content_type != "text/event-stream":  # an error
            return web.Response(body=await r.read(), status=r.status,
                                content_type=r.content_type), output, False
        streamed = bool(body.get("stream"))
        resp = web.StreamResponse(status=r.status, headers={"Content-Type": "text/event-stream"})
        if streamed:
            await resp.prepare(request)
        async for line in r.content:
            if streamed:
                await resp.write(line)
            text = line.decode().strip()
            if text.startswith("data:") and text[5:].strip() != "[DONE]":
                last = json.loads(text[5:])
                output = list(last.get("output_ids") or output)
                finish = (last.get("meta_info") or {}).get("finish_reason") or {}
                ok = finish.get("type") == "length"
        if not streamed:  # the fake server always streams: the last chunk is the answer
            return web.json_response(last), output, True
        return resp, output, ok
