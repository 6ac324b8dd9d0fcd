"""Errors the command line turns into one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations


class HarnessError(Exception):
    """A user-facing error: bad input, a refused request, a server that would not start."""

    exit_code = 2


class InputError(HarnessError):
    """Malformed input (a file, a flag, a profile): exit 2."""


class ServerError(HarnessError):
    """A runtime server misbehaved or could not be reached."""

    exit_code = 3


class Terminated(BaseException):
    """SIGTERM: stop now, as Ctrl-C (KeyboardInterrupt) does, and exit 143.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it on its
    way out while every `finally` and context manager (the local server's stop) still runs."""

    exit_code = 143
