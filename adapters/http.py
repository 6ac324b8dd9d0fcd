"""The HTTP core every adapter shares: one pooled client per server.

An adapter keeps only what is its runtime's own (its request bodies and its chunk parser); the
connection pool (adapters/connection.py), JSON requests with one retry on a stale keep-alive
connection, the server-sent-events reader and the Prometheus scrape live here, once.

Connections are pooled and kept alive. The pool's limit is set by the caller from the run's
largest number of requests in flight, so the client never queues a request behind a cap of its
own (aiohttp's default of 100 would report that queue as server latency). Idle connections are
dropped by the client after `KEEPALIVE_S`, shorter than the servers' own keep-alive (5 s for
uvicorn and llama-server's httplib), so a reused connection is rarely one the server has already
closed; a request that meets one is retried once, on a new connection (several pooled
connections can be stale at once, so the retry never takes another from the pool).

A stream's timers go by its events, never its bytes (SSE comments and keep-alives do not count),
and a stream is never read without end: an event line is bounded, and an OpenAI-style request
(`max_tokens` in its body) by how many events any server sends for it (MAX_EVENTS_PER_TOKEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from harness.adapters.connection import (
    MAX_ANSWER_BYTES,
    AnswerRefused,
    ConnectTimeout,
    Disconnected,
    Origin,
    Pool,
    PoolWaits,
    Progress,
    Reply,
    SilenceTimeout,
    Sink,
    TransportError,
)

KEEPALIVE_S = 3.0
DEFAULT_REQUEST_TIMEOUT_S = 120.0
# An error a stream ends with when the server went silent: the call is recorded `timeout`.
TIMEOUT_PREFIX = "timeout: "
# Events a stream may carry per token it asked for (`max_tokens`), plus EVENT_SLACK: a server
# sends at most one per generated token and a few more (a role, a finish reason, usage); twice
# that is never a server doing its job but one that ignores `max_tokens`, or sends empty events
# without end. (Callers that count tokens stop such a stream much sooner.)
MAX_EVENTS_PER_TOKEN = 2
EVENT_SLACK = 64
# What a chunk's parser raises on a chunk it cannot read (a token id that is no integer, a
# field of the wrong type): that call fails, with the reason, and the stream is closed.
CHUNK_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, AttributeError,
                                             IndexError)


@dataclass(frozen=True)
class Timeouts:
    """How long the client waits, per request.

    `connect_s`: to open a connection. `first_byte_s`: from sending a streamed call to its first
    token (its first event, where the caller does not tell tokens apart; a long prefill on a CPU
    server takes minutes). `idle_s`: the longest time without an event within a streamed answer
    once it has begun (comments and keep-alives are no event). `request_s`: a whole other
    request (server info, slot actions, scrapes)."""

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


Sample = tuple[str, str, str, float]  # (source, name, labels as sorted JSON or "", value)


class HttpStatusError(Exception):
    """The server answered with a status that is not 2xx."""

    def __init__(self, path: str, status: int, body: str) -> None:
        super().__init__(f"{path}: HTTP {status}: {body[:300]}")
        self.path = path
        self.status = status
        self.body = body


# What a request through HttpClient can fail with: the transport, a timeout, a non-2xx status,
# an answer that is not JSON.
REQUEST_ERRORS: tuple[type[Exception], ...] = (TransportError, TimeoutError, HttpStatusError,
                                               ValueError)


class HttpClient:
    """Requests to one server through an injected connection pool."""

    def __init__(self, pool: Pool, timeouts: Timeouts | None = None) -> None:
        self.pool = pool
        self.timeouts = timeouts or Timeouts()

    @property
    def pool_waits(self) -> PoolWaits:
        return self.pool.waits

    async def _exchange(self, method: str, path: str, body: bytes | None = None,
                        sink: Sink | None = None, headers: dict[str, str] | None = None,
                        progress: Progress | None = None) -> Reply:
        """One request and its whole answer. With a `sink` (a stream, its reader keeping
        `progress`) the first-token and silence timeouts apply, else the request timeout. A
        reused connection that the server had closed (it fails before any answer) is retried
        once, on a new connection. An answer the client will not read (AnswerRefused) is named
        with its URL."""
        pool, t = self.pool, self.timeouts
        data = pool.request_bytes(method, path, body, headers=headers)
        first_s, idle_s = (t.first_byte_s, t.idle_s) if sink else (t.request_s, None)
        await pool.hold()
        try:
            for fresh in (False, True):
                conn, reused = await pool.connection(fresh)
                try:
                    return await conn.send(data, sink, first_s, idle_s, progress)
                except Disconnected as exc:
                    if exc.answered or not reused:
                        raise
                finally:
                    pool.put_back(conn)
            raise AssertionError("unreachable")
        except AnswerRefused as exc:
            raise AnswerRefused(f"{method} {pool.origin.url(path)}: {exc}") from None
        finally:
            pool.release()

    async def get_json(self, *paths: str) -> Any:
        """JSON from the first of `paths` that the server serves (2xx): endpoints get renamed
        between releases. HttpStatusError when none does."""
        err: HttpStatusError | None = None
        for path in paths:
            reply = await self._exchange("GET", path)
            if 200 <= reply.status < 300:
                body = reply.body.strip()
                return orjson.loads(body) if body else None
            err = HttpStatusError(path, reply.status, _text(reply.body))
        assert err is not None, "get_json needs a path"
        raise err

    async def post_json(self, path: str, payload: dict[str, Any] | None = None
                        ) -> tuple[int, Any]:
        """POST `payload` as JSON (no body for None): (status, the answer's JSON or None when
        it is not JSON). For idempotent requests only: a stale connection is retried once."""
        reply = await self._exchange("POST", path, None if payload is None
                                    else orjson.dumps(payload))
        try:
            return reply.status, orjson.loads(reply.body) if reply.body.strip() else None
        except orjson.JSONDecodeError:
            return reply.status, None

    async def text(self, path: str) -> str | None:
        """The body of GET `path`, or None when the status is not 200."""
        reply = await self._exchange("GET", path)
        return _text(reply.body) if reply.status == 200 else None

    async def stream(self, path: str, body: dict[str, Any],
                     on_chunk: Callable[[dict[str, Any]], bool],
                     headers: dict[str, str] | None = None,
                     progress: Progress | None = None) -> str | None:
        """POST `body` (with `headers` besides the client's own) and hand each server-sent
        `data:` JSON object to `on_chunk` until the stream ends (`[DONE]` or EOF) or `on_chunk`
        returns False, when the client hangs up (the server then stops the request). Returns
        None, or the error: a non-200 status, an `{"error": ...}` chunk, a broken connection,
        a chunk `on_chunk` cannot read (CHUNK_ERRORS), no first token or a stall (the timeout
        prefix), or an endless stream (more events than MAX_EVENTS_PER_TOKEN allows for the
        body's `max_tokens`). A caller that tells tokens apart passes `progress` and sets its
        `begun` at the first token (the first-token timeout runs until then); without it the
        first event counts. A connection that fails before the first chunk (a stale keep-alive
        one) is retried once."""
        # orjson: a resumed call's body carries its whole context as token ids, and the stream
        # one JSON object per token; the stdlib's json was the client's largest cost per call.
        t = self.timeouts
        max_tokens = body.get("max_tokens")
        reader = _SseReader(on_chunk, progress,
                            max_tokens if type(max_tokens) is int and max_tokens >= 0 else None)
        try:
            reply = await self._exchange("POST", path, orjson.dumps(body), reader.feed,
                                         headers, reader.progress)
        except SilenceTimeout as exc:
            if exc.received:
                return f"{TIMEOUT_PREFIX}the stream stalled: no data for {t.idle_s:g} s"
            what = "answer" if progress is None else "token"
            return f"{TIMEOUT_PREFIX}no {what} within {t.first_byte_s:g} s"
        except ConnectTimeout:
            return f"{TIMEOUT_PREFIX}no connection within {t.connect_s:g} s"
        except Disconnected as exc:
            return f"server disconnected: {exc}"[:300]
        except TransportError as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        if reply.status != 200:
            return f"HTTP {reply.status}: {_text(reply.body)[:300]}"
        if not reply.hung_up:
            reader.finish()
        return reader.error

    async def metric_families(self, path: str = "/metrics") -> list[Metric]:
        """The Prometheus families the server exports ([] when it exports none)."""
        text = await self.text(path)
        return list(text_string_to_metric_families(text)) if text else []

    async def scrape(self, keep: Callable[[str], bool] = lambda _: True,
                     path: str = "/metrics") -> list[Sample]:
        """The samples of `path` whose name `keep` accepts, as ("metrics", name, labels, v)."""
        return samples(await self.metric_families(path), keep)


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


class _SseReader:
    """Splits a server-sent-events body into its `data:` payloads and hands each JSON object
    to `on_chunk`, stamping each event in `progress` (the connection's timers go by it; lines
    that are no event, comments and keep-alives, leave it alone). After `[DONE]` the rest of
    the body is read and ignored (the connection stays reusable); `feed` returns False, to hang
    up, when `on_chunk` asks to, and with the reason in `error` on an `{"error": ...}` chunk, a
    chunk that cannot be read, an event line longer than MAX_ANSWER_BYTES, or more events than
    `max_tokens` can account for."""

    def __init__(self, on_chunk: Callable[[dict[str, Any]], bool],
                 progress: Progress | None = None, max_tokens: int | None = None) -> None:
        self.on_chunk = on_chunk
        # Without the caller's progress, the stream has begun at its first event.
        self.progress = Progress(by_event=True) if progress is None else progress
        # The connection's timers compare against their loop's clock, so events are stamped
        # with the same one (uvloop's is not time.monotonic).
        self.clock = asyncio.get_running_loop().time
        self.max_tokens = max_tokens
        self.max_events = (MAX_EVENTS_PER_TOKEN * max_tokens + EVENT_SLACK
                           if max_tokens is not None else 1 << 62)
        self.events_left = self.max_events  # counted down: one subtraction per event
        self.rest = b""
        self.done = False
        self.error: str | None = None

    def feed(self, block: bytes) -> bool:
        if self.done:
            return True
        lines = (self.rest + block).split(b"\n")
        self.rest = lines.pop()  # an unfinished line waits for the next block
        if len(self.rest) > MAX_ANSWER_BYTES:  # a line without end is never held whole
            self.error = (f"an event line longer than {MAX_ANSWER_BYTES >> 20} MiB: the client "
                          "stopped reading")
            return False
        return self._lines(lines)

    def finish(self) -> None:
        """The body ended: its last line, if it had no newline."""
        if not self.done:
            self._lines([self.rest])
        self.rest = b""

    def _lines(self, lines: list[bytes]) -> bool:
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            left = self.events_left - 1
            self.events_left = left
            if left < 0:
                self.error = (f"the server sent more than {self.max_events} events for "
                              f"max_tokens={self.max_tokens}: the client stopped reading")
                return False
            self.progress.last = self.clock()
            try:
                chunk = orjson.loads(payload)
                if isinstance(chunk, dict) and "error" in chunk:
                    self.error = str(chunk["error"])[:300]
                    return False
                if not self.on_chunk(chunk):
                    return False
            except CHUNK_ERRORS as exc:  # the call fails with its reason; nothing is raised
                self.error = f"unreadable chunk ({type(exc).__name__}: {exc})"[:300]
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
    """An HttpClient on a pool of at most `connection_limit` keep-alive connections to
    `base_url` (credentials in it become Basic authorization), every connection closed on exit;
    `headers` go with every request (an API key: never logged or recorded)."""
    t = timeouts or Timeouts()
    pool = Pool(Origin.parse(base_url, headers), connection_limit, KEEPALIVE_S, t.connect_s)
    try:
        yield HttpClient(pool, t)
    finally:
        await pool.close()
