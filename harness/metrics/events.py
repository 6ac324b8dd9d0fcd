"""One run's records split by event type: what the frames read, without the wide table.

A records table is wide (37 columns) and sparse: each event fills a few of them. The frames read,
for every row, its seq, time, trajectory and event, and from each event type a handful of the
columns it declares (EVENT_COLUMNS, checked against harness.records.kinds); a column asked of
rows of several types is null on those of a type that does not have it. `Events` holds just
that: four arrays over all rows and one small table per event type. `Events.from_frame` splits
an in-memory records table; `read_events` builds the same thing from a results directory a
batch of rows at a time, so the wide table is never in memory (a 1M-record run: ~70 MB of
tables instead of a ~170 MB frame, strings categorical in both).

Either way `Events.rows` serves every column with the dtype it has in a whole in-memory table
(an int column with a null in any row is float64, a bool column with one is object, strings are
str), so the frames, and so summary.json, do not depend on how the records were read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.arrays import BoolArray
from harness.errors import InputError
from harness.records import legacy
from harness.records.kinds import KIND_COLUMNS
from harness.records.schema import RECORD_COLUMNS, RECORDS_SCHEMA
from harness.records.store import (
    RECORDS_DIR,
    check_records_part,
    check_unique_seq,
    string_codes,
)

# Columns every row has in `Events` (as arrays), and what each event type adds (as a table):
# of the columns it declares, those the frames read.
CORE_COLUMNS = ("seq", "t_ns", "_code", "event")
EVENT_COLUMNS: dict[str, tuple[str, ...]] = {
    "trajectory_start": ("trajectory_id", "traffic", "parent_id", "planned_ns"),
    "call_start": ("trajectory_id", "traffic", "step", "planned_ns", "prompt_tokens",
                   "appended_tokens", "is_resume"),
    "first_token": (),
    "call_end": ("status", "output_tokens", "cached_tokens", "prompt_n", "server_ms",
                 "decode_ms", "token_gaps", "served_by", "engine_queue_s"),
    "tool_start": ("trajectory_id", "step", "tool_class", "tool_name", "planned_latency_s",
                   "deadline_s"),
    "pause_decision": ("trajectory_id", "step", "tool_class", "action", "reason",
                       "retained_tokens", "predicted_wait_s", "status"),
    "tool_end": ("status", "planned_ns"),
    "swap_out": ("bytes", "server_ms"),
    "swap_in": ("bytes", "server_ms"),
    "erase": (),
    "recompute": ("recomputed_tokens",),
    "kv_state": ("kv_tokens", "status", "traffic"),
    "slot_wait": ("slot_wait_s",),
    "trajectory_end": ("trajectory_id", "traffic", "status", "reason"),
    "hint_outcome": ("trajectory_id", "step", "action", "status", "reason", "held_s",
                     "hint_delay_s"),
}
for _event, _cols in EVENT_COLUMNS.items():
    if _undeclared := set(_cols) - set(KIND_COLUMNS[_event]):
        raise TypeError(f"{_event} has no column {sorted(_undeclared)} (harness.records.kinds)")
# The record columns the frames read: stamped and of some event.
FRAME_COLUMNS: tuple[str, ...] = tuple(
    c for c in RECORD_COLUMNS
    if c in ("seq", "t_ns", "event") or any(c in cols for cols in EVENT_COLUMNS.values()))


@dataclass(frozen=True)
class Events:
    """A run's records by event type, rows in seq order.

    seq, t_ns: those columns of every row (their dtypes in the records); codes: the trajectory
    of every row (codes in order of first appearance, -1 for none); event: every row's event,
    as a code into `names`; tables: per event type of EVENT_COLUMNS, its rows (indexed by row
    number) with that type's columns, or else `records`, the whole table they are taken from
    as they are asked for; extra: full-length arrays that `rows` also serves.
    """

    seq: np.ndarray
    t_ns: np.ndarray
    codes: np.ndarray
    event: np.ndarray
    names: dict[str, int]
    tables: dict[str, pd.DataFrame]
    records: pd.DataFrame | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # per column, the dtype it has in the whole records table: a type's table that lacks a
    # column asked of it serves it null in that dtype
    dtypes: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.seq.size)

    @classmethod
    def from_frame(cls, records: pd.DataFrame) -> Events:
        """An in-memory records table (any column missing is taken as null) as Events.

        Rows are selected from the table when asked for, not copied into per-event tables: the
        caller holds the table anyway, and copies would only add to it.
        """
        df = complete_columns(records)
        codes = _factorize(df["trajectory_id"])
        ev_codes, ev_names = pd.factorize(df["event"])
        names = {str(v): i for i, v in enumerate(ev_names)}
        return cls(df["seq"].to_numpy(), df["t_ns"].to_numpy(), codes, ev_codes, names, {}, df)

    def with_extra(self, **arrays: np.ndarray) -> Events:
        """A copy that also serves these full-length arrays as columns."""
        return dataclasses.replace(self, extra={**self.extra, **arrays})

    def mask(self, *events: str) -> BoolArray:
        """Which rows are one of these events."""
        idx = [self.names[e] for e in events if e in self.names]
        out: BoolArray = np.isin(self.event, idx) if idx else np.zeros(len(self), dtype=bool)
        return out

    def rows(self, events: Sequence[str], cols: Sequence[str], plain: bool = True) -> pd.DataFrame:
        """The rows of these event types, in record order and indexed by row number, with
        `cols`: CORE_COLUMNS, `extra` arrays, or columns their EVENT_COLUMNS tables hold.

        plain: strings as str, the dtype an in-memory records table has (the tables may hold
        them as categoricals); else as held (categorical or, across event types, object).
        """
        own = [c for c in cols if c not in CORE_COLUMNS and c not in self.extra]
        if self.records is not None:
            base = self.records.loc[self.mask(*events), own]
            base = _plain(base) if plain else base
        else:
            tabs = [self._own(e, own) for e in events]
            tabs = [_plain(t) for t in tabs] if plain else tabs
            filled = [t for t in tabs if len(t)] or tabs[:1]
            base = filled[0] if len(filled) == 1 else pd.concat(filled).sort_index(kind="stable")
        pos = base.index.to_numpy()
        names = np.array(list(self.names), dtype=object)
        data: dict[str, pd.Series | np.ndarray] = {}
        for c in cols:
            if c in own:
                data[c] = base[c]
            elif c == "_code":
                data[c] = self.codes[pos]
            elif c == "event":
                data[c] = pd.Series(names[self.event[pos]], index=base.index, dtype="str")
            else:
                data[c] = (self.extra[c] if c in self.extra else getattr(self, c))[pos]
        return pd.DataFrame(data, index=base.index, columns=list(cols), copy=False)

    def _own(self, event: str, cols: list[str]) -> pd.DataFrame:
        """An event type's table with `cols`, null where the type has no such column."""
        table = self.tables[event]
        if missing := [c for c in cols if c not in table.columns]:
            table = table.assign(**{c: _nulls(len(table), table.index, self.dtypes.get(c))
                                    for c in missing})
        return table[cols]


def _nulls(n: int, index: pd.Index, dtype: Any) -> pd.Series:
    """A null column: categorical (a string column, as the tables hold them) unless `dtype`."""
    if dtype is None:
        return pd.Series(pd.Categorical([None] * n, categories=pd.Index([], dtype="str")),
                         index=index)
    return pd.Series(np.full(n, None if dtype == np.dtype(object) else np.nan, dtype=dtype),
                     index=index)


def complete_columns(records: pd.DataFrame) -> pd.DataFrame:
    """The records with every column the frames read present (missing ones null), by seq."""
    df = records
    missing = [f for f in RECORDS_SCHEMA if f.name in FRAME_COLUMNS and f.name not in df.columns]
    if missing:
        extra = {}
        for f in missing:
            if pa.types.is_string(f.type):
                extra[f.name] = pd.Series([None] * len(df), index=df.index, dtype=object)
            else:
                extra[f.name] = pd.Series(np.nan, index=df.index, dtype="float64")
        df = df.assign(**extra)
    if "seq" in records.columns and not df["seq"].is_monotonic_increasing:
        df = df.sort_values("seq", kind="stable")
    if isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1:
        return df
    return df.reset_index(drop=True)


def _plain(table: pd.DataFrame) -> pd.DataFrame:
    """The table with categorical columns as str: the frames get the dtype an in-memory records
    table has, so every metric behaves the same whichever way the records came."""
    cats = [c for c in table.columns if isinstance(table[c].dtype, pd.CategoricalDtype)]
    if cats:
        table = table.assign(**{c: table[c].astype("str") for c in cats})
    return table


def read_events(results_dir: Path, damage: list[str] | None = None) -> Events:
    """A results directory's records as Events, read one part at a time.

    Raises what reading Parquet raises (OSError, ValueError, ArrowException) and InputError for
    a records version this harness cannot read; an empty Events when there are no parts.
    With `damage` (a list), a part that cannot be read, or that repeats events an earlier part
    holds (a copy), is left out and said in `damage` instead, as long as another part reads:
    what is readable of a damaged run is then still reported.
    """
    directory = Path(results_dir) / RECORDS_DIR
    parts = sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []
    reader = _Reader()
    seen: list[np.ndarray] = []
    first_problem: InputError | None = None
    for part in parts:
        if damage is None:
            reader.add(part, check_records_part(part))
            continue
        try:
            version = check_records_part(part)
            seq = pq.read_table(part, columns=["seq"]).column("seq").to_numpy()
        except (InputError, OSError, ValueError, pa.ArrowException) as exc:
            first_problem = first_problem or InputError(str(exc))
            damage.append(f"{str(exc).splitlines()[0][:240]}: left out")
            continue
        # Parts hold disjoint runs of sequence numbers: only a part whose range meets an
        # earlier one's is compared with it element by element.
        lo, hi = (int(seq.min()), int(seq.max())) if seq.size else (0, -1)
        if (repeated := int(sum(np.isin(seq, s).sum() for s in seen
                                if s.size and s[0] <= hi and lo <= s[-1]))):
            damage.append(f"{part}: repeats {repeated:,} events an earlier part holds (a part "
                          "copied in twice?): left out")
            continue
        seen.append(np.sort(seq))  # sorted: its ends are its range
        reader.add(part, version)
    if damage is not None and first_problem is not None and not seen:
        raise first_problem  # nothing readable is left to report
    events = reader.events()
    check_unique_seq(events.seq, directory)
    del reader
    # Arrow's allocator keeps freed pages for reuse; what comes next allocates through numpy
    pa.default_memory_pool().release_unused()
    return events


_DICT = pa.dictionary(pa.int32(), pa.string())
# Parts are split by event type in batches of about this many rows: splitting each small part
# on its own leaves thousands of tiny Arrow tables, whose overhead outweighs their data.
BATCH_ROWS = 1 << 16


class _Reader:
    """Accumulates parts: the core columns as numpy pieces, each event's rows as Arrow tables."""

    def __init__(self) -> None:
        self.n = 0
        self.core: dict[str, list[np.ndarray]] = {c: [] for c in ("seq", "t_ns", "tid", "ev")}
        self.lookups: dict[str, dict[str, int]] = {"tid": {}, "ev": {}}
        self.subs: dict[str, list[pa.Table]] = {e: [] for e in EVENT_COLUMNS}
        self.pos: dict[str, list[np.ndarray]] = {e: [] for e in EVENT_COLUMNS}
        # whether a column has a null in any row: the dtype the whole column would have
        self.has_null = dict.fromkeys(FRAME_COLUMNS, False)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add(self, part: Path, version: int) -> None:
        """Read one part of records `version` (only FRAME_COLUMNS, an older version's as the
        current one's: harness.records.legacy; strings dictionary-encoded as stored)."""
        present = set(pq.read_schema(part).names)
        read = [c for c in FRAME_COLUMNS if c in present]
        read += [c for c in legacy.sources(FRAME_COLUMNS, version) if c in present]
        strings = [c for c in read if c in FRAME_COLUMNS
                   and pa.types.is_string(RECORDS_SCHEMA.field(c).type)]
        reader = pq.ParquetFile(part, read_dictionary=strings)
        # in batches: the simulator writes parts of 500,000 rows
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=read):
            table = legacy.upgrade(pa.Table.from_batches([batch]), version)
            self.pending.append(_conform(table))
            self.pending_rows += batch.num_rows
            if self.pending_rows >= BATCH_ROWS:
                self.flush()

    def flush(self) -> None:
        """Split the parts read since the last flush by event type."""
        if not self.pending:
            return
        table = pa.concat_tables(self.pending).combine_chunks()  # one dictionary per column
        self.pending, self.pending_rows = [], 0
        for c in FRAME_COLUMNS:
            self.has_null[c] |= table.column(c).null_count > 0
        self.core["seq"].append(table.column("seq").to_numpy())
        self.core["t_ns"].append(table.column("t_ns").to_numpy())
        for key, col in (("tid", "trajectory_id"), ("ev", "event")):
            chunks = table.column(col).chunks
            lookup = self.lookups[key]
            self.core[key].append(np.concatenate([string_codes(c, lookup) for c in chunks])
                                  if chunks else np.zeros(0, dtype=np.int32))
        ev = self.core["ev"][-1]
        for name, code in self.lookups["ev"].items():
            mask = ev == code
            if name in EVENT_COLUMNS and mask.any():
                self.subs[name].append(table.select(list(EVENT_COLUMNS[name]))
                                       .filter(pa.array(mask)))
                self.pos[name].append(np.flatnonzero(mask) + self.n)
        self.n += table.num_rows

    def events(self) -> Events:
        """The parts read so far as Events (rows sorted by seq, stably)."""
        self.flush()
        seq, t_ns, tid, ev = (_join(self.core.pop(c)) for c in ("seq", "t_ns", "tid", "ev"))
        inv = None
        if seq.size > 1 and not bool(np.all(seq[1:] >= seq[:-1])):
            order = np.argsort(seq, kind="stable")
            seq, t_ns, tid, ev = seq[order], t_ns[order], tid[order], ev[order]
            inv = np.empty_like(order)
            inv[order] = np.arange(order.size)
        codes = _factorize(pd.Categorical.from_codes(
            tid, categories=pd.RangeIndex(len(self.lookups["tid"]))))
        tables = {e: self._table(e, inv) for e in EVENT_COLUMNS}
        dtypes = {c: _whole_dtype(c, self.has_null[c]) for c in FRAME_COLUMNS}
        return Events(seq, t_ns, codes, ev, dict(self.lookups["ev"]), tables, dtypes=dtypes)

    def _table(self, event: str, inv: np.ndarray | None) -> pd.DataFrame:
        """One event's rows as a frame: strings categorical, other columns of the dtype they
        have in the whole table."""
        cols = list(EVENT_COLUMNS[event])
        subs = self.subs.pop(event)
        pos = _join(self.pos.pop(event)).astype(np.int64)
        index = pd.Index(pos if inv is None else inv[pos], dtype=np.int64)
        if not cols:
            frame = pd.DataFrame(index=index)
        else:
            schema = _read_schema(cols)
            table = pa.concat_tables(subs) if subs else schema.empty_table()
            frame = table.to_pandas()
            del table, subs
            for c in cols:
                dtype = _whole_dtype(c, self.has_null[c])
                if dtype is not None and frame[c].dtype != dtype:
                    frame[c] = frame[c].astype(dtype)
            frame.index = index
        return frame if inv is None else frame.sort_index(kind="stable")


def _read_schema(cols: Sequence[str]) -> pa.Schema:
    """The schema's fields, strings dictionary-encoded."""
    fields = [RECORDS_SCHEMA.field(c) for c in cols]
    return pa.schema([pa.field(f.name, _DICT if pa.types.is_string(f.type) else f.type)
                      for f in fields])


def _conform(table: pa.Table) -> pa.Table:
    """A part's table with every FRAME_COLUMN (missing ones null) of the read schema's type."""
    schema = _read_schema(FRAME_COLUMNS)
    cols = []
    for f in schema:
        if f.name not in table.column_names:
            cols.append(pa.chunked_array([pa.nulls(table.num_rows, f.type)], type=f.type))
            continue
        col = table.column(f.name)
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _whole_dtype(col: str, has_null: bool) -> np.dtype | None:
    """The pandas dtype of a column in the whole records table (None: strings, which the
    tables keep categorical)."""
    typ = RECORDS_SCHEMA.field(col).type
    if pa.types.is_integer(typ):
        return np.dtype("float64") if has_null else np.dtype(typ.to_pandas_dtype())
    if pa.types.is_boolean(typ):
        return np.dtype(object) if has_null else np.dtype(bool)
    if pa.types.is_floating(typ):
        return np.dtype("float64")
    return None


def _factorize(values: pd.Series | pd.Categorical[Any]) -> np.ndarray:
    """Codes of the values in order of first appearance, -1 for null, as int64 whatever the
    values' dtype (a categorical's factorize gives its small code type)."""
    codes, _ = pd.factorize(values, use_na_sentinel=True)
    out: np.ndarray = codes.astype(np.int64, copy=False)
    return out


def _join(pieces: list[np.ndarray]) -> np.ndarray:
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    out: np.ndarray = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return out
