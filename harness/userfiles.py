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
from collections.abc import Iterator
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
        if path.is_symlink() and not path.exists():  # found in a folder: say what it is
            real_path(path)  # a loop is named as one
            raise InputError(f"{path}: symbolic link to nothing")
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


def _size(n: int) -> str:
    """A cap for an error line: in MiB, or in bytes below one."""
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_lines(path: Path, line_cap: int = limits.MAX_LINE_BYTES,
               inflated_cap: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line, read one at a time (inflated as it goes where the
    name ends in .gz), after check_regular.

    What is held is one line: a line longer than `line_cap` bytes, or a gzip stream inflating
    past `inflated_cap` (None: limits.MAX_INFLATED_BYTES), is refused naming the file before
    it is read whole; a file that cannot be read is named too."""
    check_regular(path)
    gz = path.name.endswith(".gz")
    total_cap = limits.MAX_INFLATED_BYTES if inflated_cap is None else inflated_cap
    n = seen = 0
    try:
        with gzip.open(path, "rb") if gz else path.open("rb") as fh:
            while line := fh.readline(min(line_cap, total_cap - seen) + 1 if gz else
                                      line_cap + 1):
                n += 1
                seen += len(line)
                if gz and seen > total_cap:
                    raise InputError(f"{path}: inflates to more than {_size(total_cap)}, "
                                     "the limit on a gzipped input")
                if len(line) > line_cap:
                    raise InputError(f"{path}: line {n} is longer than {_size(line_cap)}, "
                                     "the limit on a line of JSON Lines")
                yield n, line
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path}: cannot read: {exc}") from None


def read_jsonl(path: Path, line_cap: int = limits.MAX_LINE_BYTES,
               inflated_cap: int | None = None) -> list[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line; a bad line is named by number.
    Read a line at a time, within the caps of read_lines."""
    out: list[tuple[int, Any]] = []
    n = 0
    try:
        for n, line in read_lines(path, line_cap, inflated_cap):
            if line.strip():
                out.append((n, json.loads(line.decode("utf-8"))))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {n}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: line {n}: JSON nested too deeply to be a trace") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (after line {n - 1})") from None
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
