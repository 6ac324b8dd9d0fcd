"""Reading the Parquet parts of a results directory (records and server samples), and atomic
JSON files. The parts are written by harness.records.parts, each to a temporary name then
renamed, so a killed run leaves only whole parts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.errors import InputError
from harness.records import legacy
from harness.records.atomic import write_text_atomic
from harness.records.schema import (
    RECORDS_SCHEMA,
    RECORDS_SCHEMA_VERSION,
    RECORDS_VERSION_KEY,
    SERVER_METRICS_SCHEMA,
)

RECORDS_DIR = "records"
SERVER_METRICS_DIR = "server_metrics"
RUN_JSON = "run.json"
# The columns every records part of every version has: one without them is not one.
RECORDS_CORE = ("run_id", "seq", "t_ns", "event", "trajectory_id")
SUMMARY_JSON = "summary.json"


def read_parts(
    directory: Path,
    schema: pa.Schema,
    columns: Sequence[str] | None = None,
    order_by: str | None = None,
) -> pd.DataFrame:
    """All whole parts of a directory as one frame (an empty frame of the schema when none).

    `columns` picks and orders columns (default: the schema's). String columns come back
    categorical (sorted categories, missing values NaN): a run's strings repeat (events,
    trajectory ids, statuses), and as codes they cost a byte or two per row instead of the
    string's bytes and offset. Other columns have the dtypes `Table.to_pandas` gives for the
    whole table (ints with a null anywhere as float64, bools with one as object). Parts are
    read a batch of rows at a time into arrays sized from the parts' footers, so the peak is
    about the frame plus one batch; `order_by` sorts the rows by that column (stable), one
    column at a time.
    """
    names = list(schema.names if columns is None else columns)
    wanted = names if order_by is None or order_by in names else [*names, order_by]
    parts = sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []
    footers = [pq.read_metadata(part) for part in parts]
    n = sum(f.num_rows for f in footers)
    cols = {name: _Column(schema.field(name), n, _has_nulls(footers, name)) for name in wanted}
    at = 0
    records = RECORDS_VERSION_KEY in (schema.metadata or {})
    for part, footer in zip(parts, footers, strict=True):
        _read_part(part, footer, at, cols, records)
        at += footer.num_rows
    del footers
    order = None
    if order_by is not None:
        key = cols.pop(order_by).values if order_by not in names else cols[order_by].values
        if key.size > 1 and not bool(np.all(key[1:] >= key[:-1])):
            order = np.argsort(key, kind="stable")
        del key
    data: dict[str, Any] = {}
    for name in names:
        data[name] = cols.pop(name).result(order)
    return pd.DataFrame(data, columns=names, copy=False)


# Rows decoded at a time: a part written by the simulator holds 500,000 rows, and decoding it in
# one go would put a wide Arrow table of it beside the frame being filled.
READ_BATCH_ROWS = 1 << 16


def _read_part(part: Path, footer: pq.FileMetaData, at: int, cols: dict[str, _Column],
               records: bool = False) -> None:
    """One part's columns into rows at.. of `cols` (columns the part lacks: nulls); a records
    part of an older version is read as the current one (harness.records.legacy)."""
    schema = footer.schema.to_arrow_schema()
    present = set(schema.names)
    version = records_version(part, schema) if records else RECORDS_SCHEMA_VERSION
    read = [name for name in cols if name in present]
    read += [name for name in legacy.sources(cols, version) if name in present]
    strings = [name for name in read if name in cols and cols[name].lookup is not None]
    reader = pq.ParquetFile(part, read_dictionary=strings)
    start = at
    for batch in reader.iter_batches(batch_size=READ_BATCH_ROWS, columns=read):
        table = legacy.upgrade(pa.Table.from_batches([batch]), version)
        names = set(table.column_names)
        for name, col in cols.items():
            col.put(at, table.column(name) if name in names else None, table.num_rows)
        at += table.num_rows
    if at - start != footer.num_rows:
        raise ValueError(f"{part}: {at - start} rows, its footer says {footer.num_rows}")


def _has_nulls(footers: list[pq.FileMetaData], name: str) -> bool:
    """Whether the footers' statistics show a null in the column (or a part without it); False
    also when they do not say, and the column is widened when a null turns up."""
    for footer in footers:
        if footer.num_rows and name not in footer.schema.names:
            return True
        j = footer.schema.names.index(name) if footer.num_rows else -1
        for i in range(footer.num_row_groups if j >= 0 else 0):
            stats = footer.row_group(i).column(j).statistics
            if stats is not None and stats.has_null_count and stats.null_count > 0:
                return True
    return False


class _Column:
    """One column of a frame being read, filled part by part into one preallocated array."""

    def __init__(self, field: pa.Field, n: int, nulls: bool) -> None:
        self.field = field
        # strings are held as int32 codes into `lookup` (word -> code) until the end
        self.lookup: dict[str, int] | None = {} if _is_string(field.type) else None
        dtype: np.dtype[Any]
        if self.lookup is not None:
            dtype = np.dtype(np.int32)
        elif nulls and pa.types.is_integer(field.type):
            dtype = np.dtype(np.float64)  # allocated as pandas holds an int column with nulls
        elif nulls and pa.types.is_boolean(field.type):
            dtype = np.dtype(object)
        else:
            dtype = np.dtype(field.type.to_pandas_dtype())
        self.values: np.ndarray = np.empty(n, dtype=dtype)

    def put(self, at: int, col: pa.ChunkedArray | None, n: int) -> None:
        """Rows at..at+n from one part's column (None: the part lacks it, all null)."""
        if col is None:
            col = pa.chunked_array([pa.nulls(n, self.field.type)])
        if self.lookup is not None:
            for chunk in col.chunks:
                self.values[at:at + len(chunk)] = string_codes(chunk, self.lookup)
                at += len(chunk)
            return
        if col.type != self.field.type:
            col = col.cast(self.field.type)
        piece = col.to_numpy()  # float64 for ints with nulls, object for bools with nulls
        wide = np.result_type(self.values.dtype, piece.dtype)
        if wide != self.values.dtype:
            # the first nulls of this column: widen it as pandas would (int -> float64,
            # bool -> object), once
            self.values = self.values.astype(wide)
        self.values[at:at + n] = piece

    def result(self, order: np.ndarray | None) -> np.ndarray | pd.Categorical:
        """The column for the frame (rows taken in `order` when given)."""
        values = self.values if order is None else self.values[order]
        self.values = np.zeros(0, dtype=values.dtype)
        if self.lookup is None:
            return values
        return _categorical(values, self.lookup)


def _is_string(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))


def string_codes(chunk: pa.Array, lookup: dict[str, int]) -> np.ndarray:
    """A chunk of strings (plain or dictionary-encoded) as int32 codes into `lookup`, a word ->
    code map that it extends with the words it has not seen; -1 for null."""
    enc = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
    words = enc.dictionary.to_pylist()
    # the last slot maps nulls, whose indices are filled with len(words)
    mapping = np.array([lookup.setdefault(w, len(lookup)) for w in words] + [-1], dtype=np.int32)
    idx = pc.fill_null(enc.indices, len(words)).to_numpy()
    codes: np.ndarray = mapping[idx]
    return codes


def _categorical(codes: np.ndarray, lookup: dict[str, int]) -> pd.Categorical:
    """Codes into `lookup`'s words -> a Categorical with the words sorted (so sorting the
    column sorts it as strings)."""
    words = np.array(list(lookup), dtype=object)
    order = np.argsort(words, kind="stable")
    rank = np.empty(len(words) + 1, dtype=np.int32)
    rank[order] = np.arange(len(words))
    rank[-1] = -1  # code -1 (null) indexes the last slot
    return pd.Categorical.from_codes(rank[codes], categories=pd.Index(words[order], dtype="str"))


def part_schema(part: Path) -> pa.Schema:
    """A records part's schema; InputError naming the file when it cannot be read (truncated,
    empty, not Parquet)."""
    try:
        return pq.read_schema(part)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{part}: unreadable records part "
                         f"({str(exc).splitlines()[0][:160]})") from None


def records_version(part: Path, schema: pa.Schema | None = None) -> int:
    """The records schema version a part was written with (1 for parts that predate the key);
    InputError for a version this harness cannot read. `schema`: the part's, when read already."""
    meta = (schema if schema is not None else part_schema(part)).metadata or {}
    raw = meta.get(RECORDS_VERSION_KEY, b"1")
    try:
        version = int(raw)
    except ValueError:
        raise InputError(f"{part}: records schema version {raw!r} is not a number") from None
    if version > RECORDS_SCHEMA_VERSION:
        raise InputError(f"{part}: records schema version {version} is newer than this harness "
                         f"reads ({RECORDS_SCHEMA_VERSION}); upgrade the harness")
    return version


def read_records(results_dir: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The event records of a results directory, ordered by seq (`read_parts`' dtypes: string
    columns categorical); `columns` picks columns, all the schema's by default."""
    directory = results_dir / RECORDS_DIR
    for part in sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []:
        check_records_part(part)
    frame = read_parts(directory, RECORDS_SCHEMA, columns, order_by="seq")
    if "seq" in frame.columns:
        check_unique_seq(frame["seq"].to_numpy(), directory)
    return frame


def check_records_part(part: Path) -> int:
    """A records part's version, after checking that it can be read and has the columns every
    version has; InputError naming the file otherwise."""
    schema = part_schema(part)  # read once: the version and the columns
    version = records_version(part, schema)
    if missing := [c for c in RECORDS_CORE if c not in schema.names]:
        # a later column missing is an older version (read as nulls); these never are
        raise InputError(f"{part}: a records part without the column(s) {', '.join(missing)}; "
                         "not a harness records part, or damaged")
    return version


def check_unique_seq(seq: np.ndarray, directory: Path) -> None:
    """InputError when an event's sequence number repeats (a part copied in twice)."""
    if seq.size > 1:
        ordered = seq if bool(np.all(seq[1:] >= seq[:-1])) else np.sort(seq)
        dup = np.flatnonzero(ordered[1:] == ordered[:-1])
        if dup.size:
            raise InputError(f"{directory}: event {int(ordered[dup[0]])} is recorded twice "
                             "(a records part copied in twice?)")


def read_server_metrics(results_dir: Path) -> pd.DataFrame:
    """The scraped server samples of a results directory (string columns categorical)."""
    return read_parts(results_dir / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (temporary file + rename)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file; InputError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def ensure_out_dir(path: Path, flag: str = "--out") -> None:
    """Create a results directory; InputError when `path` is a file or cannot be made."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path} is a file; give a directory for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot create it ({exc.strerror or exc})") from None
