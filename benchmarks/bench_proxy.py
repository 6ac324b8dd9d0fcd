"""What `harness record` adds to each call, against a direct connection in the same run.

A fake upstream in this process answers after a known delay (20 ms; a stream: its first token
then, the next ones 1 ms apart); the recording proxy runs as the real command (`python -m
harness record`, its own process, on another CPU where two or more are allowed). Each scenario
sends the same calls directly and through the proxy, alternating call by call (the machine's
speed drifts within a run), and compares the client's medians:

- added median latency per call (send -> whole answer read) <= 2 ms;
- added median time to the first token (streams) <= 2 ms.

Scenarios: OpenAI chat whole and streamed, Anthropic messages streamed, OpenAI Responses
whole and streamed (Codex's API), an agent's growing conversation (150 messages, about 60 KB
by the end: the recorder parses and hashes it all, off the relay path), and 8 clients at once.
Prints a table; exit 1 when a target is missed.

    .venv/bin/python benchmarks/bench_proxy.py [--calls 150]

BENCH_PROXY_CPU=same|none puts the proxy on this process's CPU, or leaves it unpinned (default
`other`: a CPU of its own where two or more are allowed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

DELAY_S = 0.020
TOKEN_GAP_S = 0.001
TOKENS = 8
TARGET_MS = 2.0


class Upstream:
    """The fake server: a whole answer after DELAY_S, or a stream whose first token comes then.
    It runs on an event loop of its own, in a thread of this process: the clients' work does not
    shift its timers."""

    def __init__(self) -> None:
        self.url = ""
        self.runner: web.AppRunner | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start_in_thread(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), self.loop).result(30)

    def stop_in_thread(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{path:.*}", self.answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        anthropic = request.path.endswith("/messages")
        responses = request.path.endswith("/responses")
        await asyncio.sleep(DELAY_S)
        if not body.get("stream") and responses:
            return web.json_response(_response_object())
        if not body.get("stream"):
            return web.json_response({
                "id": "c", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "w " * TOKENS}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": TOKENS}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(_response_events() if responses else _events(anthropic)):
            if i > 1:
                await asyncio.sleep(TOKEN_GAP_S)
            await resp.write(event)
        await resp.write_eof()
        return resp


def _events(anthropic: bool) -> list[bytes]:
    def sse(obj: Any) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
    if anthropic:
        return [sse({"type": "message_start", "message": {"model": "fake", "usage": {
            "input_tokens": 100, "output_tokens": 1}}}),
            sse({"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}}),
            *[sse({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "w "}}) for _ in range(TOKENS)],
            sse({"type": "content_block_stop", "index": 0}),
            sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                 "usage": {"output_tokens": TOKENS}}), sse({"type": "message_stop"})]
    return [sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
            *[sse({"choices": [{"index": 0, "delta": {"content": "w "}}]})
              for _ in range(TOKENS)],
            sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 100, "completion_tokens": TOKENS}}),
            b"data: [DONE]\n\n"]


def _response_object() -> dict[str, Any]:
    """A whole Responses API answer: one message of TOKENS words, with its usage."""
    return {"id": "resp_1", "object": "response", "status": "completed", "model": "fake",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                        "content": [{"type": "output_text", "text": "w " * TOKENS}]}],
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": TOKENS, "total_tokens": 100 + TOKENS}}


def _response_events() -> list[bytes]:
    """A streamed Responses API answer, as its named events: created, the message item, a
    text delta per token, completed (with the whole answer and its usage)."""
    def sse(obj: dict[str, Any]) -> bytes:
        return b"event: " + obj["type"].encode() + b"\ndata: " + json.dumps(obj).encode() \
            + b"\n\n"
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    return [sse({"type": "response.created", "response": {
        "id": "resp_1", "object": "response", "status": "in_progress", "model": "fake",
        "output": []}}),
        sse({"type": "response.output_item.added", "output_index": 0, "item": item}),
        *[sse({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
               "content_index": 0, "delta": "w "}) for _ in range(TOKENS)],
        sse({"type": "response.completed", "response": _response_object()})]


async def one_call(http: aiohttp.ClientSession, url: str, body: dict[str, Any]
                   ) -> tuple[float, float | None]:
    """(latency, time to first token) in seconds, as the client sees them."""
    t0 = time.perf_counter()
    first = None
    async with http.post(url, json=body) as resp:
        if body.get("stream"):
            async for chunk in resp.content.iter_any():
                if first is None and (b'"content": "w' in chunk or b"text_delta" in chunk
                                      or b"output_text.delta" in chunk):
                    first = time.perf_counter() - t0
        else:
            await resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - t0, first


Scenario = tuple[str, str, Callable[[int], dict[str, Any]], int]


def _chat(stream: bool) -> Callable[[int], dict[str, Any]]:
    return lambda i: {"model": "fake", "stream": stream,
                      "messages": [{"role": "user", "content": f"question {i}"}]}


def _responses(stream: bool) -> Callable[[int], dict[str, Any]]:
    return lambda i: {"model": "fake", "stream": stream, "instructions": "You are an agent.",
                      "input": [{"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": f"question {i}"}]}]}


def _growing(i: int) -> dict[str, Any]:
    """An agent's conversation: each call sends all before it plus a tool call and result."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 50},
                                  {"role": "user", "content": "fix the bug"}]
    for k in range(i % 75):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{k}.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "x = 1\n" * 60})
    return {"model": "fake", "stream": True, "messages": msgs}


def _anthropic(i: int) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 16, "stream": True,
            "messages": [{"role": "user", "content": f"question {i}"}]}


SCENARIOS: list[Scenario] = [
    ("chat, whole answer", "/v1/chat/completions", _chat(False), 1),
    ("chat, streamed", "/v1/chat/completions", _chat(True), 1),
    ("messages, streamed", "/v1/messages", _anthropic, 1),
    ("responses, whole answer", "/v1/responses", _responses(False), 1),
    ("responses, streamed", "/v1/responses", _responses(True), 1),
    ("chat, growing conversation", "/v1/chat/completions", _growing, 1),
    ("chat, streamed, 8 clients", "/v1/chat/completions", _chat(True), 8),
]


async def measure(upstream: str, proxy: str, scenario: Scenario, calls: int
                  ) -> dict[str, list[float]]:
    """Each client alternates a direct call and a proxied one, `calls` of each in all."""
    _, path, body, clients = scenario
    got: dict[str, list[float]] = {"direct": [], "proxied": [], "direct_ttft": [],
                                   "proxied_ttft": []}

    async def client(c: int) -> None:
        async with aiohttp.ClientSession() as http:
            for i in range(c, calls, clients):
                order = [("direct", upstream), ("proxied", proxy)]
                for name, base in order if i % 2 else order[::-1]:
                    lat, first = await one_call(http, base + path, body(i))
                    got[name].append(lat)
                    if first is not None:
                        got[name + "_ttft"].append(first)

    for warm in range(3):  # connections, caches
        async with aiohttp.ClientSession() as http:
            await one_call(http, proxy + path, body(warm))
    await asyncio.gather(*(client(c) for c in range(clients)))
    return got


def start_proxy(upstream: str, out: Path, cpu: int | None) -> tuple[subprocess.Popen[str], str]:
    """The real command, in a process of its own; its URL from the line it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "record", "--upstream", upstream, "--listen",
         "127.0.0.1:0", "--out", str(out)], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None
        else None)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("listening on "):
            return proc, line.split()[2].rstrip(";")
    raise SystemExit(f"the proxy did not start: {proc.wait()}")


async def main_async(calls: int) -> int:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    where = os.environ.get("BENCH_PROXY_CPU", "other")
    proxy_cpu = (cpus[1] if where == "other" and len(cpus) > 1 else cpus[0] if where == "same"
                 and cpus else None)
    if proxy_cpu is not None:
        os.sched_setaffinity(0, {cpus[0]})
    # Two event loops share this process (clients, upstream): a short switch interval keeps
    # either from waiting long for the other's GIL (the proxy's process does the same).
    sys.setswitchinterval(0.0005)
    upstream = Upstream()
    upstream.start_in_thread()
    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    proc, url = start_proxy(upstream.url, work / "rec", proxy_cpu)
    rows: list[tuple[str, str, float, float, float, float, bool]] = []
    try:
        for scenario in SCENARIOS:
            got = await measure(upstream.url, url, scenario, calls)
            for metric, key in (("latency", ""), ("first token", "_ttft")):
                d, p = got["direct" + key], got["proxied" + key]
                if not d:
                    continue
                added = (statistics.median(p) - statistics.median(d)) * 1e3
                p95 = (_q(p, 0.95) - _q(d, 0.95)) * 1e3
                rows.append((scenario[0], metric, statistics.median(d) * 1e3,
                             statistics.median(p) * 1e3, added, p95, added <= TARGET_MS))
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        upstream.stop_in_thread()
        shutil.rmtree(work, ignore_errors=True)
    print(f"upstream delay {DELAY_S * 1e3:.0f} ms (streams: first token then, {TOKENS} tokens "
          f"{TOKEN_GAP_S * 1e3:.0f} ms apart); {calls} calls per path per scenario; proxy on "
          f"CPU {proxy_cpu if proxy_cpu is not None else 'shared'}")
    print(f"{'scenario':<28} {'metric':<12} {'direct':>8} {'proxied':>8} {'added':>7} "
          f"{'added':>7} {'target':>7}")
    print(f"{'':<28} {'':<12} {'p50 ms':>8} {'p50 ms':>8} {'p50 ms':>7} {'p95 ms':>7}")
    for name, metric, d, p, added, p95, ok in rows:
        print(f"{name:<28} {metric:<12} {d:>8.2f} {p:>8.2f} {added:>+7.2f} {p95:>+7.2f} "
              f"{'<= ' + format(TARGET_MS, 'g'):>7}  {'OK' if ok else 'MISSED'}")
    print(out.strip())
    missed = [f"{n} ({m})" for n, m, *_, ok in rows if not ok]
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if missed else 0


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=150, help="calls per path per scenario")
    args = ap.parse_args()
    return asyncio.run(main_async(args.calls))


if __name__ == "__main__":
    sys.exit(main())
