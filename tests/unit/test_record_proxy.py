"""The recording proxy against an in-process fake upstream: what a client receives through it is
what it receives directly (bytes, status, headers), errors reach the client as the upstream gave
them (or as a one-line 502), a client that leaves cancels the upstream request, and each call is
recorded as it went."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.proxy.store import EVENTS, META, read_recording
from tests.unit.test_record_fakes import CHAT, COMPLETIONS, MESSAGES, Reply, recording

# Headers a server sets per response on its own (the time), or per connection.
VOLATILE = {"date", "transfer-encoding", "connection", "keep-alive"}


def events(folder: Path, kind: str = "call") -> list[dict[str, Any]]:
    return [e for _, e in read_recording(folder).events if e["ev"] == kind]


async def fetch(http: aiohttp.ClientSession, method: str, url: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with http.request(method, url, json=body, headers=headers) as resp:
        raw = await resp.read()
        kept = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in VOLATILE}
        return resp.status, kept, raw


CASES = [
    ("chat-stream", CHAT, True), ("chat", CHAT, False),
    ("completions-stream", COMPLETIONS, True), ("completions", COMPLETIONS, False),
    ("messages-stream", MESSAGES, True), ("messages", MESSAGES, False),
]


@pytest.mark.parametrize(("name", "path", "stream"), CASES, ids=[c[0] for c in CASES])
async def test_client_receives_what_a_direct_call_receives(tmp_path: Path, name: str,
                                                           path: str, stream: bool) -> None:
    body = ({"model": "fake", "prompt": "Once upon", "stream": stream} if path == COMPLETIONS
            else {"model": "fake", "max_tokens": 8, "stream": stream,
                  "messages": [{"role": "user", "content": "hello"}]})
    async with recording(tmp_path) as (fake, proxy, http):
        fake.default = Reply(text="a b c", tools=[] if path == COMPLETIONS
                             else [("call_1", "bash", {"cmd": "ls -l"})], prompt=20, output=9)
        direct = await fetch(http, "POST", fake.url + path, body)
        proxied = await fetch(http, "POST", proxy.url + path, body)
        models = await fetch(http, "GET", fake.url + "/v1/models")
        models_proxied = await fetch(http, "GET", proxy.url + "/v1/models")
    assert proxied == direct
    assert models_proxied == models and models[0] == 200
    assert proxied[1]["x-fake"] == "1"
    # the upstream got the request as the client sent it
    (_, h1, b1), (_, h2, b2) = fake.requests
    assert b2 == b1 and {k: v for k, v in h2.items() if k.lower() != "host"} == {
        k: v for k, v in h1.items() if k.lower() != "host"}
    rec = tmp_path / "rec"
    (call,) = events(rec)
    assert (call["outcome"], call["status"], call["stream"]) == ("ok", 200, stream)
    assert call["usage"] == {"prompt": 20, "output": 9, "cached": 0, "source": "usage"}
    assert (call["first_token"] is not None) == stream
    assert call["arrival"] <= (call["first_token"] or call["arrival"]) <= call["end"]
    if path != COMPLETIONS:
        assert [n for _, n in call["tool_calls"]] == ["bash"]
    (other,) = events(rec, "other")
    assert (other["method"], other["path"], other["status"]) == ("GET", "/v1/models", 200)


async def test_a_compressed_answer_stays_compressed_and_is_read(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    gz = {"Accept-Encoding": "gzip"}
    async with recording(tmp_path) as (fake, proxy, http):
        fake.default = Reply(text="squeezed", prompt=31, output=4, gzip=True)
        direct = await fetch(http, "POST", fake.url + CHAT, body, gz)
        proxied = await fetch(http, "POST", proxy.url + CHAT, body, gz)
    assert proxied == direct and direct[1]["content-encoding"] == "gzip"
    assert direct[2][:2] == b"\x1f\x8b"  # the client got the gzip bytes, as sent
    (call,) = events(tmp_path / "rec")
    assert call["usage"] == {"prompt": 31, "output": 4, "cached": 0, "source": "usage"}
    assert call["answer"][0][2] == "assistant"


async def test_error_status_is_relayed_and_recorded(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([Reply(status=503), Reply(status=503)])
        direct = await fetch(http, "POST", fake.url + CHAT, body)
        proxied = await fetch(http, "POST", proxy.url + CHAT, body)
    assert proxied == direct and direct[0] == 503
    (call,) = events(tmp_path / "rec")
    assert (call["outcome"], call["status"], call["error"]) == ("http_error", 503,
                                                                 "server_error")
    assert call["usage"] is None


async def test_unreachable_upstream_gives_a_one_line_502(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    async with recording(tmp_path, upstream="http://127.0.0.1:9") as (_, proxy, http):
        status, headers, raw = await fetch(http, "POST", proxy.url + CHAT, body)
    assert status == 502 and headers["content-type"].startswith("application/json")
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n")
    assert json.loads(raw)["error"]["type"] == "upstream_unreachable"
    (call,) = events(tmp_path / "rec")
    assert call["outcome"] == "unreachable" and call["error"].startswith("ClientConnector")
    assert call["status"] is None and call["usage"] is None


async def test_a_cut_stream_is_cut_for_the_client_too(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def read(http: aiohttp.ClientSession, url: str) -> tuple[bytes, str]:
        got = b""
        try:
            async with http.post(url, json=body) as resp:
                async for chunk in resp.content.iter_any():
                    got += chunk
        except aiohttp.ClientPayloadError as exc:
            return got, type(exc).__name__
        return got, "complete"

    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([Reply(text="one two three four", cut_after=3)] * 2)
        direct = await read(http, fake.url + CHAT)
        proxied = await read(http, proxy.url + CHAT)
    assert proxied == direct and direct[1] == "ClientPayloadError"
    assert direct[0].count(b"data:") == 3
    (call,) = events(tmp_path / "rec")
    assert call["outcome"] == "cut" and call["error"].startswith("ClientPayloadError")
    assert call["status"] == 200 and call["first_token"] is not None


async def test_a_client_that_leaves_cancels_the_upstream_request(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with recording(tmp_path) as (fake, proxy, http):
        fake.default = Reply(text=" ".join(["w"] * 200), gap_s=0.01)
        async with http.post(proxy.url + CHAT, json=body) as resp:
            first = await resp.content.readany()
            assert first.startswith(b"data:")
            resp.close()  # the client hangs up mid-stream
        for _ in range(200):  # the upstream notices within a few of its writes
            if fake.client_left:
                break
            await asyncio.sleep(0.01)
        assert fake.client_left == 1
        await asyncio.sleep(0.05)
    (call,) = events(tmp_path / "rec")
    assert call["outcome"] == "aborted" and call["end"] - call["arrival"] < 1.5


async def test_a_call_running_at_the_stop_is_recorded_stopped(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with recording(tmp_path) as (fake, proxy, http):
        fake.default = Reply(ttft_s=5.0)
        task = asyncio.create_task(fetch(http, "POST", proxy.url + CHAT, body))
        await asyncio.sleep(0.2)
        summary = await proxy.stop()
        with pytest.raises(aiohttp.ClientError):
            await task
    (call,) = events(tmp_path / "rec")
    assert call["outcome"] == "stopped"
    assert summary["counts"]["stopped"] == 1
    meta = json.loads((tmp_path / "rec" / META).read_text())
    assert meta["closed"] is True and meta["counts"]["calls"] == 1


async def test_the_recording_is_private(tmp_path: Path) -> None:
    async with recording(tmp_path) as _:
        pass
    rec = tmp_path / "rec"
    assert stat.S_IMODE(os.stat(rec).st_mode) == 0o700
    for p in rec.iterdir():
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p.name
    assert sorted(p.name for p in rec.iterdir()) == [EVENTS, META]


async def test_a_large_request_body_is_forwarded_whole(tmp_path: Path) -> None:
    text = "lorem ipsum dolor " * 200_000  # 3.6 MB: many reads
    body = {"model": "fake", "messages": [{"role": "user", "content": text}]}
    async with recording(tmp_path) as (fake, proxy, http):
        status, _, _ = await fetch(http, "POST", proxy.url + CHAT + "?trace=1", body)
    assert status == 200
    assert json.loads(fake.requests[0][2]) == body
    (call,) = events(tmp_path / "rec")
    assert call["blocks"][0][1] == 600_000  # the user block's tokens by the rule


class HangingUp:
    """An upstream that answers a connection's first request and closes the connection,
    unanswered, when a later one arrives on it (as llama-server does after a streamed answer,
    when its close reaches the proxy after the proxy reused the connection); with `every`, it
    closes every connection unanswered."""

    ANSWER = json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"},
         "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()

    def __init__(self, every: bool = False) -> None:
        self.every = every
        self.connections = 0
        self.answered = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = True
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                if self.every or not first:
                    return
                first = False
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(self.ANSWER) + self.ANSWER)
                await writer.drain()
                self.answered += 1
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_a_pooled_connection_the_upstream_closed_is_tried_once_more_on_a_new_one(
        tmp_path: Path) -> None:
    upstream = HangingUp()
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    async with recording(tmp_path, upstream=await upstream.start()) as (_, proxy, http):
        answers = [await fetch(http, "POST", proxy.url + CHAT, body) for _ in range(3)]
    await upstream.stop()
    assert [status for status, _, _ in answers] == [200] * 3
    assert all(raw == HangingUp.ANSWER for _, _, raw in answers)
    # 1: a new connection; 2 and 3: the pooled one hangs up, the new one answers
    assert (upstream.connections, upstream.answered) == (3, 3)
    assert [c["outcome"] for c in events(tmp_path / "rec")] == ["ok"] * 3


async def test_a_new_connection_the_upstream_closes_unanswered_is_not_tried_again(
        tmp_path: Path) -> None:
    upstream = HangingUp(every=True)
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    async with recording(tmp_path, upstream=await upstream.start()) as (_, proxy, http):
        status, _, raw = await fetch(http, "POST", proxy.url + CHAT, body)
    await upstream.stop()
    assert status == 502 and json.loads(raw)["error"]["type"] == "upstream_unreachable"
    assert (upstream.connections, upstream.answered) == (1, 0)
    (call,) = events(tmp_path / "rec")
    assert call["outcome"] == "unreachable" and call["error"] == "ServerDisconnectedError"
