"""A server of known delays that speaks the part of llama-server's protocol the harness uses.

Raw asyncio (no web framework), so its own overhead is a few tens of microseconds: whatever a
client measures beyond the configured delays is the client's. `/completion` streams one token
per `itl_ms` after `ttft_ms`; slots keep their context, so cache reuse (`timings.cache_n`) is
what a real server reports; slot save, restore and erase answer at once. Run it in a process of
its own (`python -m harness.selftest.stub --port P --ttft-ms 50`), on a core of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

# How early the loop's timer is asked to wake before a delay ends: more than its resolution.
_TIMER_SLACK_S = 0.002
_REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request"}


@dataclass
class StubConfig:
    ttft_ms: float = 50.0  # request received -> first token
    itl_ms: float = 0.0  # between tokens
    slots: int = 64
    ctx_per_slot: int = 8192
    vocab: int = 32000


@dataclass
class _State:
    cfg: StubConfig
    cache: dict[int, list[int]] = field(default_factory=dict)
    saved: dict[str, list[int]] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)
    requests: int = 0


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    length = 0
    while (header := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return method, target, body


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n")
    return head.encode() + body


def _json(status: int, data: Any) -> bytes:
    # orjson: a /slots of thousands of slots costs the stub's core milliseconds with the
    # stdlib's encoder, time in which its known delays would slip.
    return _response(status, orjson.dumps(data))


def _get(state: _State, path: str) -> bytes:
    cfg = state.cfg
    if path == "/health":
        return _json(200, {"status": "ok"})
    if path == "/props":
        return _json(200, {"total_slots": cfg.slots, "build_info": "harness-stub",
                           "model_path": "stub.gguf",
                           "default_generation_settings": {"n_ctx": cfg.ctx_per_slot}})
    if path == "/v1/models":
        return _json(200, {"data": [{"id": "stub", "meta": {"n_vocab": cfg.vocab}}]})
    if path == "/slots":
        return _json(200, [{"id": i, "is_processing": i in state.busy,
                            "n_prompt_tokens": len(state.cache.get(i, []))}
                           for i in range(cfg.slots)])
    if path == "/metrics":
        text = (f"llamacpp:requests_processing {len(state.busy)}\n"
                f"llamacpp:prompt_tokens_total {state.requests}\n")
        return _response(200, text.encode(), "text/plain")
    return _json(404, {"error": f"no route {path}"})


def _slot_action(state: _State, path: str, body: dict[str, Any]) -> bytes:
    slot_part, _, query = path.partition("?")
    slot = int(slot_part.rsplit("/", 1)[1])
    action = query.partition("action=")[2]
    tokens = state.cache.get(slot, [])
    if action == "erase":
        state.cache.pop(slot, None)
        return _json(200, {"id_slot": slot, "n_erased": len(tokens)})
    name = str(body.get("filename", ""))
    if action == "save":
        state.saved[name] = list(tokens)
        return _json(200, {"id_slot": slot, "n_saved": len(tokens),
                           "n_written": 100 * len(tokens), "timings": {"save_ms": 0.01}})
    if action == "restore":
        state.cache[slot] = list(state.saved.get(name, []))
        n = len(state.cache[slot])
        return _json(200, {"id_slot": slot, "n_restored": n, "n_read": 100 * n,
                           "timings": {"restore_ms": 0.01}})
    return _json(400, {"error": f"unknown action {action}"})


async def _sleep_exactly(until: float) -> None:
    """Sleep until perf_counter() reaches `until`, to within tens of microseconds: the loop's
    timers fire on whole milliseconds (libuv's and epoll's resolution), so the last stretch is
    spent yielding to the loop. The stub has a core of its own; the spin costs only the stub."""
    coarse = until - time.perf_counter() - _TIMER_SLACK_S
    if coarse > 0:
        await asyncio.sleep(coarse)
    while time.perf_counter() < until:
        await asyncio.sleep(0)


async def _complete(state: _State, body: dict[str, Any], writer: asyncio.StreamWriter,
                    received: float) -> None:
    cfg = state.cfg
    prompt = [int(t) for t in body.get("prompt") or []]
    slot = int(body.get("id_slot", 0))
    n_predict = max(1, int(body.get("n_predict", 1)))
    old = state.cache.get(slot, [])
    cached = 0
    for a, b in zip(old, prompt, strict=False):
        if a != b:
            break
        cached += 1
    state.busy.add(slot)
    state.requests += 1
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
    await _sleep_exactly(received + cfg.ttft_ms / 1000.0)
    out: list[int] = []
    for i in range(n_predict):
        if i and cfg.itl_ms > 0:
            await writer.drain()
            await _sleep_exactly(time.perf_counter() + cfg.itl_ms / 1000.0)
        token = 300 + (len(prompt) + i) % 1000
        out.append(token)
        if i < n_predict - 1:
            data = b'data: {"tokens": [%d], "stop": false}\n\n' % token
        else:
            timings = {"cache_n": cached, "prompt_n": len(prompt) - cached,
                       "prompt_ms": cfg.ttft_ms, "predicted_ms": cfg.itl_ms * (n_predict - 1)}
            data = b"data: " + orjson.dumps({"tokens": [token], "stop": True,
                                             "timings": timings}) + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        if i == 0:
            await writer.drain()  # the first token goes out at once
    writer.write(b"0\r\n\r\n")
    state.cache[slot] = prompt + out
    state.busy.discard(slot)


async def _serve_connection(state: _State, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    try:
        while (req := await _read_request(reader)) is not None:
            received = time.perf_counter()
            method, path, raw = req
            body = orjson.loads(raw) if raw else {}
            if method == "POST" and path == "/completion":
                await _complete(state, body, writer, received)
            elif method == "POST" and path.startswith("/slots/"):
                writer.write(_slot_action(state, path, body))
            elif method == "GET":
                writer.write(_get(state, path))
            else:
                writer.write(_json(404, {"error": f"no route {method} {path}"}))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client hung up (a cancelled stream): nothing to answer
    finally:
        writer.close()


async def serve(cfg: StubConfig, host: str = "127.0.0.1", port: int = 0,
                started: asyncio.Future[int] | None = None) -> None:
    """Serve until cancelled; `started` gets the port once listening."""
    state = _State(cfg)
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(state, r, w), host, port, backlog=4096)
    if started is not None:
        started.set_result(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--slots", type=int, default=64)
    a = ap.parse_args()
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(StubConfig(a.ttft_ms, a.itl_ms, a.slots), port=a.port))


if __name__ == "__main__":
    main()
