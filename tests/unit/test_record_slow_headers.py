"""A connection that does not send a request's whole headers within HEADER_TIMEOUT_S of
opening (or of a next request's first byte) is closed, with one line on stderr; a request whose
headers came in time is not cut however slowly its body follows, and an idle kept-alive
connection is not closed by it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.proxy import httpserver
from tests.unit.test_record_fakes import CHAT, recording

TIMEOUT_S = 0.3
BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"}]}).encode()
REQUEST = (f"POST {CHAT} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY


@pytest.fixture(autouse=True)
def _short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserver, "HEADER_TIMEOUT_S", TIMEOUT_S)


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n")
                  if x.lower().startswith(b"content-length:"))
    return head + await asyncio.wait_for(reader.readexactly(length), 10)


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/comp", REQUEST[:60]],
                         ids=["nothing", "part-of-the-line", "part-of-the-headers"])
async def test_a_connection_without_whole_headers_in_time_is_closed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sent: bytes) -> None:
    async with recording(tmp_path) as (fake, proxy, _):
        conns = [await _open(proxy.url) for _ in range(5)]
        for _, writer in conns:
            writer.write(sent)
        for reader, writer in conns:  # each closed by the proxy, nothing answered
            assert await asyncio.wait_for(reader.read(), 10 * TIMEOUT_S + 5) == b""
            writer.close()
    assert fake.requests == []
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "harness record: connection from 127.0.0.1 closed: no whole request headers within "
        f"{TIMEOUT_S:g} s"] * 5


async def test_headers_in_time_are_served_however_slowly_the_body_follows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with recording(tmp_path) as (fake, proxy, _):
        reader, writer = await _open(proxy.url)
        cut = REQUEST.index(b"\r\n\r\n") + 4
        for part in (REQUEST[:20], REQUEST[20:cut]):  # the headers in two pieces, in time
            writer.write(part)
            await asyncio.sleep(TIMEOUT_S / 3)
        await asyncio.sleep(2 * TIMEOUT_S)  # the body, late
        writer.write(REQUEST[cut:])
        first = await _answer(reader)
        await asyncio.sleep(2 * TIMEOUT_S)  # idle, kept alive
        writer.write(REQUEST)  # a second request on the same connection
        second = await _answer(reader)
        writer.close()
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    assert len(fake.requests) == 2
    assert capsys.readouterr().err == ""


async def test_a_next_request_that_stalls_in_its_headers_is_closed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with recording(tmp_path) as (fake, proxy, _):
        reader, writer = await _open(proxy.url)
        writer.write(REQUEST)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        writer.write(REQUEST[:30])
        assert await asyncio.wait_for(reader.read(), 10 * TIMEOUT_S + 5) == b""
        writer.close()
    assert len(fake.requests) == 1
    assert capsys.readouterr().err.count("no whole request headers") == 1
