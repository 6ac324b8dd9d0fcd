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
"""

from __future__ import annotations

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
    ConnectTimeout,
    Disconnected,
    Origin,
    Pool,
    PoolWaits,
    Reply,
    SilenceTimeout,
    Sink,
    TransportError,
)

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
                        sink: Sink | None = None, headers: dict[str, str] | None = None
                        ) -> Reply:
        """One request and its whole answer. With a `sink` (a stream) the first-byte and
        silence timeouts apply, else the request timeout. A reused connection that the server
        had closed (it fails before any answer) is retried once, on a new connection."""
        pool, t = self.pool, self.timeouts
        data = pool.request_bytes(method, path, body, headers=headers)
        first_s, idle_s = (t.first_byte_s, t.idle_s) if sink else (t.request_s, None)
        await pool.hold()
        try:
            for fresh in (False, True):
                conn, reused = await pool.connection(fresh)
                try:
                    return await conn.send(data, sink, first_s, idle_s)
                except Disconnected as exc:
                    if exc.answered or not reused:
                        raise
                finally:
                    pool.put_back(conn)
            raise AssertionError("unreachable")
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
                     headers: dict[str, str] | None = None) -> str | None:
        """POST `body` (with `headers` besides the client's own) and hand each server-sent
        `data:` JSON object to `on_chunk` until the stream ends (`[DONE]` or EOF) or `on_chunk`
        returns False, when the client hangs up (the server then stops the request). Returns
        None, or the error: a non-200 status, an `{"error": ...}` chunk, a broken connection or
        an unparseable chunk. A connection that fails before the first chunk (a stale
        keep-alive one) is retried once."""
        # orjson: a resumed call's body carries its whole context as token ids, and the stream
        # one JSON object per token; the stdlib's json was the client's largest cost per call.
        t = self.timeouts
        reader = _SseReader(on_chunk)
        try:
            reply = await self._exchange("POST", path, orjson.dumps(body), reader.feed,
                                         headers)
        except SilenceTimeout as exc:
            if exc.received:
                return f"{TIMEOUT_PREFIX}the stream stalled: no data for {t.idle_s:g} s"
            return f"{TIMEOUT_PREFIX}no answer within {t.first_byte_s:g} s"
        except ConnectTimeout:
            return f"{TIMEOUT_PREFIX}no connection within {t.connect_s:g} s"
        except Disconnected as exc:
            return f"server disconnected: {exc}"[:300]
        except (TransportError, orjson.JSONDecodeError) as exc:
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
    to `on_chunk`. After `[DONE]` the rest of the body is read and ignored (the connection stays
    reusable); `feed` returns False, to hang up, on an `{"error": ...}` chunk (kept in `error`)
    or when `on_chunk` asks to."""

    def __init__(self, on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        self.on_chunk = on_chunk
        self.rest = b""
        self.done = False
        self.error: str | None = None

    def feed(self, block: bytes) -> bool:
        if self.done:
            return True
        lines = (self.rest + block).split(b"\n")
        self.rest = lines.pop()  # an unfinished line waits for the next block
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
            chunk = orjson.loads(payload)
            if isinstance(chunk, dict) and "error" in chunk:
                self.error = str(chunk["error"])[:300]
                return False
            if not self.on_chunk(chunk):
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
