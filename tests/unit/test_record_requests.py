"""Requests the recording proxy cannot forward as they are: credentials in both the upstream URL
and the client's request (one is sent: the URL's), requests it cannot read (a 400 and one line on
stderr, never a traceback), a failure inside the proxy (never recorded `ok`), and an upstream
that is the proxy itself (refused at the start)."""

from __future__ import annotations

import asyncio
import base64
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.errors import InputError
from harness.proxy import proxy as proxy_module
from harness.proxy.proxy import ProxyConfig
from harness.proxy.serve import start_recording
from harness.proxy.store import read_recording
from tests.unit.test_record_fakes import CHAT, recording

BODY = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}


def calls(folder: Path) -> list[dict[str, Any]]:
    return [e for _, e in read_recording(folder).events if e["ev"] == "call"]


def quiet_but(capsys: pytest.CaptureFixture[str], start: str) -> list[str]:
    """The lines on stderr: each starting with `start`, no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert all(x.startswith(start) for x in lines), err
    return lines


async def test_the_upstream_urls_credentials_win_over_the_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with recording(tmp_path, userinfo="alice:p%40ss@") as (fake, proxy, http):
        async with http.post(proxy.url + CHAT, json=BODY,
                             headers={"Authorization": "Bearer client-key"}) as resp:
            assert resp.status == 200
        async with http.post(proxy.url + CHAT, json=BODY) as resp:  # none of its own
            assert resp.status == 200
    basic = "Basic " + base64.b64encode(b"alice:p@ss").decode()
    assert [h["Authorization"] for _, h, _ in fake.requests] == [basic, basic]
    assert [(c["outcome"], c["status"]) for c in calls(tmp_path / "rec")] == [("ok", 200)] * 2
    assert quiet_but(capsys, "harness record:") == []


async def test_a_failure_inside_the_proxy_is_one_line_and_never_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("broken\nsecond line")

    async with recording(tmp_path) as (fake, proxy, http):
        monkeypatch.setattr(proxy_module, "forwarded", broken)
        async with http.post(proxy.url + CHAT, json=BODY) as resp:
            assert resp.status == 500
    assert fake.requests == []
    (call,) = calls(tmp_path / "rec")
    assert (call["outcome"], call["status"], call["error"]) == ("unreachable", None,
                                                                 "RuntimeError")
    (line,) = quiet_but(capsys, "harness record: ")
    assert "RuntimeError: broken" in line


BAD = {
    "absolute-form": b"GET http://host:9/x HTTP/1.1\r\nHost: h\r\n\r\n",
    "absolute-form-llm": b"POST http://host:9/v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                         b"Content-Length: 2\r\n\r\n{}",
    "asterisk": b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
    "authority": b"CONNECT host:443 HTTP/1.1\r\nHost: h\r\n\r\n",
    "chunk-size": b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "chunk-size-late": b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n|zz\r\nabc\r\n0\r\n\r\n",
    "chunk-end": b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n5\r\nabc\r\n0\r\n\r\n",
    "nul-method": b"G\x00T / HTTP/1.1\r\nHost: h\r\n\r\n",
    "200-KB-header": b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"s" * 200_000 + b"\r\n\r\n",
    "version": b"GET / HTTP/9.9\r\nHost: h\r\n\r\n",
    "content-length": b"POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n",
    "both-lengths": b"POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "control-in-header": b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n",
}


async def _send(url: str, raw: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    for i, part in enumerate(raw.split(b"|")):
        if i:
            await asyncio.sleep(0.2)  # after the headers went to the handler
        writer.write(part)
        await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)  # the proxy closes the connection
    finally:
        writer.close()


@pytest.mark.parametrize("name", list(BAD))
async def test_a_request_the_proxy_cannot_read_gets_a_400_and_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    async with recording(tmp_path) as (fake, proxy, _):
        answer = await _send(proxy.url, BAD[name])
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:200]
    assert fake.requests == []
    (line,) = quiet_but(capsys, "harness record: bad request (400) from 127.0.0.1: ")
    assert b"sss" not in line.encode()  # what the client sent is not quoted
    assert all(c["outcome"] != "ok" for c in calls(tmp_path / "rec"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_an_upstream_that_is_the_proxy_itself_is_refused(tmp_path: Path,
                                                                host: str) -> None:
    port = _free_port()
    config = ProxyConfig(f"http://{host}:{port}/v1", "127.0.0.1", port, tmp_path / "rec")
    with pytest.raises(InputError, match=r"^--upstream .* is the proxy's own --listen") as err:
        await start_recording(config)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "rec").exists()  # nothing left behind
    with socket.socket() as s:  # and the address is free again
        s.bind(("127.0.0.1", port))


async def test_an_upstream_on_another_port_of_this_machine_is_not_refused(
        tmp_path: Path) -> None:
    port = _free_port()
    config = ProxyConfig(f"http://localhost:{port + 1 if port < 65535 else port - 1}",
                         "127.0.0.1", port, tmp_path / "rec")
    proxy = await start_recording(config)
    await proxy.stop()
