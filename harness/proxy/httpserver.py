"""The proxy's HTTP server as aiohttp's, with what a proxy in front of careless or hostile
clients needs: a request that cannot be read ends in a 400 and one line on stderr (never a
traceback), and a malformed body is refused as soon as it arrives.

aiohttp (pinned) is used through two of its internals here: its C parser, meeting a malformed
chunked body after the request's headers have gone to the handler, queues the error as if it
were the next request and leaves the body unfinished, so the handler would wait until the
client gives up. `_Protocol` hands that error to the body instead.

A connection must send a request's whole headers within HEADER_TIMEOUT_S of opening, or of the
first byte of a next request on a kept-alive connection, or it is closed (one line on stderr):
slow or silent senders cannot hold connections open without end. An idle kept-alive connection
(no byte of a next request) is left to the server's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, _ErrInfo

HEADER_TIMEOUT_S = 30.0  # a request's headers must be whole this long after they begin


def first_line(text: str, limit: int = 120) -> str:
    """`text`'s first line, without the request bytes a parser error may quote (a header's
    value can be a credential), at most `limit` characters."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    line = line.split(" b'")[0].split(' b"')[0].rstrip(": ")
    return line if len(line) <= limit else line[:limit] + "..."


def stderr_line(line: str) -> None:
    """Write one line to stderr (the default for the server's messages)."""
    print(line, file=sys.stderr, flush=True)


class _OneLine(logging.Handler):
    """The HTTP server's log as one line per event (a bad request, an error), no traceback."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        super().__init__(logging.DEBUG)
        self._warn = warn

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None and record.levelno < logging.WARNING:
            return  # the server's debug chatter (a client that left, ...)
        args = record.args if isinstance(record.args, tuple) else ()
        who = f" from {args[0]}" if len(args) == 1 else ""
        if isinstance(exc, HttpProcessingError):
            self._warn(f"harness record: bad request ({exc.code}){who}: "
                       f"{first_line(exc.message) or type(exc).__name__}")
        else:
            what = f"{type(exc).__name__}: {first_line(str(exc))}" if exc else ""
            self._warn(f"harness record: {first_line(record.getMessage())}"
                       f"{': ' + what if what else ''}")


class _Protocol(RequestHandler):
    """aiohttp's connection handler, failing a request's body when the parser finds it
    malformed (instead of queueing the error as a next request), and closing a connection
    whose request headers are not whole HEADER_TIMEOUT_S after they began."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_count = 0  # requests parsed when the timer was set

    def __init__(self, manager: web.Server, warn: Callable[[str], None], **kwargs: Any
                 ) -> None:
        super().__init__(manager, **kwargs)
        self._warn = warn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._time_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _time_head(self) -> None:
        self._head_count = self._request_count
        self._head_timer = self._loop.call_later(HEADER_TIMEOUT_S, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._request_count != self._head_count or self._current_request is not None:
            return  # the headers came (the timer was not stopped in time)
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        who = f" from {peer[0]}" if isinstance(peer, tuple) and peer else ""
        self._warn(f"harness record: connection{who} closed: no whole request headers within "
                   f"{HEADER_TIMEOUT_S:g} s")
        self.force_close()

    def data_received(self, data: bytes) -> None:
        if (self._head_timer is None and data and self._current_request is None
                and not self._messages):
            self._time_head()  # the first bytes of a next request on a kept-alive connection
        queued = len(self._messages)
        super().data_received(data)
        if self._request_count != self._head_count:
            self._stop_head_timer()  # its headers are whole
        request = self._current_request
        if request is None or len(self._messages) <= queued:
            return
        err = self._messages[-1][0]
        if (isinstance(err, _ErrInfo) and isinstance(err.exc, HttpProcessingError)
                and not request.content.is_eof()):
            self._messages.pop()
            request.content.set_exception(err.exc)
            request.content.feed_eof()  # nothing more of it is read (the error stays)


class _Server(web.Server):
    def __init__(self, handler: Callable[[web.BaseRequest], Any], warn: Callable[[str], None],
                 **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._warn = warn

    def __call__(self) -> RequestHandler:
        return _Protocol(self, self._warn, loop=self._loop, **self._kwargs)


def server(handler: Callable[[web.BaseRequest], Any], warn: Callable[[str], None]
           ) -> web.Server:
    """The low-level server for `handler`: calls cancelled when their client leaves, no access
    log, the server's own messages to `warn` one line each."""
    logger = logging.Logger("harness.record", logging.DEBUG)  # unregistered: nothing propagates
    logger.addHandler(_OneLine(warn))
    return _Server(handler, warn, handler_cancellation=True, access_log=None, logger=logger)

