"""HTTP/1.1 on pooled keep-alive connections: asyncio protocols and httptools' parser.

The harness's client sits inside every number it reports, so its path per request is kept short:
a request is one write of its head and body; the answer's body goes from the socket's callback
through the parser straight to the caller's sink (a streamed answer's first token is stamped in
the very callback that received it), and the caller awaits one future per request. Measured
against aiohttp's client on the same stub and loop, this took half the CPU per streamed call:
aiohttp's request, stream-reader and async-iterator layers had been 55-60% of the client's time.

A `Pool` holds at most `limit` connections in use at once (a request beyond waits, first come
first served, and the wait is counted: client time, never the server's), keeps idle ones for
`keepalive_s` (shorter than the servers' own keep-alive, so a reused connection is rarely one
the server closed) and closes every connection it opened on `close`.

A streamed answer's timers go by what its reader says it has received (`Progress`: the first
token, the latest event), never by bytes: a server that drips SSE comments or keep-alives would
otherwise hold a call open forever. An answer read whole is bounded (MAX_ANSWER_BYTES) and must
come unencoded (the client asks for no Content-Encoding), so a huge or compressed answer is
refused before it is held in memory.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

# A sink takes each received piece of a body; False asks to hang up (the connection is closed,
# so the server stops the request).
Sink = Callable[[bytes], bool]
# The most the client holds of an answer it reads whole (server info, scrapes, an error's
# body): the largest legitimate one (a big server's /metrics) is a few MiB; a server that
# sends hundreds of MiB is refused at this point, not read into memory.
MAX_ANSWER_BYTES = 16 << 20


class TransportError(Exception):
    """The request failed below HTTP: no connection, a dropped one, or an unreadable answer."""


class ConnectError(TransportError):
    """No connection could be opened."""


class ConnectTimeout(ConnectError, TimeoutError):
    """No connection within the connect timeout."""


class Disconnected(TransportError):
    """The server closed the connection before its answer was complete; `answered`: whether
    any of the answer had arrived (a request that met a stale keep-alive connection has none)."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class ProtocolError(TransportError):
    """The answer is not well-formed HTTP/1.1."""


class AnswerRefused(ProtocolError):
    """The answer is one the client will not read: larger than MAX_ANSWER_BYTES, or encoded
    (gzip, ...) although the client asked for no encoding."""


class Progress:
    """How far a streamed answer has come, as its reader sees it; the connection's timers go by
    this, not by received bytes. `begun`: its first token has arrived (set by a caller that
    tells tokens apart); `last`: the loop time of its latest event (-1 before the first);
    `by_event`: the first event begins it (for a reader that cannot tell tokens apart)."""

    __slots__ = ("begun", "by_event", "last")

    def __init__(self, by_event: bool = False) -> None:
        self.begun = False
        self.by_event = by_event
        self.last = -1.0

    def started(self) -> bool:
        """Whether the answer has begun. (Asked when a timer fires, not per event, so that the
        reader's work per event is a time stamp alone.)"""
        return self.begun or (self.by_event and self.last >= 0.0)


class SilenceTimeout(TimeoutError):
    """The answer did not begin, or went silent, within its timeout; `received`: whether it had
    begun (a stream: as its Progress says; any other answer: any of its body had arrived)."""

    def __init__(self, received: bool) -> None:
        super().__init__("no answer" if not received else "the answer stalled")
        self.received = received


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, the base path prefixed to every request path, and
    the headers every request carries (Host, Basic credentials from the URL, the caller's)."""

    host: str
    port: int
    base_path: str
    tls: bool
    head: bytes  # header lines common to every request, CRLF-terminated

    @classmethod
    def parse(cls, url: str, headers: dict[str, str] | None = None) -> Origin:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        netloc = f"[{host}]" if ":" in host else host
        lines = {"Host": netloc if parts.port is None else f"{netloc}:{port}",
                 "User-Agent": "agent-pause-harness", "Accept": "*/*"}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            lines["Authorization"] = f"Basic {token}"
        lines.update(headers or {})
        return cls(host, port, parts.path.rstrip("/"), tls, header_lines(lines))

    def url(self, path: str) -> str:
        """Where a request for `path` goes, as errors name it (never with credentials)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{self.base_path}{path}"


def header_lines(headers: dict[str, str]) -> bytes:
    """`Name: value` lines, CRLF-terminated; ValueError for a line break in either part."""
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n"):
            raise ValueError(f"header {name!r} has a line break")
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")


@dataclass
class Reply:
    """A complete answer: its status and, unless a sink took it, its body."""

    status: int
    body: bytes
    hung_up: bool = False


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 forget: Callable[[_Connection], None]) -> None:
        self.loop = loop
        self.forget = forget  # the pool's: this connection is gone
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.last_used = 0.0
        self._begin(None, None)

    def _begin(self, waiter: asyncio.Future[Reply] | None, sink: Sink | None) -> None:
        self.waiter = waiter
        self.sink = sink
        self.status = 0
        self.body: list[bytes] = []
        self.size = 0  # bytes of `body`
        self.answered = False  # any byte of the answer arrived
        self.received = False  # any byte of its body arrived
        self.framed = False  # the answer says where it ends (a length, or chunked)
        self.encoding: bytes | None = None  # a Content-Encoding other than identity
        self.keep_alive = True
        self.hung_up = False
        self.timer: asyncio.TimerHandle | None = None
        self.progress: Progress | None = None  # a stream's, as its reader reports it
        self.sent_at = 0.0
        self.first_s = 0.0
        self.idle_s: float | None = None

    # Protocol callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            if not self.hung_up:  # bytes nobody asked for: the connection is not reusable
                self.keep_alive = False
                self.close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            # The sink's own error (an unreadable chunk) is the caller's, as it was raised.
            cause = exc.__context__
            self._fail(cause if isinstance(cause, Exception) else ProtocolError(str(exc)))
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.forget(self)
        if self.waiter is None or self.waiter.done():
            return
        if self.status and not self.framed:
            self.on_message_complete()  # an answer that ends with its connection
        else:
            self._fail(Disconnected("the server closed the connection", self.answered))

    # Parser callbacks --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname == b"content-length" or (lname == b"transfer-encoding"
                                          and b"chunked" in value.lower()):
            self.framed = True
        elif lname == b"content-encoding" and value.strip().lower() != b"identity":
            self.encoding = value.strip()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.framed = True
        if self.encoding is not None:
            # Never asked for (no Accept-Encoding is sent): undecoded, a JSON answer is
            # unreadable and a stream's events invisible; decoded, a small body may expand to
            # gigabytes. (Raised in a parser callback: data_received fails the request.)
            raise AnswerRefused(f"the answer is Content-Encoding: "
                                f"{self.encoding.decode('latin-1')[:40]}, which the client "
                                "never asks for")

    def on_body(self, body: bytes) -> None:
        if self.hung_up:
            return  # the rest of a block received with the one that ended the answer for us
        self.received = True
        if self.sink is None or self.status != 200:
            self.size += len(body)
            if self.size > MAX_ANSWER_BYTES:
                raise AnswerRefused(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB, "
                                    "the most the client reads of an answer it holds whole")
            self.body.append(body)
        elif not self.sink(body):
            self.hung_up = True
            self.keep_alive = False
            self.on_message_complete()
            self.close()  # the server then stops the request

    def on_message_complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        self._stop_timer()
        waiter.set_result(Reply(self.status, b"".join(self.body), self.hung_up))

    # Requests ----------------------------------------------------------------------------

    def send(self, data: bytes, sink: Sink | None, first_byte_s: float,
             idle_s: float | None = None, progress: Progress | None = None
             ) -> asyncio.Future[Reply]:
        """Write one request; the future completes with the whole answer. A stream (`idle_s`
        and the `progress` its reader keeps) fails with SilenceTimeout when it has not begun
        within `first_byte_s` or, once begun, has had no event for `idle_s`; otherwise
        `first_byte_s` bounds the whole answer."""
        assert self.transport is not None
        waiter: asyncio.Future[Reply] = self.loop.create_future()
        self._begin(waiter, sink)
        self.sent_at = now = self.loop.time()
        self.first_s = first_byte_s
        wait = first_byte_s
        if idle_s is not None and progress is not None:
            self.idle_s, self.progress = idle_s, progress
            # The first look at the earlier of the two: a stream that begins at once and then
            # stalls is caught after `idle_s`, not after the (much longer) `first_byte_s`.
            wait = min(first_byte_s, idle_s)
        self.timer = self.loop.call_at(now + wait, self._check_silence)
        self.transport.write(data)
        return waiter

    def _check_silence(self) -> None:
        """The timer fired: fail a stream that has not begun within the first-byte timeout or
        has had no event for the idle timeout, else look again when the one that applies would
        end; fail any other answer. (One timer per request, re-armed only when it fires, never
        moved per received block or event.)"""
        self.timer = None
        p = self.progress
        if p is None or self.idle_s is None:
            self._fail(SilenceTimeout(self.received))
            return
        begun = p.started()
        due = p.last + self.idle_s if begun else self.sent_at + self.first_s
        if due > self.loop.time():
            self.timer = self.loop.call_at(due, self._check_silence)
            return
        self._fail(SilenceTimeout(begun))

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, exc: BaseException) -> None:
        self._stop_timer()
        self.keep_alive = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def finish(self) -> bool:
        """The request is over (answered, failed or abandoned): whether the connection can
        carry another."""
        self._stop_timer()
        w = self.waiter
        reusable = (w is not None and w.done() and not w.cancelled() and w.exception() is None
                    and self.keep_alive and not self.closed)
        self.waiter = None
        self.sink = None
        if not reusable:
            self.close()
        return reusable

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


class Gate:
    """At most `limit` holders at once, the others waiting first come, first served. Cheaper
    than asyncio.Semaphore, whose acquire walks its waiters on every call."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> bool:
        """Hold one place; returns whether it had to wait for it."""
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed over as we were cancelled: pass it on
            else:
                self._waiters.remove(fut)
            raise
        return True

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the place passes straight to the longest waiter
                return
        self.held -= 1


@dataclass
class PoolWaits:
    """Requests that waited for a free connection of the pool, and how long: client time, never
    the server's. With the pool sized to the run's most requests in flight, none should."""

    requests: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"queued_requests": self.requests, "queued_ms_total": 1e3 * self.total_s,
                "queued_ms_max": 1e3 * self.max_s}


class Pool:
    """Keep-alive connections to one origin, at most `limit` in use at once."""

    def __init__(self, origin: Origin, limit: int, keepalive_s: float, connect_s: float) -> None:
        if limit < 1:
            raise ValueError(f"connection_limit must be >= 1, got {limit}")
        self.origin = origin
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.connect_s = connect_s
        self.gate = Gate(limit)
        self.waits = PoolWaits()
        self.opened = 0
        # Idle connections, the most recently used on the right: taken from the right (warm),
        # expired from the left (the oldest).
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open: set[_Connection] = set()
        self._ssl = ssl.create_default_context() if origin.tls else None

    async def hold(self) -> None:
        """One place in the pool for a request (its retry included); `release` gives it back."""
        t0 = time.monotonic()
        if await self.gate.acquire():
            waited = time.monotonic() - t0
            w = self.waits
            w.requests += 1
            w.total_s += waited
            w.max_s = max(w.max_s, waited)

    def release(self) -> None:
        self.gate.release()

    async def connection(self, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection for one request, and whether it was reused: an idle one unless
        `fresh`, else a new one."""
        if not fresh:
            idle = self._idle
            now = time.monotonic()
            while idle and now - idle[0].last_used > self.keepalive_s:
                idle.popleft().close()
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn, True
        return await self._open_new(), False

    async def _open_new(self) -> _Connection:
        loop = asyncio.get_running_loop()
        o = self.origin
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._open.discard), o.host, o.port, ssl=self._ssl,
                    server_hostname=o.host if self._ssl else None)
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {o.host}:{o.port} within "
                                 f"{self.connect_s:g} s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {o.host}:{o.port}: "
                               f"{exc.strerror or exc}") from None
        self.opened += 1
        if not conn.closed:
            self._open.add(conn)
        return conn

    def put_back(self, conn: _Connection) -> None:
        """The request on `conn` is over: keep the connection for the next one if it can carry
        it, else forget it."""
        if conn.finish():
            conn.last_used = time.monotonic()
            self._idle.append(conn)

    def request_bytes(self, method: str, path: str, body: bytes | None,
                      content_type: bytes = b"application/json",
                      headers: dict[str, str] | None = None) -> bytes:
        """The request's bytes: the origin's header lines, then `headers` (per request)."""
        o = self.origin
        target = (o.base_path + path).encode()
        head = o.head + header_lines(headers) if headers else o.head
        if body is None:
            return b"%s %s HTTP/1.1\r\n%s\r\n" % (method.encode(), target, head)
        return b"%s %s HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            method.encode(), target, head, content_type, len(body), body)

    async def close(self) -> None:
        """Close every connection the pool opened, in use or idle."""
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
