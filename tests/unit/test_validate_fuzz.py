"""Random corruptions of a valid table: validation returns a list of problems, never raises."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from harness.traces.schema import COLUMNS, V2_COLUMNS, to_table
from harness.traces.validate import Problem, check_table, validate_file

BASE: pa.Table = to_table(generate(load_profile("flaky-tools"), 6, 1))
N = BASE.num_rows

BAD_VALUES: list[Any] = [None, math.nan, math.inf, -math.inf, -1, -1.5, 0, "x", "", True,
                         2**40]
OTHER_TYPES = [pa.string(), pa.float64(), pa.int8(), pa.bool_(), pa.null(), pa.large_string(),
               pa.dictionary(pa.int32(), pa.string()), pa.list_(pa.int64())]


def _cast_or_rebuild(values: list[Any], typ: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=typ, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.nulls(len(values), type=typ)


def _set(table: pa.Table, name: str, arr: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, arr)


@st.composite
def corruption(draw: st.DrawFn) -> pa.Table:
    table = BASE
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["drop", "type", "value", "swap", "dup", "nulls", "empty",
                                   "rename", "shuffle", "dupcol"]))
        names = table.column_names
        if not names or table.num_rows == 0 and op not in ("drop", "type"):
            break
        col = draw(st.sampled_from(names))
        n = table.num_rows
        if op == "drop":
            table = table.drop_columns([col])
        elif op == "type":
            typ = draw(st.sampled_from(OTHER_TYPES))
            table = _set(table, col, _cast_or_rebuild(table.column(col).to_pylist(), typ))
        elif op == "value":
            values = table.column(col).to_pylist()
            values[draw(st.integers(0, n - 1))] = draw(st.sampled_from(BAD_VALUES))
            typ = table.schema.field(col).type
            try:
                arr = pa.array(values, type=typ, from_pandas=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                arr = pa.array([None if isinstance(v, bool) else str(v) for v in values],
                               type=pa.string())
            table = _set(table, col, arr)
        elif op == "swap":
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            order = list(range(n))
            order[i], order[j] = order[j], order[i]
            table = table.take(order)
        elif op == "dup":
            i = draw(st.integers(0, n - 1))
            table = pa.concat_tables([table.slice(0, i + 1), table.slice(i, n - i)])
        elif op == "nulls":
            typ = table.schema.field(col).type
            mask = [draw(st.booleans()) for _ in range(n)]
            values = [None if m else v for m, v in
                      zip(mask, table.column(col).to_pylist(), strict=True)]
            table = _set(table, col, _cast_or_rebuild(values, typ))
        elif op == "empty":
            table = table.slice(0, draw(st.integers(0, 1)))
        elif op == "dupcol":  # the last corruption: columns are no longer found by name
            table = table.append_column(col, table.column(col))
            break
        elif op == "rename":
            table = table.rename_columns([c + "_x" if c == col else c for c in names])
        else:
            order = draw(st.permutations(range(n)))
            table = table.take(list(order))
    return table


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corruption())
def test_check_table_never_raises(table: pa.Table) -> None:
    problems = check_table(table, "fuzz.parquet")
    assert isinstance(problems, list)
    assert all(isinstance(p, Problem) for p in problems)
    # version 2's columns may be absent (read as null); any other must be there
    if set(COLUMNS) - set(V2_COLUMNS) - set(table.column_names):
        assert any(p.rule in ("missing-column", "duplicate-column") for p in problems)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(corruption())
def test_validate_file_never_raises(tmp_path: Path, table: pa.Table) -> None:
    path = tmp_path / "fuzz.parquet"
    pq.write_table(table, path)
    problems = validate_file(path)
    assert isinstance(problems, list) and all(isinstance(p, Problem) for p in problems)


def test_base_is_valid() -> None:
    assert check_table(BASE, "base") == []
