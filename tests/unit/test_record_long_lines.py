"""A stream's line is searched for its end once, however it arrives: a stream without line
breaks is read in time linear in its size, what is held of one line is bounded (a line over
answers.MAX_SSE_LINE is skipped, unread, and counted), and what follows it is read as usual."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from harness.proxy.answers import MAX_SSE_LINE, OPENAI_CHAT, FirstToken, parse_answer
from harness.proxy.store import META, read_recording
from tests.unit.test_record_fakes import CHAT, recording
from tests.unit.test_record_unreadable import upstream

TOKEN = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
USAGE = (b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
         b'"usage": {"prompt_tokens": 5, "completion_tokens": 1}}\n\ndata: [DONE]\n\n')
NO_BREAK = b"x" * (4 * 1024 * 1024)  # 4 MiB without a line break


def test_a_line_is_found_across_many_small_chunks() -> None:
    first = FirstToken(OPENAI_CHAT)
    found = [i for i in range(len(TOKEN)) if first.feed(TOKEN[i:i + 1])]
    assert found == [TOKEN.index(b"\n")]


def test_a_stream_without_line_breaks_holds_at_most_the_bound_and_is_skipped() -> None:
    first = FirstToken(OPENAI_CHAT)
    held = 0
    for _ in range(0, len(NO_BREAK) * 2, 1024):  # 8 MiB in 1 KiB chunks
        assert not first.feed(NO_BREAK[:1024])
        held = max(held, first.held)
    assert held <= MAX_SSE_LINE and first.long_lines == 1
    assert not first.feed(b"\n")  # the end of the long line: skipped, unread
    assert first.feed(TOKEN) and first.long_lines == 1 and first.held == 0


def test_a_line_at_the_bound_is_read_and_one_past_it_is_not() -> None:
    line = b"data: " + json.dumps({"choices": [{"delta": {"content": "x" * 100}}]}).encode()
    pad = line + b" " * (MAX_SSE_LINE - len(line))
    assert FirstToken(OPENAI_CHAT).feed(pad + b"\n")
    over = FirstToken(OPENAI_CHAT)
    assert not over.feed(pad + b" \n") and over.long_lines == 1


def test_the_recorders_parse_skips_and_counts_a_line_over_the_bound() -> None:
    ans = parse_answer(OPENAI_CHAT, b"data: " + NO_BREAK * 2 + b"\n\n" + TOKEN + USAGE, True)
    assert ans.long_lines == 1 and ans.readable and ans.message["content"] == "hi"
    assert ans.usage is not None and (ans.usage.prompt, ans.usage.output) == (5, 1)


@pytest.mark.parametrize("size", [MAX_SSE_LINE - 100, 4 * 1024 * 1024, 2 * MAX_SSE_LINE + 5])
async def test_a_stream_without_line_breaks_through_the_proxy(
        tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.unit.test_record_unreadable as fake

    async def long_line(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: ")
        for i in range(0, size, 1024):
            await resp.write(b"y" * min(1024, size - i))
        await resp.write(b"\n\n" + TOKEN + USAGE)
        await resp.write_eof()
        return resp

    monkeypatch.setattr(fake, "_answer", long_line)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with upstream() as url, recording(tmp_path, upstream=url) as (_, proxy, http), \
            http.post(proxy.url + CHAT, json=body) as resp:
        got = await resp.read()
    assert len(got) == 6 + size + 2 + len(TOKEN) + len(USAGE)
    (call,) = [e for _, e in read_recording(tmp_path / "rec").events if e["ev"] == "call"]
    assert (call["outcome"], call["usage"]["output"]) == ("ok", 1)
    assert call["first_token"] is not None and call.get("long_lines", 0) == (
        1 if len(b"data: ") + size > MAX_SSE_LINE else 0)
    counts = json.loads((tmp_path / "rec" / META).read_text())["counts"]
    assert counts.get("long_lines", 0) == call.get("long_lines", 0)
