"""Append-only Parquet parts, written off the caller's thread.

Rows are buffered and converted to Arrow record batches a small chunk at a time (a few hundred
rows: well under a millisecond of the caller's time each), and every `flush_rows` rows or
`flush_s` seconds the batches go to a writer thread as one numbered part. The thread encodes,
compresses and writes (pyarrow releases the GIL for all three), to a temporary name then
renamed, so a killed run leaves only whole parts. The thread runs at a lower scheduling
priority: on a loaded core the kernel gives the event loop the CPU first and the part is written
in its idle time. Its queue is bounded: when parts are produced faster than they can be written
the caller waits for room, so memory stays bounded whatever the run's length.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.records.atomic import writing

# Rows converted to a record batch at a time: pyarrow's fixed cost per conversion (~15 us per
# column) is paid once per chunk, and a chunk costs the caller ~1 ms.
CHUNK_ROWS = 256
# Parts queued for the writer thread before the caller waits.
MAX_PENDING = 8
# The writer thread's niceness above the process's (Linux schedules threads separately).
WRITER_NICE = 10

_Part = tuple[Path, list[pa.RecordBatch]]


def write_part(path: Path, schema: pa.Schema, batches: list[pa.RecordBatch]) -> None:
    """Write one whole part: a temporary file renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    # No dictionary pages: most columns are near-unique numbers (times, sequence numbers), for
    # which building dictionaries cost ~20% of the write and made parts ~30% larger.
    with writing(path, tmp):
        pq.write_table(pa.Table.from_batches(batches, schema=schema), tmp, compression="zstd",
                       use_dictionary=False)
        os.replace(tmp, path)


class _WriterThread:
    """One daemon thread that writes the parts handed to it, in order."""

    def __init__(self, schema: pa.Schema, name: str) -> None:
        self._schema = schema
        self._queue: queue.Queue[_Part | None] = queue.Queue(maxsize=MAX_PENDING)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # best effort: not every OS has it
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           min(19, os.getpriority(os.PRIO_PROCESS, 0) + WRITER_NICE))
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    write_part(item[0], self._schema, item[1])
                except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                    self._error = exc

    def submit(self, part: _Part) -> None:
        self.raise_error()
        self._queue.put(part)

    def close(self) -> None:
        """Write what is queued, stop the thread and raise the first write error, if any."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.raise_error()

    def raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class PartWriter:
    """Buffers rows (dicts) and writes them as numbered Parquet parts of one schema.

    `background=False` writes each part on the caller's thread (tests, short tools). `flush()`
    hands over what is buffered; `close()` also waits until every part is on disk.
    """

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        flush_rows: int = 2000,
        flush_s: float = 1.0,
        now: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self._now = now
        self._rows: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._batched_rows = 0
        self._part = 0
        self._last_flush = now()
        self._thread = (_WriterThread(schema, f"parts-{directory.name}")
                        if background else None)
        directory.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict[str, Any]) -> None:
        rows = self._rows
        rows.append(row)
        if self._now() - self._last_flush >= self.flush_s:
            self.flush()
        elif len(rows) >= CHUNK_ROWS:
            self._convert()
            if self._batched_rows >= self.flush_rows:
                self.flush()

    def _convert(self) -> None:
        if self._rows:
            self._batches.append(pa.RecordBatch.from_pylist(self._rows, schema=self.schema))
            self._batched_rows += len(self._rows)
            self._rows = []

    def flush(self) -> None:
        """Hand the buffered rows over as one part (written later on the writer thread)."""
        self._last_flush = self._now()
        self._convert()
        if not self._batches:
            return
        part = (self.directory / f"part-{self._part:05d}.parquet", self._batches)
        self._part += 1
        self._batches, self._batched_rows = [], 0
        if self._thread is None:
            write_part(part[0], self.schema, part[1])
        else:
            self._thread.submit(part)

    def close(self) -> None:
        """Flush, then wait until every part is written; raises the first write error."""
        self.flush()
        if self._thread is not None:
            self._thread.close()
