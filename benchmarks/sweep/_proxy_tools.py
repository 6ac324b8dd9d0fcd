"""Plumbing for the proxy family: an upstream that answers in chosen hostile ways, the real
`harness record` started and stopped as a user would, raw and ordinary clients, and the
recording read back (its call lines, and its import's LLM steps).

The upstream runs on an event loop in a thread of the sweep's process; its answer is chosen by
the request's query (`?mode=NAME&...`), which the proxy forwards and does not record.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from sweep.core import HARNESS, _kill_group, _left_running

CHAT = "/v1/chat/completions"
PROMPT, OUTPUT = 11, 3  # the usage every answer of the upstream reports
GOOD_BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_events(text: str = "fine", usage: bool = True) -> list[bytes]:
    """A chat completions stream: a role chunk, one chunk per word, the end, usage, [DONE]."""
    def chunk(delta: dict[str, str]) -> bytes:
        return _sse({"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta}]})
    ev = [chunk({"role": "assistant"}), *(chunk({"content": w + " "}) for w in text.split())]
    ev.append(_sse({"id": "c", "model": "m",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if usage:
        ev.append(_sse({"id": "c", "model": "m", "choices": [],
                        "usage": {"prompt_tokens": PROMPT, "completion_tokens": OUTPUT}}))
    return [*ev, b"data: [DONE]\n\n"]


def chat_whole(text: str = "fine") -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": OUTPUT}}


class Upstream:
    """The hostile (or well-behaved) upstream; `seen` holds each request's method, path and
    headers (as lists: a header may come twice)."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[tuple[str, str, list[tuple[str, str]]]] = []
        self.client_left = 0
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Upstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, list(request.headers.items())))
        body = await request.read()
        q = request.query
        mode = q.get("mode", "ok")
        try:
            return await getattr(self, "_" + mode)(request, body, q)
        except (asyncio.CancelledError, ConnectionError):
            self.client_left += 1
            raise

    async def _stream(self, request: web.Request, events: list[bytes], gap: float = 0.0,
                      ctype: str = "text/event-stream") -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": ctype})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
            if gap:
                await asyncio.sleep(gap)
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ answers, by mode

    async def _ok(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        try:
            obj = json.loads(body) if body else {}
        except ValueError:
            return web.json_response({"error": {"type": "invalid_json"}}, status=400)
        if not isinstance(obj, dict):
            return web.json_response({"error": {"type": "not_an_object"}}, status=400)
        text = q.get("text", "fine")
        if obj.get("stream"):
            return await self._stream(request, chat_events(text), float(q.get("gap", 0)))
        return web.json_response(chat_whole(text))

    async def _accept(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """A 200 whole answer whatever the request body was."""
        return web.json_response(chat_whole())

    async def _echo(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """The request's text back in the answer (a marker in, a marker out)."""
        obj = json.loads(body)
        text = " ".join(str(m.get("content")) for m in obj.get("messages", []))
        if obj.get("stream"):
            return await self._stream(request, chat_events(text))
        return web.json_response(chat_whole(text))

    async def _status(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        code = int(q.get("code", 500))
        headers = {"Location": "/elsewhere"} if 300 <= code < 400 else {}
        if code == 429:
            headers["Retry-After"] = "1"
        return web.json_response({"error": {"type": "upstream_says", "code": code}},
                                 status=code, headers=headers)

    async def _random(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        rng = random.Random(int(q.get("seed", 1)))
        ctype = q.get("ctype", "text/event-stream")
        chunks = [rng.randbytes(4096) for _ in range(int(q.get("chunks", 16)))]
        return await self._stream(request, chunks, ctype=ctype)

    async def _raw(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """A 200 answer of a fixed body (`body` query, url-quoted) and content type."""
        return web.Response(body=q.get("body", "").encode(),
                            content_type=q.get("ctype", "application/json"))

    async def _badgzip(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        junk = random.Random(3).randbytes(2000)
        return web.Response(body=junk, headers={"Content-Encoding": "gzip",
                                                "Content-Type": q.get("ctype", "application/json")})

    async def _gzip(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        return web.Response(body=gzip.compress(json.dumps(chat_whole()).encode()),
                            headers={"Content-Encoding": "gzip",
                                     "Content-Type": "application/json"})

    async def _nolf(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """An event stream of one line that never ends: `size` bytes in 1 KiB writes."""
        size, piece = int(q.get("size", 4 << 20)), b"x" * 1024
        return await self._stream(request, [b"data: "] + [piece] * (size // 1024))

    async def _reset(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """A stream reset after `after` events (its usage among them when `after` is high)."""
        events = chat_events("one two three")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events[:int(q.get("after", 2))]:
            await resp.write(e)
        await asyncio.sleep(0.05)
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:  # RST, not FIN: SO_LINGER 0
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if request.transport is not None:
            request.transport.abort()
        return resp

    async def _hangup(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """The connection closed before any answer."""
        if request.transport is not None:
            request.transport.abort()
        await asyncio.sleep(0.2)
        return web.Response()

    async def _short(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """A Content-Length larger than the body, then the connection closed."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Content-Length": "5000"})
        await resp.prepare(request)
        await resp.write(json.dumps(chat_whole()).encode()[:40])
        await asyncio.sleep(0.05)
        if request.transport is not None:
            request.transport.abort()
        return resp

    async def _hang(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """No answer for a long time (the client gives up first)."""
        await asyncio.sleep(float(q.get("s", 60)))
        return web.json_response(chat_whole())

    async def _bighead(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        return web.json_response(chat_whole(), headers={"X-Big": "h" * 20000})

    async def _huge(self, request: web.Request, body: bytes, q: Any) -> web.StreamResponse:
        """`mib` MiB of token events (a stream), or of one JSON answer's padding (`whole`),
        the usage at the end."""
        mib = int(q.get("mib", 1))
        if q.get("whole"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"pad": "')
            pad = b"x" * (1 << 20)
            for _ in range(mib):
                await resp.write(pad)
            await resp.write(b'", ' + json.dumps(chat_whole())[1:].encode())
            await resp.write_eof()
            return resp
        one = _sse({"id": "c", "choices": [{"index": 0, "delta": {"content": "w "}}]})
        block = one * ((1 << 20) // len(one))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(mib):
            await resp.write(block)
        for e in chat_events("end")[-3:]:
            await resp.write(e)
        await resp.write_eof()
        return resp


class RawUpstream:
    """A TCP server that answers every connection with fixed bytes, then closes it."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(self._answer)
                except OSError:
                    pass

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._sock.close()


# ---------------------------------------------------------------------------- the proxy

@dataclass
class Proxy:
    """One running `harness record`."""

    proc: subprocess.Popen[bytes]
    url: str
    out: Path
    work: Path
    problems: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        return (self.work / ".proxy.err").read_text(errors="replace")

    def stdout(self) -> str:
        return (self.work / ".proxy.out").read_text(errors="replace")

    def vm(self, key: str) -> int:
        """A /proc/PID/status size in KiB (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def stop(self, sig: int = signal.SIGINT, expect: tuple[int, ...] = (0,),
             timeout_s: float = 30.0) -> list[str]:
        """Send `sig`, wait, and judge the end as the sweep judges a command."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.finish(expect, timeout_s)

    def finish(self, expect: tuple[int, ...], timeout_s: float = 30.0) -> list[str]:
        problems = list(self.problems)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            problems.append(f"still running {timeout_s:g} s after it was stopped")
            _kill_group(self.proc.pid)
            self.proc.wait()
        if self.proc.returncode not in expect:
            tail = (self.stderr().strip().splitlines() or [""])[-1][:160]
            problems.append(f"exit {self.proc.returncode}, expected {list(expect)} ({tail!r})")
        text = self.stderr() + self.stdout()
        if "Traceback" in text:
            problems.append("a traceback was printed")
        errors = [ln for ln in self.stderr().splitlines() if ln.startswith("error:")]
        if self.proc.returncode in (2, 3) and len(errors) != 1:
            problems.append(f"{len(errors)} 'error:' lines on exit {self.proc.returncode}")
        time.sleep(0.05)
        if _left_running(self.proc.pid):
            problems.append("processes of its session still running after it ended")
            _kill_group(self.proc.pid)
        return problems


def start_proxy(work: Path, env: dict[str, str], upstream: str, *args: str,
                out: Path | None = None, preexec: Callable[[], None] | None = None,
                timeout_s: float = 30.0) -> Proxy:
    """`harness record` on a free loopback port, in a session of its own; back once it says
    where it listens (RuntimeError, and nothing left running, when it does not)."""
    out = out or work / "rec"
    with open(work / ".proxy.out", "wb") as fo, open(work / ".proxy.err", "wb") as fe:
        proc = subprocess.Popen(
            [HARNESS, "record", "--upstream", upstream, "--listen", "127.0.0.1:0", "--out",
             str(out), *args], cwd=work, env=env, stdout=fo, stderr=fe,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in (work / ".proxy.err").read_text(errors="replace").splitlines():
            if line.startswith("listening on "):
                return Proxy(proc, line.split()[2].rstrip(";"), out, work)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    _kill_group(proc.pid)
    proc.wait()
    err = (work / ".proxy.err").read_text(errors="replace").strip().splitlines()
    raise RuntimeError(f"the proxy did not start (exit {proc.returncode}): "
                       f"{(err or [''])[-1][:160]}")


@contextmanager
def proxy_over(work: Path, env: dict[str, str], upstream: str, *args: str,
               **kw: Any) -> Iterator[Proxy]:
    """A proxy that is killed, whatever happens, when the block ends before it was stopped."""
    px = start_proxy(work, env, upstream, *args, **kw)
    try:
        yield px
    finally:
        if px.proc.poll() is None:
            _kill_group(px.proc.pid)
            px.proc.wait()


# ---------------------------------------------------------------------------- clients

@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    error: str | None = None  # the answer broke off (its exception's name)


def call(url: str, path: str = CHAT, body: Any = GOOD_BODY, headers: dict[str, str] | None = None,
         method: str = "POST", timeout_s: float = 30.0) -> Answer:
    """One request with http.client; a body that is not bytes is sent as JSON."""
    p = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(p.hostname, p.port, timeout=timeout_s)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        try:
            got = resp.read()
            err = None
        except (http.client.HTTPException, OSError) as exc:
            got, err = b"", type(exc).__name__
        return Answer(resp.status, resp.getheaders(), got, err)
    finally:
        conn.close()


def raw(url: str, data: bytes, timeout_s: float = 10.0, half_close: bool = False,
        wait_s: float = 0.0) -> bytes:
    """Send raw bytes, optionally end the sending side, and read until the proxy closes (or
    `timeout_s`); what came back."""
    p = urllib.parse.urlsplit(url)
    with socket.create_connection((p.hostname or "", p.port or 80), timeout=timeout_s) as s:
        try:
            s.sendall(data)
            if wait_s:
                time.sleep(wait_s)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got = b""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# ---------------------------------------------------------------------------- the recording

def events(out: Path) -> list[dict[str, Any]]:
    """The recording's event lines (a cut-short last line left out)."""
    rows = []
    for line in (out / "events.jsonl").read_bytes().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def call_lines(out: Path, wait_for: int = 0, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The `call` lines, waiting up to `timeout_s` for at least `wait_for` of them (the
    recorder thread writes after the answer has gone out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = [e for e in events(out) if e.get("ev") == "call"]
        if len(got) >= wait_for or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def meta(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "recording.json").read_text()))


def import_steps(out: Path, work: Path, env: dict[str, str], cli: bool = False
                 ) -> tuple[int | None, str]:
    """The recording imported (`harness traces import recording`, or its importer in this
    process, which is quicker): (its LLM steps, None when it failed; what it said). An import
    that finds no call to replay is 0 steps."""
    if not cli:
        from harness.errors import InputError
        from harness.traces.importers import import_trace
        try:
            imp = import_trace("recording", out, {})
        except InputError as exc:
            return (0, str(exc)) if "nothing to replay" in str(exc) else (None, str(exc))
        return int((imp.steps["kind"] == "llm").sum()), "; ".join(imp.warnings)
    dest = work / "t.parquet"
    res = subprocess.run([HARNESS, "traces", "import", "recording", str(out), "--out",
                          str(dest)], cwd=work, env=env, capture_output=True, timeout=120,
                         start_new_session=True)
    err = res.stderr.decode(errors="replace")
    if "Traceback" in err:
        return None, "a traceback was printed"
    if res.returncode != 0:
        return (0, err) if "nothing to replay" in err else (None, err.strip()[-200:])
    import pyarrow.parquet as pq  # only here: the sweep's other families do not need it

    kinds = pq.read_table(dest, columns=["kind"]).column("kind").to_pylist()
    return kinds.count("llm"), err


def grep_folder(folder: Path, needle: bytes) -> list[str]:
    """The files under `folder` that hold `needle`."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


def modes(folder: Path) -> dict[str, int]:
    """Permission bits of `folder` ('.') and of each file in it."""
    out = {".": folder.stat().st_mode & 0o777}
    out.update({p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ignore_xfsz_limit(size: int) -> Callable[[], None]:
    """A preexec_fn: files of at most `size` bytes, SIGXFSZ ignored (a write then fails EFBIG)."""
    import resource

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def umask(mask: int) -> Callable[[], None]:
    def apply() -> None:
        os.umask(mask)
    return apply
