"""Append-only Parquet parts for records and server samples, and atomic JSON files.

Rows are buffered and flushed as a new part file every `flush_rows` rows or `flush_s` seconds,
each part written to a temporary name and renamed, so a killed run leaves only whole parts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import InputError
from harness.records.schema import (
    RECORDS_SCHEMA,
    RECORDS_SCHEMA_VERSION,
    RECORDS_VERSION_KEY,
    SERVER_METRICS_SCHEMA,
)

RECORDS_DIR = "records"
SERVER_METRICS_DIR = "server_metrics"
RUN_JSON = "run.json"
SUMMARY_JSON = "summary.json"


class PartWriter:
    """Buffers rows (dicts) and writes them as numbered Parquet parts of one schema."""

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        flush_rows: int = 2000,
        flush_s: float = 1.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self._now = now
        self._rows: list[dict[str, Any]] = []
        self._part = 0
        self._last_flush = now()
        directory.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.flush_rows or self._now() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = self._now()
        if not self._rows:
            return
        table = pa.Table.from_pylist(self._rows, schema=self.schema)
        final = self.directory / f"part-{self._part:05d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, final)
        self._part += 1
        self._rows = []


def read_parts(directory: Path, schema: pa.Schema) -> pd.DataFrame:
    """All whole parts of a directory as one frame (empty frame with the schema when none)."""
    parts = sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []
    if not parts:
        empty: pd.DataFrame = schema.empty_table().to_pandas()
        return empty
    tables = [pq.read_table(p, schema=schema) for p in parts]
    frame: pd.DataFrame = pa.concat_tables(tables).to_pandas()
    return frame


def records_version(part: Path) -> int:
    """The records schema version a part was written with (1 for parts that predate the key);
    InputError for a version this harness cannot read."""
    meta = pq.read_schema(part).metadata or {}
    raw = meta.get(RECORDS_VERSION_KEY, b"1")
    try:
        version = int(raw)
    except ValueError:
        raise InputError(f"{part}: records schema version {raw!r} is not a number") from None
    if version > RECORDS_SCHEMA_VERSION:
        raise InputError(f"{part}: records schema version {version} is newer than this harness "
                         f"reads ({RECORDS_SCHEMA_VERSION}); upgrade the harness")
    return version


def read_records(results_dir: Path) -> pd.DataFrame:
    """The event records of a results directory, ordered by seq."""
    directory = results_dir / RECORDS_DIR
    for part in sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []:
        records_version(part)
    df = read_parts(directory, RECORDS_SCHEMA)
    return df.sort_values("seq", kind="stable").reset_index(drop=True)


def read_server_metrics(results_dir: Path) -> pd.DataFrame:
    return read_parts(results_dir / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (temporary file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
