"""The format's version-2 rules: sub-agents, context cuts, shared prefixes; reading version 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.traces.context import context_lengths
from harness.traces.schema import (
    META_SCHEMA_VERSION,
    V2_COLUMNS,
    steps_table,
)
from harness.traces.validate import check_frame, load_trajectories
from tests.unit.test_executor_subagents import frame_rows

DEFAULTS = {"start_s": 0.0, "priority": "interactive", "tenant": "t"}


def rules(rows: list[dict[str, Any]]) -> list[tuple[str, str | None, int | None]]:
    df = steps_table(rows, DEFAULTS).to_pandas()
    return [(p.rule, p.trajectory, p.step) for p in check_frame(df, "f")]


def test_a_parent_with_two_children_is_valid() -> None:
    assert rules(frame_rows()) == []


def test_a_child_needs_an_existing_parent_and_a_subagent_step() -> None:
    rows = frame_rows()
    for r in rows:
        if r["trajectory_id"] == "p/a":
            r["parent_id"] = "nobody"
    assert ("missing-parent", "p/a", None) in rules(rows)
    rows = frame_rows()
    for r in rows:
        if r["trajectory_id"] == "p/b":
            r["spawn_step"] = 2  # an LLM step
    assert ("bad-spawn", "p/b", None) in rules(rows)
    rows = frame_rows()
    for r in rows:
        if r["trajectory_id"] == "p/b":
            r["spawn_step"] = None
    assert ("bad-spawn", "p/b", None) in rules(rows)


def test_a_subagent_step_without_children_and_a_cycle_are_refused() -> None:
    rows = [r for r in frame_rows() if r["trajectory_id"] == "p"]
    assert rules(rows) == [("no-children", "p", 1)]
    rows = frame_rows()
    for r in rows:  # p becomes a child of its own child
        if r["trajectory_id"] == "p":
            r["parent_id"], r["spawn_step"] = "p/a", 1
        if r["trajectory_id"] == "p/a" and r["step"] == 1:
            r["tool_class"] = "subagent"
    assert ("subagent-cycle", "p", None) in rules(rows)


def test_keep_tokens_and_prefix_tokens_rules() -> None:
    rows = frame_rows()
    rows[2]["keep_tokens"] = 106  # the context holds 105
    assert rules(rows) == [("bad-keep", "p", 2)]
    rows[2]["keep_tokens"] = 105
    assert rules(rows) == []
    rows = frame_rows()
    rows[1]["keep_tokens"] = 3
    assert ("keep-on-tool", "p", 1) in rules(rows)
    rows = frame_rows()
    for r in rows[:3]:
        r["prefix_tokens"] = 101  # more than the first call appends
    assert rules(rows) == [("bad-prefix", "p", 0)]
    rows = frame_rows()
    for r in rows[:3]:
        r["prefix_group"] = None
    assert ("bad-prefix", "p", 0) in rules(rows)


def test_context_lengths_follow_the_cuts() -> None:
    df = steps_table(frame_rows(), DEFAULTS).to_pandas()
    c = context_lengths(df)
    assert c.prompt.tolist()[:3] == [100, 0, 74]
    assert c.kept.tolist()[:3] == [0, 0, 64]
    assert c.before.tolist()[:3] == [0, 105, 105]
    assert c.after.tolist()[:3] == [105, 105, 79]


def test_a_version_1_file_reads_as_version_2(tmp_path: Path) -> None:
    table = steps_table(frame_rows()[:1] + [], DEFAULTS)
    table = table.drop_columns(list(V2_COLUMNS)).replace_schema_metadata(
        {META_SCHEMA_VERSION: b"1"})
    path = tmp_path / "v1.parquet"
    pq.write_table(table, path)
    df = load_trajectories(path)
    assert all(df[c].isna().all() for c in V2_COLUMNS)
    assert len(df) == 1


@pytest.mark.parametrize("version", [b"3", b"0"])
def test_unknown_versions_are_refused(tmp_path: Path, version: bytes) -> None:
    table = steps_table(frame_rows()[:1], DEFAULTS).replace_schema_metadata(
        {META_SCHEMA_VERSION: version})
    path = tmp_path / "v.parquet"
    pq.write_table(table, path)
    with pytest.raises(Exception, match="schema version"):
        load_trajectories(path)
    assert isinstance(table, pa.Table)
