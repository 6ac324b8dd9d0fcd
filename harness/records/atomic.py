"""Files written whole or not at all, and write errors that name their file.

Light on imports on purpose: the selftest file is written through it before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


class UnwritableResults(OSError):
    """A results file could not be written (a full disk, a file system gone read-only): a run
    stops at once, since nothing it measured from then on could be kept. Names the file."""


@contextlib.contextmanager
def writing(path: Path, tmp: Path | None = None) -> Iterator[None]:
    """Raise an OSError while writing `path` as UnwritableResults naming `path` (a full disk
    raises ENOSPC from a write, which names no file), after removing the temporary file `tmp`
    a failed write left."""
    try:
        yield
    except UnwritableResults:
        raise
    except OSError as exc:  # pyarrow's write errors are OSErrors too
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        # pyarrow's message wraps the system's ("Error writing bytes to file. Detail: ...")
        why = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc).splitlines()[0])
        raise UnwritableResults(exc.errno, why, str(path)) from None


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file (UTF-8) atomically, temporary file + rename: a full disk leaves the
    file as it was and no temporary behind, and the OSError names `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with writing(path, tmp):
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def reserve_space(path: Path, size: int) -> Path:
    """Set `size` bytes of the disk aside in a file at `path` (written, so a file system that
    allocates lazily allocates them): removed before a last write, they let it succeed on a
    disk that filled up meanwhile. Returns `path`; the OSError of a disk already full names it."""
    with writing(path, path), open(path, "wb") as f:
        f.write(bytes(size))
    return path
