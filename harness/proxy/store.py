"""The recording on disk: a private folder (0700) of private files (0600).

- `recording.json`: what was recorded and how (format, version, id, start time, upstream,
  session headers, hash and token rules, keep_text); rewritten when the recording closes with
  its end and counts (`closed`: true). Never the salt.
- `events.jsonl`: append-only, one JSON object a line, each written by one write() as it happens
  (a killed proxy leaves every finished line readable; only a last line can be cut short):
  `request` (a call arrived), `call` (it ended: times, outcome, usage, conversation, blocks,
  tool calls and results) and `other` (a request passed through unrecorded: method, path,
  status).
- `text.jsonl`: only with --keep-text: each call's request body and answer.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from harness.errors import InputError
from harness.userfiles import check_regular, read_lines

FORMAT_NAME = "harness-recording"
FORMAT_VERSION = 1
META = "recording.json"
EVENTS = "events.jsonl"
TEXT = "text.jsonl"
DIR_MODE = 0o700
FILE_MODE = 0o600


def create_folder(folder: Path) -> None:
    """Make `folder` (new, or an empty folder) private: mode 0700. InputError otherwise."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out {folder}: exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise InputError(f"--out {folder}: not empty; give a new or empty folder")
    try:
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(folder, DIR_MODE)  # mkdir's mode is masked by the umask
    except OSError as exc:
        raise InputError(f"--out {folder}: cannot create: {exc.strerror or exc}") from None


def _open_private(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab", buffering=0)  # unbuffered: one write() per line


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` naming `path` (a full disk raises ENOSPC from a write, which names no file)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def _write_all(fh: BinaryIO, data: bytes) -> None:
    """Write `data` whole: an unbuffered write may take only part of it (a disk filling up);
    the rest is written again, which raises the disk's error when there is no room."""
    view = memoryview(data)
    while view:
        n = fh.write(view)
        if not n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write recording.json whole (a new private file renamed over the old one); an OSError
    names recording.json and leaves no temporary file."""
    tmp = folder / f".{META}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        with _open_private(tmp) as fh:
            _write_all(fh, orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
                       + b"\n")
            os.fsync(fh.fileno())
        os.replace(tmp, folder / META)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _named(exc, folder / META) from None


class RecordingWriter:
    """Appends events (and, with keep_text, texts) as they happen. Not thread-safe: one
    thread writes (the proxy's recorder thread)."""

    def __init__(self, folder: Path, meta: dict[str, Any], keep_text: bool) -> None:
        self.folder = folder
        self.meta = meta
        write_meta(folder, meta)
        self._events = _open_private(folder / EVENTS)
        self._text = _open_private(folder / TEXT) if keep_text else None
        self.lines = 0

    def event(self, obj: dict[str, Any]) -> None:
        """Append one event line (an OSError names events.jsonl)."""
        try:
            _write_all(self._events, orjson.dumps(obj) + b"\n")
        except OSError as exc:
            raise _named(exc, self.folder / EVENTS) from None
        self.lines += 1

    def text(self, obj: dict[str, Any]) -> None:
        """Append one call's texts (an OSError names text.jsonl)."""
        if self._text is not None:
            try:
                _write_all(self._text, orjson.dumps(obj, default=str) + b"\n")
            except OSError as exc:
                raise _named(exc, self.folder / TEXT) from None

    def close(self, summary: dict[str, Any]) -> None:
        """Close the files and rewrite recording.json with `summary` and `closed`: true. Every
        file is closed even when one fails; then the first failure is raised (naming its file)."""
        errors: list[OSError] = []
        for fh, name in ((self._events, EVENTS), (self._text, TEXT)):
            if fh is not None and not fh.closed:
                try:
                    os.fsync(fh.fileno())
                except OSError as exc:
                    errors.append(_named(exc, self.folder / name))
                finally:
                    fh.close()
        self.meta = {**self.meta, **summary, "closed": True}
        try:
            write_meta(self.folder, self.meta)
        except OSError as exc:
            errors.append(exc)
        if errors:
            raise errors[0]


@dataclass
class Recording:
    """A recording read back: its metadata and events (line number, object)."""

    folder: Path
    meta: dict[str, Any]
    events: list[tuple[int, dict[str, Any]]]
    truncated_last_line: bool


def read_recording(folder: Path) -> Recording:
    """Read a recording folder; a cut-short last line (a killed proxy) is left out and said.
    Anything else that is not a recording is an InputError naming the file, line and field."""
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (a recording is the folder `harness record "
                         "--out` wrote)")
    meta_path, events_path = folder / META, folder / EVENTS
    for p in (meta_path, events_path):
        if not p.exists() and not p.is_symlink():
            raise InputError(f"{folder}: no {p.name}: not a recording")
        check_regular(p)  # a link that loops or leads nowhere is named as one
    meta = _read_meta(meta_path)
    cut = False
    events: list[tuple[int, dict[str, Any]]] = []
    # A line at a time, within the line cap every JSON Lines input has (harness.limits).
    for n, line in read_lines(events_path):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if not line.endswith(b"\n"):  # the last line, with no line break after it
                cut = True
                continue
            raise InputError(f"{events_path}: line {n}: not valid JSON") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("ev"), str):
            raise InputError(f"{events_path}: line {n}: field 'ev': expected an object with "
                             "an event name")
        events.append((n, obj))
    return Recording(folder, meta, events, cut)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise InputError(f"{path}: field 'format': not a {FORMAT_NAME} file")
    if meta.get("version") != FORMAT_VERSION:
        raise InputError(f"{path}: field 'version': {meta.get('version')!r} is not a version "
                         f"this harness reads ({FORMAT_VERSION})")
    return meta
