"""Where a RecordSink's parts are encoded and written: a thread, or a process of its own.

Encoding a part (harness.simulate.steps.blocks, then harness.simulate.decode) is numpy and Arrow
work that holds the GIL much of the time; in a thread beside a large simulation it slows the
event loop by about as much time as it takes. A writer process runs it on another core: the
per-step columns are shared memory (StepColumns(shared=True)) that the process attaches to, and
only the loop's other rows and the interned texts travel with each part. The process is a fresh
interpreter (`python -m harness.simulate.writer`, not a fork: pyarrow's thread pools do not
survive one, and not multiprocessing's spawn, which would re-run the caller's main script)
talking over two pipes with multiprocessing's Connection. It ends when told to or when its
pipe closes (the simulation's process is gone).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.records.schema import RECORDS_SCHEMA
from harness.simulate.decode import RunStatics, decode
from harness.simulate.steps import StepColumns, blocks, step_trajectory
from harness.simulate.workload import Workload

# The records schema version, as the Parquet key-value metadata of every part.
RECORDS_METADATA = {k.decode(): v.decode() for k, v in (RECORDS_SCHEMA.metadata or {}).items()}

MAX_PENDING = 2  # parts handed over and not yet written (bounds the memory they hold)
_STRING_COLUMNS = [f.name for f in RECORDS_SCHEMA if pa.types.is_string(f.type)]
Texts = list[str | None]


def run_statics(run_id: str, w: Workload, kv_bytes_per_token: float,
                ctx_limit: int) -> RunStatics:
    """What decoding a part looks up, computed once per run."""
    uniq = sorted(set(w.priority))
    prio = np.searchsorted(np.asarray(uniq, dtype=object),
                           np.asarray(w.priority, dtype=object)).astype(np.int64)
    return RunStatics(run_id, w, np.asarray(w.first, dtype=np.int64),
                      pa.array(w.ids, type=pa.string()), pa.array(uniq, type=pa.string()), prio,
                      kv_bytes_per_token, ctx_limit)


# what a replay records of a bystander request: its call's events (no trajectory, KV state,
# erase or wait of its own)
_BYSTANDER_EVENTS = pa.array(["call_start", "first_token", "call_end"])


def agent_events(table: pa.Table) -> pa.Array:
    """Which of a part's rows to keep: all but a bystander's events other than its call's
    (the loop runs a bystander request as a one-call trajectory; a replay records its call)."""
    bystander = pc.equal(table["traffic"].cast(pa.string()), "bystander")
    return pc.invert(pc.and_(bystander, pc.invert(pc.is_in(
        table["event"].cast(pa.string()), value_set=_BYSTANDER_EVENTS))))


class PartEncoder:
    """Turns a range of seq into one Parquet part: `rows` (the loop's other rows, an (n, 9)
    float array) and the per-step columns; written to a temporary name, then renamed."""

    def __init__(self, directory: Path, statics: RunStatics, cols: StepColumns) -> None:
        self.directory = directory
        self.statics = statics
        self.cols = cols
        self.traj = step_trajectory(statics.w)

    def write(self, rows: np.ndarray, lo: int, hi: int, steps: tuple[int, int], part: int,
              texts: Texts) -> None:
        parts = blocks(self.cols, self.statics.w, self.traj, lo, hi, rows, steps)
        cols = decode(parts, pa.array(texts, type=pa.string()), self.statics)
        table = pa.Table.from_arrays(cols, schema=pa.schema(
            [pa.field(f.name, c.type, f.nullable) for f, c in zip(RECORDS_SCHEMA, cols,
                                                                 strict=True)]))
        if self.statics.w.bystanders:
            table = table.filter(agent_events(table))
        final = self.directory / f"part-{part:05d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        # Without the stored Arrow schema the dictionary columns read back as plain strings.
        with pq.ParquetWriter(tmp, table.schema, compression="zstd",
                              use_dictionary=_STRING_COLUMNS, write_statistics=False,
                              store_schema=False) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(RECORDS_METADATA)
        os.replace(tmp, final)


class ThreadWriter:
    """Parts written by one thread of this process, in order."""

    def __init__(self, encoder: PartEncoder) -> None:
        self._encoder = encoder
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._pending: list[Future[None]] = []

    def submit(self, rows: np.ndarray, lo: int, hi: int, steps: tuple[int, int], part: int,
               texts: Texts) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= MAX_PENDING:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._encoder.write, rows, lo, hi, steps, part,
                                                 texts))

    def close(self) -> None:
        """Wait for every part; re-raise the first write error."""
        try:
            for f in self._pending:
                f.result()
        finally:
            self._pool.shutdown(wait=True)


class ProcessWriter:
    """Parts written by a process of their own (see the module docstring), in order."""

    def __init__(self, directory: Path, statics: RunStatics, cols: StepColumns) -> None:
        if cols.shm_name is None:
            raise ValueError("a writer process needs StepColumns(shared=True)")
        from_parent, to_child = os.pipe()  # (read end, write end)
        from_child, to_parent = os.pipe()
        root = str(Path(__file__).resolve().parents[2])  # where this harness is imported from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "harness.simulate.writer", str(from_parent),
                 str(to_parent)], pass_fds=(from_parent, to_parent), env=env)
        except BaseException:
            for fd in (to_child, from_parent, from_child, to_parent):
                os.close(fd)
            raise
        os.close(from_parent)
        os.close(to_parent)
        self._out = Connection(to_child, readable=False)
        self._in = Connection(from_child, writable=False)
        self._pending = 0
        # The first message (the run's statics, the workload included) fills the pipe until the
        # new interpreter has started and reads it: a thread sends it while the loop runs.
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="records-writer-hello")
        self._hello: Future[None] | None = self._sender.submit(
            self._out.send, (directory, statics, cols.shm_name, cols.n))

    def _said_hello(self) -> None:
        if self._hello is not None:
            hello, self._hello = self._hello, None
            self._sender.shutdown(wait=False)
            try:
                hello.result()
            except OSError:
                raise self._gone() from None

    def submit(self, rows: np.ndarray, lo: int, hi: int, steps: tuple[int, int], part: int,
               texts: Texts) -> None:
        self._said_hello()
        while self._pending >= MAX_PENDING:
            self._ack()
        try:
            self._out.send((rows, lo, hi, steps, part, texts))
        except OSError:
            raise self._gone() from None
        self._pending += 1

    def _gone(self) -> RuntimeError:
        self._pending = 0
        return RuntimeError("the record writer process ended unexpectedly (exit code "
                            f"{self._proc.poll()})")

    def _ack(self) -> None:
        try:
            status, detail = self._in.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        self._pending -= 1
        if status != "ok":
            raise RuntimeError(f"writing a records part failed:\n{detail}")

    def close(self) -> None:
        """Wait for every part, stop the process; re-raise the first write error."""
        try:
            while self._pending:
                self._ack()
        finally:
            self._stop()

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            self._said_hello()  # never two writers on the pipe
        with contextlib.suppress(OSError):
            self._out.send(None)
        self._out.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        finally:
            self._in.close()


def _serve(conn_in: Connection, conn_out: Connection) -> None:
    """The writer process: write each part it is sent until told to stop (or orphaned)."""
    try:
        directory, statics, shm_name, n_steps = conn_in.recv()
    except EOFError:
        return
    cols = StepColumns(n_steps, attach=shm_name)
    # This interpreter has its own resource tracker: the block is the creator's to remove.
    resource_tracker.unregister(f"/{shm_name.lstrip('/')}", "shared_memory")
    encoder = PartEncoder(directory, statics, cols)
    try:
        while True:
            try:
                msg = conn_in.recv()
            except EOFError:  # the simulation's process is gone
                return
            if msg is None:
                return
            try:
                encoder.write(*msg)
                conn_out.send(("ok", ""))
            except Exception:  # reported to the simulation, which raises it
                conn_out.send(("error", traceback.format_exc()))
    finally:
        del encoder
        cols.close()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False),
           Connection(int(sys.argv[2]), readable=False))
