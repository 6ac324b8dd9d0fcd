"""The HTTP/1.1 transport under the client: body framings, keep-alive reuse after a finished
stream, hanging up, credentials from the URL, idle expiry, closing, one-line failures."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from harness.adapters.connection import Origin
from harness.adapters.http import HttpClient, connect

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """One request's line, headers (lower-case names) and body; None at EOF."""
    line = await reader.readline()
    if not line:
        return None
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = h.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return {"line": line.decode().strip(), "headers": headers, "body": body}


class Server:
    """A raw asyncio server: `reply(request)` returns the bytes to answer each request with, or
    None to drop the connection; every connection and request is counted."""

    def __init__(self, reply: Callable[[dict[str, Any]], bytes | None]) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.closed_by_client = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while (req := await _read_request(reader)) is not None:
            self.requests.append(req)
            answer = self.reply(req)
            if answer is None:
                break
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer:
                break
        else:
            self.closed_by_client += 1
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        self.server.close()


def _chunked(*pieces: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body


def _sse(*events: bytes) -> bytes:
    return _chunked(*(b"data: " + e + b"\n\n" for e in events))


def _run(reply: Callable[[dict[str, Any]], bytes | None],
         body: Callable[[HttpClient], Awaitable[Any]], url_user: str = ""
         ) -> tuple[Any, Server]:
    server = Server(reply)

    async def go() -> Any:
        async with server as url:
            async with connect(url.replace("//", f"//{url_user}"), 4) as http:
                result = await body(http)
            await asyncio.sleep(0.05)  # the server sees the client's hang-ups
            return result

    return asyncio.run(go()), server


def test_streams_that_end_with_done_leave_their_connection_for_the_next_call() -> None:
    async def calls(http: HttpClient) -> list[Any]:
        got: list[Any] = []
        for _ in range(5):
            assert await http.stream("/s", {}, lambda c: got.append(c) is None) is None
        return got

    got, server = _run(lambda _: _sse(b'{"a": 1}', b"[DONE]"), calls)
    assert got == [{"a": 1}] * 5 and server.connections == 1 and len(server.requests) == 5


def test_hanging_up_closes_the_connection_so_the_server_stops() -> None:
    async def calls(http: HttpClient) -> list[Any]:
        got: list[Any] = []
        for _ in range(2):
            assert await http.stream("/s", {}, lambda c: bool(got.append(c))) is None
        return got

    got, server = _run(lambda _: _sse(b'{"a": 1}', b'{"a": 2}', b'{"a": 3}'), calls)
    assert got == [{"a": 1}] * 2 and server.connections == 2


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"n\":1}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"n\r\n4\r\n\":1}\r\n0\r\n\r\n",
])
def test_length_and_chunked_bodies_are_read_whole_on_one_connection(answer: bytes) -> None:
    async def calls(http: HttpClient) -> list[Any]:
        return [await http.get_json("/x") for _ in range(3)]

    got, server = _run(lambda _: answer, calls)
    assert got == [{"n": 1}] * 3 and server.connections == 1


def test_a_body_that_ends_with_its_connection_is_complete() -> None:
    got, _ = _run(lambda _: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"n\":2}",
                  lambda http: http.get_json("/x"))
    assert got == {"n": 2}


def test_url_credentials_become_basic_authorization_and_the_path_a_prefix() -> None:
    async def call(http: HttpClient) -> Any:
        return await http.post_json("/slots/0?action=erase", {"k": 1})

    got, server = _run(lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", call,
                       url_user="me:p%40ss@")
    req = server.requests[0]
    assert got == (200, {})
    assert req["line"] == "POST /slots/0?action=erase HTTP/1.1" and req["body"] == b'{"k":1}'
    assert req["headers"]["authorization"] == "Basic " + base64.b64encode(b"me:p@ss").decode()
    assert Origin.parse("http://h:81/v1").base_path == "/v1"
    assert Origin.parse("https://h/").port == 443


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        Origin.parse("http://h", {"X-A": "1\r\nX-B: 2"})


def test_idle_connections_past_the_keepalive_are_not_reused(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr("harness.adapters.http.KEEPALIVE_S", 0.1)

    async def calls(http: HttpClient) -> None:
        await http.get_json("/x")
        await asyncio.sleep(0.3)
        await http.get_json("/x")

    _, server = _run(lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", calls)
    assert server.connections == 2


def test_leaving_closes_every_connection() -> None:
    async def calls(http: HttpClient) -> None:
        await asyncio.gather(*(http.get_json("/x") for _ in range(4)))

    _, server = _run(lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", calls)
    assert server.connections == 4 and server.closed_by_client == 4


def test_a_refused_connection_is_one_line() -> None:
    async def go() -> str | None:
        async with connect("http://127.0.0.1:9", 2) as http:
            return await http.stream("/s", {}, lambda _: True)

    err = asyncio.run(go())
    assert err is not None and err.startswith("ConnectError: cannot connect to 127.0.0.1:9")
    assert "\n" not in err


def test_a_malformed_answer_is_a_transport_error() -> None:
    from harness.adapters.http import REQUEST_ERRORS

    async def call(http: HttpClient) -> Any:
        with pytest.raises(REQUEST_ERRORS, match="malformed"):
            await http.get_json("/x")

    _run(lambda _: b"HTTQ/9 nonsense\r\n\r\n", call)


def test_a_cancelled_request_closes_its_connection() -> None:
    async def call(http: HttpClient) -> None:
        task = asyncio.create_task(http.get_json("/x"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert http.pool.gate.held == 0

    def never(_: dict[str, Any]) -> bytes | None:
        return b""  # the answer never comes

    _, server = _run(never, call)
    assert server.connections == 1
