"""The HTTP core every adapter shares: one pooled client per server.

An adapter keeps only what is its runtime's own (its request bodies and its chunk parser); the
client session and its connector, JSON requests with one retry on a stale keep-alive connection,
the server-sent-events reader and the Prometheus scrape live here, once.

Connections are pooled and kept alive. The pool's limit is set by the caller from the run's
largest number of requests in flight, so the client never queues a request behind a cap of its
own (aiohttp's default of 100 would report that queue as server latency). Idle connections are
closed by the client after `KEEPALIVE_S`, shorter than the servers' own keep-alive (5 s for
uvicorn and llama-server's httplib), so a reused connection is rarely one the server has already
closed; a request that meets one is retried once, on a new connection (several pooled
connections can be stale at once, so the retry never takes another from the pool).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
KEEPALIVE_S = 3.0
DEFAULT_REQUEST_TIMEOUT_S = 120.0
# An error a stream ends with when the server went silent: the call is recorded `timeout`.
TIMEOUT_PREFIX = "timeout: "


@dataclass(frozen=True)
class Timeouts:
    """How long the client waits, per request.

    `connect_s`: to open a connection. `first_byte_s`: from sending a streamed call to its first
    data (a long prefill on a CPU server takes minutes). `idle_s`: the longest silence within a
    streamed answer once it has begun. `request_s`: a whole other request (server info, slot
    actions, scrapes)."""

    connect_s: float = 10.0
    first_byte_s: float = 600.0
    idle_s: float = 120.0
    request_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if not (isinstance(value, int | float) and 0 < value < 1e6):
                raise ValueError(f"timeout {name} must be a number of seconds in (0, 1e6), "
                                 f"got {value!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)
# A reused keep-alive connection the server closed fails with one of these before any reply.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)

Sample = tuple[str, str, str, float]  # (source, name, labels as sorted JSON or "", value)


class HttpStatusError(Exception):
    """The server answered with a status that is not 2xx."""

    def __init__(self, path: str, status: int, body: str) -> None:
        super().__init__(f"{path}: HTTP {status}: {body[:300]}")
        self.path = path
        self.status = status
        self.body = body


@dataclass
class PoolWaits:
    """Requests that waited for a free connection of the pool, and how long: client time, never
    the server's. With the pool sized to the run's most requests in flight, none should.
    (Counted at the client's own gate in front of aiohttp's pool: aiohttp's tracing hooks cost
    tens of microseconds on every request.)"""

    requests: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"queued_requests": self.requests, "queued_ms_total": 1e3 * self.total_s,
                "queued_ms_max": 1e3 * self.max_s}


# What a request through HttpClient can fail with: the transport, a timeout, a non-2xx status,
# an answer that is not JSON.
REQUEST_ERRORS: tuple[type[Exception], ...] = (aiohttp.ClientError, TimeoutError,
                                               HttpStatusError, ValueError)


class HttpClient:
    """Requests to one server at `base_url` through an injected aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str,
                 timeouts: Timeouts | None = None,
                 fresh: aiohttp.ClientSession | None = None,
                 connection_limit: int | None = None) -> None:
        """`session`: the pooled one; `fresh`: one that opens a new connection per request,
        for retries after a stale connection (default: `session`); `connection_limit`: the
        pool's size, at which further requests wait (counted in `pool_waits`)."""
        self.session = session
        self.pool_waits = PoolWaits()
        self._limit = connection_limit
        self._gate: _Gate | None = None
        self.fresh = fresh or session
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        t = self.timeouts
        self._timeout = aiohttp.ClientTimeout(total=t.request_s, connect=t.connect_s)
        # A stream has no total: a long answer is fine while data keeps coming (_stream
        # watches its first byte and its silences itself).
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_s)

    def url(self, path: str) -> str:
        return self.base_url + path

    async def _hold(self) -> _Gate | None:
        """Hold one of the pool's connections for a request (a retry included); the caller
        releases the gate returned. A plain await, not a context manager: this runs on every
        request and a generator-based one cost ~5% of the client's time per call."""
        if self._limit is None:
            return None
        if self._gate is None:
            self._gate = _Gate(self._limit)
        t0 = time.monotonic()
        if await self._gate.acquire():
            waited = time.monotonic() - t0
            w = self.pool_waits
            w.requests += 1
            w.total_s += waited
            w.max_s = max(w.max_s, waited)
        return self._gate

    async def get_json(self, *paths: str) -> Any:
        """JSON from the first of `paths` that the server serves (2xx): endpoints get renamed
        between releases. HttpStatusError when none does."""
        err: HttpStatusError | None = None
        for path in paths:
            try:
                return await self._retry_stale(functools.partial(self._get_json, path))
            except HttpStatusError as exc:
                err = exc
        assert err is not None, "get_json needs a path"
        raise err

    async def _get_json(self, path: str, session: aiohttp.ClientSession) -> Any:
        async with session.get(self.url(path), timeout=self._timeout) as resp:
            if not 200 <= resp.status < 300:
                raise HttpStatusError(path, resp.status, await resp.text())
            body = (await resp.read()).strip()
            return orjson.loads(body) if body else None

    async def post_json(self, path: str, payload: dict[str, Any] | None = None
                        ) -> tuple[int, Any]:
        """POST `payload` as JSON (no body for None): (status, the answer's JSON or None when
        it is not JSON).
        For idempotent requests only: a stale connection is retried once."""
        async def post(session: aiohttp.ClientSession) -> tuple[int, Any]:
            async with session.post(self.url(path), json=payload,
                                    timeout=self._timeout) as resp:
                text = await resp.text()
                try:
                    return resp.status, json.loads(text) if text else None
                except ValueError:
                    return resp.status, None

        return await self._retry_stale(post)

    async def text(self, path: str) -> str | None:
        """The body of GET `path`, or None when the status is not 200."""
        async def get(session: aiohttp.ClientSession) -> str | None:
            async with session.get(self.url(path), timeout=self._timeout) as resp:
                return await resp.text() if resp.status == 200 else None

        return await self._retry_stale(get)

    async def _retry_stale(self, request: Callable[[aiohttp.ClientSession], Awaitable[T]]
                           ) -> T:
        gate = await self._hold()
        try:
            return await request(self.session)
        except aiohttp.ClientConnectorError:
            raise  # a new connection that failed: nothing stale to retry
        except _STALE:
            return await request(self.fresh)
        finally:
            if gate is not None:
                gate.release()

    async def stream(self, path: str, body: dict[str, Any],
                     on_chunk: Callable[[dict[str, Any]], bool]) -> str | None:
        """POST `body` and hand each server-sent `data:` JSON object to `on_chunk` until the
        stream ends (`[DONE]` or EOF) or `on_chunk` returns False, when the client hangs up (the
        server then stops the request). Returns None, or the error: a non-200 status, an
        `{"error": ...}` chunk, a broken connection or an unparseable chunk. A connection that
        fails before the first chunk (a stale keep-alive one) is retried once."""
        # orjson: a resumed call's body carries its whole context as token ids, and the stream
        # one JSON object per token; the stdlib's json was the client's largest cost per call.
        data = orjson.dumps(body)
        gate = await self._hold()
        try:
            return await self._stream(path, data, on_chunk)
        finally:
            if gate is not None:
                gate.release()

    async def _stream(self, path: str, data: bytes,
                      on_chunk: Callable[[dict[str, Any]], bool]) -> str | None:
        t = self.timeouts
        loop = asyncio.get_running_loop()
        for attempt, session in enumerate((self.session, self.fresh)):
            reader = _SseReader(on_chunk)
            try:
                # One timer per call, moved at each block: the first byte, then each silence.
                async with asyncio.timeout(t.first_byte_s) as watch:
                    async with session.post(self.url(path), data=data, headers=_JSON,
                                            timeout=self._stream_timeout) as resp:
                        if resp.status != 200:
                            return f"HTTP {resp.status}: {(await resp.text())[:300]}"
                        # Whole received blocks, split into lines here: one await per block,
                        # not one per line.
                        async for block in resp.content.iter_any():
                            watch.reschedule(loop.time() + t.idle_s)
                            if not reader.feed(block):
                                if reader.hung_up:
                                    resp.close()  # the server then stops the request
                                return reader.error
                        reader.finish()
                        return reader.error
            except TimeoutError as exc:
                if isinstance(exc, aiohttp.ClientError):  # aiohttp's own: the connect timeout
                    return f"{TIMEOUT_PREFIX}no connection within {t.connect_s:g} s"
                if reader.received:
                    return f"{TIMEOUT_PREFIX}the stream stalled: no data for {t.idle_s:g} s"
                return f"{TIMEOUT_PREFIX}no answer within {t.first_byte_s:g} s"
            except aiohttp.ClientConnectorError as exc:
                return f"{type(exc).__name__}: {exc}"[:300]
            except _STALE as exc:
                if reader.received or attempt:
                    return f"server disconnected: {exc}"[:300]
            except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
                return f"{type(exc).__name__}: {exc}"[:300]
        raise AssertionError("unreachable")

    async def metric_families(self, path: str = "/metrics") -> list[Metric]:
        """The Prometheus families the server exports ([] when it exports none)."""
        text = await self.text(path)
        return list(text_string_to_metric_families(text)) if text else []

    async def scrape(self, keep: Callable[[str], bool] = lambda _: True,
                     path: str = "/metrics") -> list[Sample]:
        """The samples of `path` whose name `keep` accepts, as ("metrics", name, labels, v)."""
        return samples(await self.metric_families(path), keep)


_JSON = {"Content-Type": "application/json"}


class _Gate:
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


class _SseReader:
    """Splits a server-sent-events body into its `data:` payloads and hands each JSON object
    to `on_chunk`; `feed` returns False once the stream is over for the client: `[DONE]`, an
    `{"error": ...}` chunk (kept in `error`), or `on_chunk` asking to hang up (`hung_up`)."""

    def __init__(self, on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        self.on_chunk = on_chunk
        self.rest = b""
        self.received = False
        self.hung_up = False
        self.error: str | None = None

    def feed(self, block: bytes) -> bool:
        lines = (self.rest + block).split(b"\n")
        self.rest = lines.pop()  # an unfinished line waits for the next block
        return self._lines(lines)

    def finish(self) -> None:
        """The body ended: its last line, if it had no newline."""
        self._lines([self.rest])
        self.rest = b""

    def _lines(self, lines: list[bytes]) -> bool:
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return False
            self.received = True
            chunk = orjson.loads(payload)
            if isinstance(chunk, dict) and "error" in chunk:
                self.error = str(chunk["error"])[:300]
                return False
            if not self.on_chunk(chunk):
                self.hung_up = True
                return False
        return True


def samples(families: Iterable[Metric], keep: Callable[[str], bool]) -> list[Sample]:
    """Prometheus samples as (source, name, labels, value) rows, labels as sorted JSON."""
    out: list[Sample] = []
    for fam in families:
        for s in fam.samples:
            if keep(s.name):
                labels = json.dumps(s.labels, sort_keys=True) if s.labels else ""
                out.append(("metrics", s.name, labels, float(s.value)))
    return out


@contextlib.asynccontextmanager
async def connect(base_url: str, connection_limit: int, timeouts: Timeouts | None = None,
                  headers: dict[str, str] | None = None) -> AsyncIterator[HttpClient]:
    """An HttpClient on a pooled keep-alive session of at most `connection_limit` connections,
    closed on exit; `headers` go with every request (an API key: never logged or recorded)."""
    if connection_limit < 1:
        raise ValueError(f"connection_limit must be >= 1, got {connection_limit}")
    connector = aiohttp.TCPConnector(limit=connection_limit, limit_per_host=0,
                                     keepalive_timeout=KEEPALIVE_S)
    fresh = aiohttp.TCPConnector(limit=connection_limit, force_close=True)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session, \
            aiohttp.ClientSession(connector=fresh, headers=headers) as retries:
        yield HttpClient(session, base_url, timeouts, retries, connection_limit)
