"""A call whose upstream answered with nothing an answer can be read from (a 200 event stream
of random bytes, an empty 200, a gzip body that does not inflate) is recorded `unreadable`,
a redirect `http_error`, never `ok`; none of them is imported as an LLM step, and the client
still gets what the upstream sent."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from harness.proxy.store import META, read_recording
from harness.traces.importers import import_trace
from tests.unit.test_record_fakes import CHAT, MESSAGES, recording

GOOD = {"id": "c1", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}


def _noise(n: int) -> bytes:
    # random bytes: the odd line break, never a `data:` line of JSON
    return random.Random(7).randbytes(n)


async def _answer(request: web.Request) -> web.StreamResponse:
    mode = request.headers.get("X-Mode", "ok")
    if mode == "ok":
        return web.json_response(GOOD)
    if mode == "redirect":
        return web.Response(status=302, headers={"Location": "/elsewhere"}, text="moved")
    if mode == "empty":
        return web.Response(status=200, content_type="application/json")
    if mode == "bad-gzip":
        body = gzip.compress(json.dumps(GOOD).encode())
        return web.Response(body=body[:10] + b"\x00" * 40 + body[50:], headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"})
    if mode in ("noise", "noise-lines", "wrong-api", "pings"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "noise":
            await resp.write(_noise(64 * 1024))
        elif mode == "noise-lines":
            for _ in range(20):
                await resp.write(b"data: " + _noise(200).replace(b"\n", b"") + b"\n\n")
        elif mode == "pings":
            await resp.write(b'event: ping\ndata: {"type": "ping"}\n\n' * 3)
        else:  # JSON events, but of no API's shape
            for i in range(5):
                await resp.write(f"data: {json.dumps({'n': i})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    raise AssertionError(mode)


@asynccontextmanager
async def upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{path:.*}", _answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def calls(folder: Path) -> list[dict[str, Any]]:
    return [e for _, e in read_recording(folder).events if e["ev"] == "call"]


BAD = [("noise", True, "unreadable", "unparsable_answer", 200),
       ("noise-lines", True, "unreadable", "unparsable_answer", 200),
       ("wrong-api", True, "unreadable", "unparsable_answer", 200),
       ("empty", False, "unreadable", "empty_answer", 200),
       ("bad-gzip", False, "unreadable", "undecodable_body", 200),
       ("redirect", False, "http_error", None, 302)]


@pytest.mark.parametrize(("mode", "stream", "outcome", "error", "status"), BAD,
                         ids=[b[0] for b in BAD])
async def test_an_answer_that_cannot_be_read_is_not_ok_and_not_replayed(
        tmp_path: Path, mode: str, stream: bool, outcome: str, error: str | None,
        status: int) -> None:
    async with upstream() as url, recording(tmp_path, upstream=url) as (_, proxy, http):
        for m, text in (("ok", "first"), (mode, "second")):
            body = {"model": "fake", "stream": stream if m == mode else False,
                    "messages": [{"role": "user", "content": text}]}
            async with http.post(proxy.url + CHAT, json=body, headers={"X-Mode": m},
                                 allow_redirects=False) as resp:
                await resp.read()
                assert resp.status == (200 if m == "ok" else status)
    rec = tmp_path / "rec"
    good, bad = calls(rec)
    assert (good["outcome"], good["usage"]["source"]) == ("ok", "usage")
    assert (bad["outcome"], bad["error"], bad["status"]) == (outcome, error, status)
    assert bad["usage"] is None and bad["answer"] == [] and bad["tool_calls"] == []
    counts = json.loads((rec / META).read_text())["counts"]
    assert (counts["calls"], counts["ok"], counts[outcome]) == (2, 1, 1)
    imp = import_trace("recording", rec, {})
    assert list(imp.steps[imp.steps["kind"] == "llm"]["output_tokens"]) == [3]
    totals = imp.provenance.extra["totals"]
    assert (totals["calls"], totals["calls_ok"], totals["llm_steps"]) == (2, 1, 1)


async def test_an_anthropic_stream_of_pings_only_is_unreadable(tmp_path: Path) -> None:
    async with upstream() as url, recording(tmp_path, upstream=url) as (_, proxy, http), \
            http.post(proxy.url + MESSAGES, headers={"X-Mode": "pings"}, json={
                "model": "fake", "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": "x"}]}) as resp:
        assert resp.status == 200
        await resp.read()
    (call,) = calls(tmp_path / "rec")
    assert (call["outcome"], call["error"], call["usage"]) == (
        "unreadable", "unparsable_answer", None)
