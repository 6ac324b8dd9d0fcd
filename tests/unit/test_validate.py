"""Every rule of the trajectory validator via `harness traces validate` (exit 2, one line each).

Each test writes a small file that breaks one rule and checks the exact rule name and where
(file, trajectory, step) in the message, and that no traceback reaches the user.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.traces.schema import (
    ARROW_SCHEMA,
    META_SCHEMA_VERSION,
    Provenance,
    to_table,
    write_trajectories,
)
from harness.traces.validate import (
    Problem,
    check_frame,
    check_table,
    load_trajectories,
    validate_file,
)

NAN, INF = math.nan, math.inf


def base() -> pd.DataFrame:
    """Two valid trajectories: 'a' (llm, tool, llm) and 'b' (llm, a tool that never returns)."""
    rows: list[dict[str, Any]] = [
        dict(trajectory_id="a", step=0, kind="llm", input_tokens=100, output_tokens=10),
        dict(trajectory_id="a", step=1, kind="tool", tool_name="search",
             tool_class="remote_read", latency_s=0.5, deadline_s=10.0, outcome="ok",
             mutating=False),
        dict(trajectory_id="a", step=2, kind="llm", input_tokens=20, output_tokens=5),
        dict(trajectory_id="b", step=0, kind="llm", input_tokens=50, output_tokens=5),
        dict(trajectory_id="b", step=1, kind="tool", tool_name="http_get",
             tool_class="remote_read", latency_s=None, deadline_s=None, outcome="abandoned",
             mutating=False),
    ]
    df = pd.DataFrame(rows, columns=list(ARROW_SCHEMA.names))
    df["start_s"] = [0.0, 0.0, 0.0, 1.5, 1.5]
    df["priority"] = "interactive"
    df["tenant"] = "t0"
    df["step"] = df["step"].astype("int32")
    for c in ("input_tokens", "output_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("latency_s", "deadline_s"):
        df[c] = df[c].astype("float64")
    df["mutating"] = df["mutating"].astype("boolean")
    return df


def write_frame(tmp_path: Path, df: pd.DataFrame) -> Path:
    out = tmp_path / "w.parquet"
    write_trajectories(df, out, Provenance("test"))
    return out


def write_table(tmp_path: Path, table: pa.Table) -> Path:
    out = tmp_path / "w.parquet"
    pq.write_table(table, out)
    return out


def with_column(table: pa.Table, name: str, values: list[Any], typ: pa.DataType) -> pa.Table:
    """The table with column `name` replaced (NaN kept as NaN, not turned into null)."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values, type=typ, from_pandas=False))


def expect(path: Path, rule: str, trajectory: str | None = None, step: int | None = None,
           message: str = "") -> str:
    """Run the CLI; assert exit 2 and a line naming the file, trajectory, step and rule."""
    r = CliRunner().invoke(main, ["traces", "validate", str(path)])
    assert r.exit_code == 2, r.output
    where = [str(path)]
    if trajectory is not None:
        where.append(f"trajectory {trajectory!r}")
    if step is not None:
        where.append(f"step {step}")
    line = f"{': '.join(where)}: [{rule}] {message}"
    assert line in r.output, r.output
    assert "Traceback" not in r.output
    return r.output


def test_valid_base_file(tmp_path: Path) -> None:
    path = write_frame(tmp_path, base())
    r = CliRunner().invoke(main, ["traces", "validate", str(path)])
    assert r.exit_code == 0 and f"{path}: valid" in r.output
    assert validate_file(path) == []
    assert len(load_trajectories(path)) == 5


def test_missing_file(tmp_path: Path) -> None:
    expect(tmp_path / "nope.parquet", "unreadable", message="file does not exist")


def test_not_parquet(tmp_path: Path) -> None:
    p = tmp_path / "w.parquet"
    p.write_text("trajectory_id,step\na,0\n")
    expect(p, "not-parquet", message="cannot read as Parquet")


def test_schema_version(tmp_path: Path) -> None:
    table = to_table(base()).replace_schema_metadata({META_SCHEMA_VERSION: b"99"})
    expect(write_table(tmp_path, table), "schema-version",
           message="schema version '99' is not one this harness reads (1, 2; it writes '2')")


@pytest.mark.parametrize("column", ["latency_s", "trajectory_id", "mutating"])
def test_missing_column(tmp_path: Path, column: str) -> None:
    table = to_table(base()).drop_columns([column])
    expect(write_table(tmp_path, table), "missing-column",
           message=f"column {column!r} is missing")


@pytest.mark.parametrize("column, values, typ", [
    ("step", ["0", "1", "2", "0", "1"], pa.string()),
    ("input_tokens", [1.0, None, 2.0, 3.0, None], pa.float64()),
    ("kind", [1, 2, 1, 1, 2], pa.int64()),
    ("mutating", [None, "no", None, None, "no"], pa.string()),
])
def test_wrong_type(tmp_path: Path, column: str, values: list[Any], typ: pa.DataType) -> None:
    table = with_column(to_table(base()), column, values, typ)
    expect(write_table(tmp_path, table), "column-type", message=f"column {column!r} has type")


def test_duplicate_column(tmp_path: Path) -> None:
    table = to_table(base())
    table = table.append_column("step", table.column("step"))
    assert [p.rule for p in check_table(table, "t")] == ["duplicate-column"]
    # Parquet files with a repeated column are refused when read.
    expect(write_table(tmp_path, table), "not-parquet", message="cannot read as Parquet")


def test_empty_workload(tmp_path: Path) -> None:
    expect(write_table(tmp_path, to_table(base()).slice(0, 0)), "empty-workload",
           message="the file holds no steps")


def _edit(row: int, col: str, value: Any) -> Callable[[pd.DataFrame], None]:
    def f(df: pd.DataFrame) -> None:
        df.loc[row, col] = value
    return f


@pytest.mark.parametrize("edit, rule, tid, step, message", [
    (_edit(0, "kind", "llm2"), "bad-kind", "a", 0, "kind must be 'llm' or 'tool'"),
    (_edit(3, "priority", "urgent"), "bad-priority", "b", 0, "priority must be one of"),
    (_edit(1, "step", -1), "bad-step", "a", -1, "step must be >= 0"),
    (_edit(2, "output_tokens", pd.NA), "missing-tokens", "a", 2, "LLM step needs"),
    (_edit(2, "input_tokens", -3), "bad-tokens", "a", 2, "'input_tokens' must be >= 0"),
    (_edit(0, "output_tokens", 0), "bad-tokens", "a", 0, "'output_tokens' must be >= 1"),
    (_edit(1, "latency_s", -0.1), "bad-latency", "a", 1, "latency_s must be finite and >= 0"),
    (_edit(1, "latency_s", INF), "bad-latency", "a", 1, "latency_s must be finite"),
    (_edit(1, "deadline_s", 0.0), "bad-deadline", "a", 1, "deadline_s must be finite and > 0"),
    (_edit(1, "deadline_s", -INF), "bad-deadline", "a", 1, "deadline_s must be finite"),
    (_edit(1, "outcome", "done"), "bad-outcome", "a", 1, "outcome must be one of"),
    (_edit(4, "outcome", "ok"), "never-returns", "b", 1, "a tool with null latency never "
                                                       "returns"),
    (_edit(1, "tool_class", None), "missing-tool-class", "a", 1, "tool step needs"),
    (_edit(1, "mutating", pd.NA), "missing-mutating", "a", 1, "tool step needs 'mutating'"),
])
def test_row_rules(tmp_path: Path, edit: Callable[[pd.DataFrame], None], rule: str, tid: str,
                   step: int, message: str) -> None:
    df = base()
    edit(df)
    expect(write_frame(tmp_path, df), rule, tid, step, message)


@pytest.mark.parametrize("column, typ", [("tenant", pa.string()), ("step", pa.int32()),
                                          ("start_s", pa.float64())])
def test_null_value(tmp_path: Path, column: str, typ: pa.DataType) -> None:
    table = to_table(base())
    values = table.column(column).to_pylist()
    values[2] = None
    path = write_table(tmp_path, with_column(table, column, values, typ))
    expect(path, "null-value", "a", None if column == "step" else 2,
           message=f"{column!r} must not be null")


def test_negative_start(tmp_path: Path) -> None:
    df = base()
    df["start_s"] = [-1.0, -1.0, -1.0, 1.5, 1.5]
    out = expect(write_frame(tmp_path, df), "bad-start", "a", 0, "start_s must be finite")
    assert "trajectory 'b'" not in out


@pytest.mark.parametrize("column, rule, row", [
    ("latency_s", "bad-latency", 1),
    ("deadline_s", "bad-deadline", 1),
    ("start_s", "bad-start", 3),
])
def test_nan_is_not_null(tmp_path: Path, column: str, rule: str, row: int) -> None:
    """A NaN in the file is refused by its own rule, not read as null ('never returns')."""
    df = base()
    df.loc[4, "outcome"] = "abandoned"
    table = to_table(df)
    values = table.column(column).to_pylist()
    values[row] = NAN
    path = write_table(tmp_path, with_column(table, column, values, pa.float64()))
    expect(path, rule, str(df["trajectory_id"].iloc[row]), int(df["step"].iloc[row]))
    # Also when the outcome would excuse a null latency.
    values = table.column("latency_s").to_pylist()
    values[4] = NAN
    path = write_table(tmp_path, with_column(table, "latency_s", values, pa.float64()))
    expect(path, "bad-latency", "b", 1)


def _reorder(df: pd.DataFrame, order: list[int]) -> pd.DataFrame:
    return df.iloc[order].reset_index(drop=True)


def test_split_trajectory(tmp_path: Path) -> None:
    df = _reorder(base(), [0, 1, 3, 4, 2])  # a a b b a
    expect(write_frame(tmp_path, df), "split-trajectory", "a",
           message="rows of this trajectory are not contiguous")


def test_duplicate_step(tmp_path: Path) -> None:
    df = _reorder(base(), [0, 1, 1, 2, 3, 4])
    expect(write_frame(tmp_path, df), "duplicate-step", "a", 1,
           message="step 1 appears more than once")


def test_steps_not_contiguous(tmp_path: Path) -> None:
    df = base()
    df.loc[2, "step"] = 3
    expect(write_frame(tmp_path, df), "steps-not-contiguous", "a", 3,
           message="expected step 2 here")
    df = _reorder(base(), [1, 0, 2, 3, 4])  # a's steps 1, 0, 2: out of order
    expect(write_frame(tmp_path, df), "steps-not-contiguous", "a", 1,
           message="expected step 0 here")


def test_starts_with_tool(tmp_path: Path) -> None:
    df = base()
    df.loc[3] = df.loc[4]
    df.loc[3, "step"] = 0
    df.loc[3, "outcome"] = "abandoned"
    expect(write_frame(tmp_path, df), "starts-with-tool", "b", 0,
           message="a trajectory must start with an LLM step")


def test_two_tool_steps_in_a_row(tmp_path: Path) -> None:
    df = base()
    extra = df.loc[[4]].copy()
    extra["step"] = np.int32(2)
    df = pd.concat([df, extra], ignore_index=True)
    expect(write_frame(tmp_path, df), "not-alternating", "b", 2,
           message="two tool steps in a row")


def test_two_llm_steps_in_a_row(tmp_path: Path) -> None:
    df = base()
    extra = df.loc[[2]].copy()
    extra["step"] = np.int32(3)
    df = pd.concat([df.loc[:2], extra, df.loc[3:]], ignore_index=True)
    expect(write_frame(tmp_path, df), "not-alternating", "a", 3,
           message="two LLM steps in a row")


def test_trajectory_level_varies(tmp_path: Path) -> None:
    df = base()
    df.loc[2, "tenant"] = "t1"
    expect(write_frame(tmp_path, df), "trajectory-level-varies", "a",
           message="'tenant' must be the same on every step")


def test_load_trajectories_raises_input_error(tmp_path: Path) -> None:
    df = base()
    df.loc[1, "latency_s"] = -1.0
    path = write_frame(tmp_path, df)
    with pytest.raises(InputError, match=r"trajectory 'a': step 1: \[bad-latency\]"):
        load_trajectories(path)


def test_check_frame_reports_at_most_the_cap() -> None:
    df = pd.concat([base()] * 1, ignore_index=True)
    big = pd.concat([df.loc[[1]]] * 500, ignore_index=True)
    big["latency_s"] = -1.0
    problems = check_frame(big, "f")
    assert problems and all(isinstance(p, Problem) for p in problems)
    assert len(problems) <= 200
