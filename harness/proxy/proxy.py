"""The recording reverse proxy: every request forwarded unchanged, every answer relayed as it
arrives, the LLM calls recorded on the side.

Bytes, status and headers pass through as they are, hop-by-hop headers (Connection,
Transfer-Encoding, ...) aside; a compressed answer stays compressed; a stream is written to the
client chunk by chunk as the upstream sends it. /v1/chat/completions, /v1/completions,
/v1/messages and /v1/responses (POST) are recorded; every other path is passed through and only
counted.

When the upstream cannot be reached or gives no answer, the client gets a 502 with a one-line
JSON error; an error status is relayed as the upstream gave it; a stream that breaks off is
broken off to the client too (its connection closed, as the upstream's was). A client that goes
away cancels its upstream request. Every such call is recorded with what happened.

Upstream connections are kept alive and pooled, idle ones dropped after UPSTREAM_KEEPALIVE_S
(shorter than the servers' own 5 s). A server may still close a pooled connection just as the
proxy takes it: llama-server closes the connection after every streamed answer without saying
so in its headers, and the proxy can reuse it before the close arrives. A request that fails
that way (the upstream hung up, or reset, before any answer, on a reused connection) is sent
once more, on a new connection of its own; one on a new connection is not.

Credentials in the upstream URL (http://user:pw@host) are sent as Basic authorization and win
over an Authorization header of the client's own, which is then not forwarded (one credential
per request). A request the proxy cannot read (a target that is not a path, a malformed header
or chunked body) gets a 400 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from harness.proxy.answers import FirstToken, api_of
from harness.proxy.httpserver import first_line, server, stderr_line
from harness.proxy.kept import Kept
from harness.proxy.recorder import CallMeta, Recorder

# Headers of one connection, never forwarded (RFC 9110 7.6.1), and those a proxy sets itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                        "upgrade"})
_REQUEST_OWN = frozenset({"host", "content-length"})
# Headers aiohttp's client adds when a request has none: skipped unless the client sent them.
_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
DEFAULT_SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id",
                           "session-id", "x-conversation-id")
# Headers whose value names the agent (a sub-agent's own id) inside the client's session.
DEFAULT_AGENT_HEADERS = ("x-claude-code-agent-id",)
MAX_BODY = 512 * 1024 * 1024  # a request body above this is refused (413)
UPSTREAM_KEEPALIVE_S = 3.0  # an idle upstream connection is dropped after this
STOP_GRACE_S = 1.0  # calls still running at a stop get this long, then are cut


@dataclass(frozen=True)
class ProxyConfig:
    """What `harness record` was asked for."""

    upstream: str
    host: str
    port: int
    out: Path
    keep_text: bool = False
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    connect_timeout_s: float = 10.0
    agent_headers: tuple[str, ...] = DEFAULT_AGENT_HEADERS


def _connection_listed(headers: CIMultiDictProxy[str]) -> set[str]:
    return {t.strip().lower() for v in headers.getall("Connection", [])
            for t in v.split(",") if t.strip()}


def forwarded(headers: CIMultiDictProxy[str], own: frozenset[str] = frozenset()
              ) -> CIMultiDict[str]:
    """`headers` without the hop-by-hop ones (and those Connection names) and `own`."""
    drop = HOP_BY_HOP | own | _connection_listed(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in drop:
            out.add(k, v)
    return out


def error_body(message: str, kind: str = "upstream_unreachable") -> bytes:
    """The one-line JSON a client gets with a 502 or a 400 (readable as an OpenAI or Anthropic
    error)."""
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}}) + b"\n"


def _bad_request(message: str) -> web.Response:
    resp = web.Response(status=400, content_type="application/json",
                        body=error_body(f"harness record: {message}", "bad_request"))
    resp.force_close()  # what follows a request that could not be read cannot be trusted
    return resp


def _hung_up(exc: BaseException) -> bool:
    """Whether a request failed because the upstream closed or reset its connection (and not
    on a timeout, a refused connection or a bad answer)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError | BrokenPipeError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET,
                                                                     errno.EPIPE)


@dataclass
class _Attempt:
    """One request's try at the upstream: whether it went on a pooled connection."""

    reused: bool = False


async def _on_reuse(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                    _params: aiohttp.TraceConnectionReuseconnParams) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.reused = True


def _why(exc: BaseException) -> str:
    """A short, text-free name of what went wrong: the class, and an OS error's errno name."""
    os_error = getattr(exc, "os_error", None)
    err = os_error if isinstance(os_error, OSError) else exc if isinstance(exc, OSError) else None
    code = getattr(err, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(exc).__name__}{': ' + name if name else ''}"


async def _read_body(request: web.BaseRequest) -> bytes | None:
    """The whole request body (None past MAX_BODY; HttpProcessingError when it is malformed)."""
    parts: list[bytes] = []
    size = 0
    while request.can_read_body and (chunk := await request.content.readany()):
        size += len(chunk)
        if size > MAX_BODY:
            return None
        parts.append(chunk)
    return b"".join(parts)


class Proxy:
    """The proxy on an event loop: `start`, then `stop` (which closes the recording)."""

    def __init__(self, config: ProxyConfig, recorder: Recorder,
                 warn: Callable[[str], None] = stderr_line) -> None:
        self.config = config
        self.recorder = recorder
        self.url = ""
        self.stopping = False
        self._warn = warn
        parts = urllib.parse.urlsplit(config.upstream)  # a query or fragment is not a base
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (
            f":{parts.port}" if parts.port else "")
        self._base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")
                                             ).rstrip("/")
        # The URL's credentials replace the client's Authorization (aiohttp refuses both).
        self._auth = (aiohttp.encode_basic_auth(urllib.parse.unquote(parts.username),
                                                urllib.parse.unquote(parts.password or ""))
                      if parts.username is not None else None)
        self._ids = itertools.count(1)
        self._session_headers = tuple(h.lower() for h in config.session_headers)
        self._agent_headers = tuple(h.lower() for h in config.agent_headers)
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one new connection per request
        self._runner: web.ServerRunner | None = None

    async def start(self) -> None:
        """Listen (InputError-free: an OSError when the address cannot be had)."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s,
                                        sock_connect=self.config.connect_timeout_s)
        reuse = aiohttp.TraceConfig()
        reuse.on_connection_reuseconn.append(_on_reuse)
        self._session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
            trace_configs=[reuse])
        self._fresh = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=0, force_close=True))
        self._runner = web.ServerRunner(server(self._handle, self._warn),
                                        shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def listening(self) -> list[tuple[str, int]]:
        """The (host, port) of each socket the proxy listens on (empty before `start`)."""
        if self._runner is None:
            return []
        return [(str(a[0]), int(a[1])) for a in self._runner.addresses]

    async def stop(self) -> dict[str, object]:
        """Stop listening, cut the calls still running (recorded `stopped`), close the
        recording; its summary."""
        self.stopping = True
        if self._runner is not None:
            await self._runner.cleanup()
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        return await asyncio.to_thread(self.recorder.close)

    @staticmethod
    def _header_of(request: web.BaseRequest, names: tuple[str, ...]) -> str | None:
        """The value of the first of `names` that the request carries (not empty)."""
        for name in names:
            value = request.headers.get(name)
            if value:
                return value
        return None

    def _refused(self, request: web.BaseRequest, why: str) -> web.Response:
        self._warn(f"harness record: bad request (400) from {request.remote}: {why}")
        return _bad_request(why)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if not request.raw_path.startswith("/"):
            # An absolute-form target (a forward proxy's), `OPTIONS *`, CONNECT's authority:
            # this proxy forwards paths to one upstream only.
            return self._refused(request, "the request target is not a path")
        if request.version < (1, 0):
            # HTTP/0.9 (a request line without a version): no headers, no body, no status
            # line; the answer could not be relayed as HTTP/0.9 anyway.
            return self._refused(request, "HTTP/0.9 is not supported")
        rec = self.recorder
        arrival = rec.now()
        api = api_of(request.method, request.path)
        meta = None if api is None else CallMeta(
            next(self._ids), api, request.path, arrival,
            self._header_of(request, self._session_headers),
            agent=self._header_of(request, self._agent_headers))
        try:
            body = await _read_body(request)
        except HttpProcessingError as exc:
            return self._refused(request, first_line(exc.message) or type(exc).__name__)
        if body is None:
            return web.Response(status=413, body=error_body(
                f"harness record: request body over {MAX_BODY} bytes"),
                content_type="application/json")
        if meta is not None:
            rec.arrived(meta)
        kept = Kept()  # what the recorder gets of the answer (bounded)
        status: int | None = None
        try:
            resp, status = await self._relay(request, body, meta, kept)
        except asyncio.CancelledError:
            if meta is not None:
                meta.outcome, meta.end = ("stopped" if self.stopping else "aborted"), rec.now()
            raise
        except Exception as exc:  # the server answers 500 and logs one line: never `ok`
            if meta is not None and meta.outcome == "ok":
                meta.outcome = "unreachable" if meta.status is None else "cut"
                meta.error = _why(exc)
            raise
        finally:
            if meta is None:
                rec.passed(request.method, request.path, status, arrival, rec.now())
            else:
                meta.end = meta.end or rec.now()
                meta.dropped = kept.dropped
                rec.ended(meta, body, kept.bytes())
        return resp

    async def _relay(self, request: web.BaseRequest, body: bytes, meta: CallMeta | None,
                     kept: Kept) -> tuple[web.StreamResponse, int | None]:
        assert self._session is not None and self._fresh is not None
        skip = [h for h in _AUTO_HEADERS if h not in request.headers]
        headers = forwarded(request.headers, _REQUEST_OWN)
        if self._auth is not None:
            headers["Authorization"] = self._auth
        attempt = _Attempt()
        try:
            for session in (self._session, self._fresh):
                up_cm = session.request(
                    request.method, URL(self._base + request.raw_path, encoded=True),
                    headers=headers, data=body or None,
                    allow_redirects=False, skip_auto_headers=skip, trace_request_ctx=attempt)
                try:
                    up = await up_cm.__aenter__()
                    break
                except (aiohttp.ClientError, OSError) as exc:
                    if not (attempt.reused and _hung_up(exc)):
                        raise
                    attempt.reused = False  # a stale pooled connection: once more, on a new one
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            # ValueError: a request aiohttp would not send (a header it refuses, ...)
            if meta is not None:
                meta.outcome, meta.error = "unreachable", _why(exc)
            return web.Response(status=502, content_type="application/json", body=error_body(
                f"harness record: no answer from the upstream server ({_why(exc)})")), 502
        try:
            return await self._answer(request, up, meta, kept), up.status
        finally:
            await up_cm.__aexit__(None, None, None)

    async def _answer(self, request: web.BaseRequest, up: aiohttp.ClientResponse,
                      meta: CallMeta | None, kept: Kept) -> web.StreamResponse:
        rec = self.recorder
        resp = web.StreamResponse(status=up.status, reason=up.reason,
                                  headers=forwarded(up.headers))
        encoding = up.headers.get("Content-Encoding", "").lower() or None
        sse = up.headers.get("Content-Type", "").startswith("text/event-stream")
        first = FirstToken(meta.api) if meta is not None and sse and not encoding else None
        if meta is not None:
            meta.status, meta.sse, meta.encoding = up.status, sse, encoding
            if not 200 <= up.status < 300:  # an error, or a redirect (never followed)
                meta.outcome = "http_error"
        try:
            await resp.prepare(request)
        except (ConnectionError, aiohttp.ClientConnectionError):
            if meta is not None:
                meta.outcome = "aborted"
            return resp
        while True:
            try:
                chunk = await up.content.readany()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                # The upstream broke off: so does the client's answer (no clean end).
                if meta is not None:
                    meta.outcome, meta.error = "cut", _why(exc)
                if request.transport is not None:
                    request.transport.close()
                return resp
            if not chunk:
                break
            t = rec.now()
            try:
                await resp.write(chunk)
            except (ConnectionError, aiohttp.ClientConnectionError):
                if meta is not None:
                    meta.outcome = "aborted"
                return resp
            if meta is not None:
                kept.add(chunk)
                if first is not None and first.feed(chunk):
                    meta.first_token, first = t, None
        if meta is not None:
            meta.end = rec.now()
        # The answer's end goes out now, before the recorder thread starts on this call.
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionError):
            await resp.write_eof()
        return resp
