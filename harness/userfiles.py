"""Reading users' files and the values in them, shared by the trace importers and the recording
proxy: a regular file before anything opens it, JSON and JSON lines named by file and line on
error, the checks of a count and a duration read from a file, and the one token-counting rule
used where a log or a recording carries text but no token counts."""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path
from typing import Any

from harness import limits
from harness.errors import InputError

# One token per run of word characters and one per other non-space character. Crude next to a
# real tokenizer (which splits long words and merges some punctuation) but stable, fast and the
# same on every machine; the rule's name goes into each file's provenance.
TOKEN_RULE = (
    "regex word/punctuation split: one token per run of word characters (\\w+) and one per "
    "other non-space character ([^\\w\\s]); no chat-template overhead"
)
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

def count_tokens(text: str) -> int:
    """Tokens in `text` by TOKEN_RULE."""
    return len(_TOKEN_RE.findall(text))


def check_regular(path: Path) -> None:
    """Refuse `path` unless it is a regular file (or a link to one), before anything opens it.

    A FIFO waits for a writer and a device (/dev/zero) never ends: either would hang the
    import, so it is named and refused at once."""
    try:
        regular = path.is_file()
    except OSError as exc:  # e.g. a folder above it that cannot be searched
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not regular:
        raise InputError(f"{path}: not a regular file")


def real_path(path: Path) -> Path:
    """`path` with every symbolic link resolved, to tell one file named twice from two files.

    A link to itself, or links naming each other, can never be resolved: the path is refused
    by name (Python raises RuntimeError, or OSError ELOOP from 3.13)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        raise InputError(f"{path}: symbolic link loop (a link that leads back to itself)"
                         ) from None


_CHUNK = 1 << 20  # inflate a megabyte at a time: what is held never passes the cap by more


def read_bytes(path: Path) -> bytes | bytearray:
    """The file's bytes, inflated if its name ends in .gz, after check_regular.

    A gzip stream can inflate a thousandfold, so it is inflated a chunk at a time and refused,
    naming the file, as soon as it passes limits.MAX_INFLATED_BYTES: memory stays bounded
    whatever the file holds. OSError, EOFError and zlib.error (a corrupt stream) are the
    caller's to name."""
    check_regular(path)
    if not path.name.endswith(".gz"):
        return path.read_bytes()
    cap = limits.MAX_INFLATED_BYTES
    out = bytearray()
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            out += chunk
            if len(out) > cap:
                raise InputError(f"{path}: inflates to more than {cap / 2**20:g} MiB, the "
                                 "limit on a gzipped input")
    return out


def read_json(path: Path) -> Any:
    """Parse a JSON (or gzipped JSON) file; a bad file is an InputError naming it and the spot."""
    try:
        if path.name.endswith(".gz"):  # read_bytes checks the file and bounds the inflating
            return json.loads(read_bytes(path).decode("utf-8"))
        check_regular(path)
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a trace") from None
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line; a bad line is named by number."""
    check_regular(path)
    out: list[tuple[int, Any]] = []
    n = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if line.strip():
                    out.append((n, json.loads(line)))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {n}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: line {n}: JSON nested too deeply to be a trace") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (after line {n})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    return out


MAX_COUNT = 2**53  # far above any real token count; keeps sums inside int64


def is_count(value: Any) -> bool:
    """A non-negative integer below MAX_COUNT that is not a bool (JSON true is an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


def is_seconds(value: Any) -> bool:
    """A finite non-negative number of seconds."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:  # an integer too large for a float
        return False
