"""A very long answer is relayed whole, but what the proxy keeps of it for the recorder is
bounded (harness.proxy.kept): a 50 MB stream leaves its head and last MiB, its usage and end
still read from the tail; a whole body past the bound is recorded `unreadable`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import tests.unit.test_record_unreadable as fake
from harness.proxy.kept import KEEP_HEAD, KEEP_TAIL, Kept
from harness.proxy.recorder import CallMeta, Recorder
from harness.proxy.store import read_recording
from harness.traces.importers import import_trace
from tests.unit.test_record_fakes import CHAT, recording

EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "word "}}]}\n\n'
END = (b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
       b'"usage": {"prompt_tokens": 9, "completion_tokens": 777}}\n\ndata: [DONE]\n\n')
BLOCK = EVENT * (64 * 1024 // len(EVENT))  # about 64 KiB of whole events
SIZE = 50 * 1000 * 1000


def test_what_is_kept_is_bounded_and_keeps_the_head_and_the_tail() -> None:
    kept = Kept()
    most = 0
    for i in range(0, SIZE, len(BLOCK)):
        kept.add(BLOCK if i else b"HEAD" + BLOCK)
        most = max(most, kept.size)
    kept.add(b"TAIL")
    assert most <= KEEP_HEAD + KEEP_TAIL + len(BLOCK)
    raw = kept.bytes()
    assert raw is not None and len(raw) == kept.size + 2
    assert raw.startswith(b"HEAD") and raw.endswith(b"TAIL")
    assert kept.dropped == SIZE // len(BLOCK) * len(BLOCK) + len(BLOCK) + 8 - kept.size


def test_an_answer_under_the_bound_is_kept_whole() -> None:
    kept = Kept()
    assert kept.bytes() is None
    for part in (b"a", b"b" * 1000, b"c"):
        kept.add(part)
    assert (kept.bytes(), kept.dropped) == (b"a" + b"b" * 1000 + b"c", 0)


async def _big(request: web.Request) -> web.StreamResponse:
    stream = json.loads(await request.read()).get("stream")
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream" if stream else "application/json"})
    await resp.prepare(request)
    if stream:
        for _ in range(SIZE // len(BLOCK)):
            await resp.write(BLOCK)
        await resp.write(END)
    else:  # one JSON answer of 20 MiB
        await resp.write(b'{"choices": [{"index": 0, "message": {"role": "assistant", '
                         b'"content": "' + b"w" * (KEEP_HEAD + 4 * 1024 * 1024) + b'"}}]}')
    await resp.write_eof()
    return resp


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_50_mb_answer_through_the_proxy(tmp_path: Path, stream: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[int] = []
    ended = Recorder.ended

    def watch(self: Recorder, m: CallMeta, request: bytes, response: bytes | None) -> None:
        handed.append(len(response or b""))
        ended(self, m, request, response)

    monkeypatch.setattr(Recorder, "ended", watch)
    monkeypatch.setattr(fake, "_answer", _big)
    body: dict[str, Any] = {"model": "m", "stream": stream,
                            "messages": [{"role": "user", "content": "x"}]}
    async with fake.upstream() as url, recording(tmp_path, upstream=url) as (_, proxy, http), \
            http.post(proxy.url + CHAT, json=body) as resp:
        relayed = 0
        async for chunk in resp.content.iter_any():
            relayed += len(chunk)
    (kept,) = handed
    assert kept <= KEEP_HEAD + KEEP_TAIL + 256 * 1024
    (call,) = [e for _, e in read_recording(tmp_path / "rec").events if e["ev"] == "call"]
    assert call["answer_dropped"] == relayed - (kept - 2)  # less the blank line put between
    if stream:
        assert relayed == SIZE // len(BLOCK) * len(BLOCK) + len(END)
        assert (call["outcome"], call["finish"], call["usage"]) == ("ok", "stop", {
            "prompt": 9, "output": 777, "cached": None, "source": "usage"})
        assert call["answer"] == []  # the message is not whole: not hashed
        steps = import_trace("recording", tmp_path / "rec", {}).steps
        assert list(steps[steps["kind"] == "llm"]["output_tokens"]) == [777]
    else:
        assert (call["outcome"], call["error"]) == ("unreadable", "answer_too_large")
