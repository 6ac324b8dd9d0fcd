"""The record events are declared once (harness.records.kinds): the schema, the writers' rows and
the readers' columns come from the declarations, and parts of older versions read as the current
version's columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.metrics.events import EVENT_COLUMNS, FRAME_COLUMNS
from harness.metrics.frames import build_frames
from harness.metrics.summary import load_frames
from harness.records import legacy
from harness.records.kinds import (
    BY_KIND,
    COLUMNS,
    FRAME_NAMES,
    KIND_COLUMNS,
    KINDS,
    STAMPED,
    WORKER_LOST,
    CallEnd,
    SlotWait,
    meanings,
)
from harness.records.merge import read_part
from harness.records.parts import PartWriter
from harness.records.schema import (
    EVENTS,
    RECORDS_SCHEMA,
    RECORDS_SCHEMA_VERSION,
    RECORDS_VERSION_KEY,
)
from harness.records.store import RECORDS_DIR, read_records
from harness.replay.recorder import Recorder
from tests.unit.records_factory import Records


def test_the_schema_is_the_declared_columns() -> None:
    assert RECORDS_SCHEMA_VERSION == 6
    assert RECORDS_SCHEMA.names == [c.name for c in COLUMNS]
    declared = {name for cols in KIND_COLUMNS.values() for name in cols}
    assert declared | set(STAMPED) == set(RECORDS_SCHEMA.names)
    assert "value_s" not in RECORDS_SCHEMA.names
    assert list(EVENTS) == [k.KIND for k in KINDS] and len(BY_KIND) == len(KINDS) == 16
    for kind in KINDS:
        assert set(meanings(kind)) == set(KIND_COLUMNS[kind.KIND])
        assert all(doc for doc in meanings(kind).values())


def test_each_split_column_means_one_thing() -> None:
    owners = {c: [k.KIND for k in KINDS if c in KIND_COLUMNS[k.KIND]]
              for c in ("engine_queue_s", "planned_latency_s", "predicted_wait_s",
                        "slot_wait_s", "served_by", "priority", "spawn_step")}
    assert owners == {"engine_queue_s": ["call_end"], "planned_latency_s": ["tool_start"],
                      "predicted_wait_s": ["pause_decision"], "slot_wait_s": ["slot_wait"],
                      "served_by": ["call_end"], "priority": ["trajectory_start"],
                      "spawn_step": ["trajectory_start"]}
    # a trajectory_start's step was its parent's spawning step; a swap_in's reason said how
    assert "step" not in KIND_COLUMNS["trajectory_start"]
    assert "reason" not in KIND_COLUMNS["swap_in"]
    # every moved value has its column on its event
    for new, (_, event) in legacy.MOVED.items():
        assert new in KIND_COLUMNS[event] and legacy.SINCE[new] <= RECORDS_SCHEMA_VERSION


def test_the_frames_name_a_column_otherwise_only_where_it_is_declared() -> None:
    assert FRAME_NAMES["tool_start"] == {"planned_latency_s": "planned_s"}
    assert FRAME_NAMES["pause_decision"] == {"predicted_wait_s": "predicted_s"}
    assert not any(v for k, v in FRAME_NAMES.items() if k not in ("tool_start",
                                                                  "pause_decision"))


def test_the_frames_read_only_declared_columns() -> None:
    for event, cols in EVENT_COLUMNS.items():
        assert set(cols) <= set(KIND_COLUMNS[event]), event
    assert set(FRAME_COLUMNS) <= set(RECORDS_SCHEMA.names)


def test_an_event_takes_only_its_own_columns() -> None:
    bad: dict[str, Any] = {"slot_wait_s": 1.0}
    with pytest.raises(TypeError):
        CallEnd(trajectory_id="a", traffic="agent", **bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SlotWait(trajectory_id="a", traffic="agent").step = 2  # type: ignore[misc]


class _Clock:
    def __init__(self) -> None:
        self.t = 0

    def now_ns(self) -> int:
        self.t += 10
        return self.t


def test_the_recorder_writes_a_declared_event_as_its_row(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path / RECORDS_DIR, RECORDS_SCHEMA, background=False)
    rec = Recorder(writer, "r", _Clock())  # type: ignore[arg-type]
    rec.emit(SlotWait(trajectory_id="a", traffic="agent", step=3, slot=1, slot_wait_s=0.25))
    t = rec.emit(CallEnd(trajectory_id="a", traffic="agent", step=3, status="ok",
                         served_by="w1", engine_queue_s=0.5), 99)
    rec.close()
    df = read_records(tmp_path)
    assert t == 99 and df["seq"].tolist() == [0, 1] and df["t_ns"].tolist() == [10, 99]
    assert df["event"].astype(str).tolist() == ["slot_wait", "call_end"]
    assert df["slot_wait_s"].tolist()[0] == 0.25 and pd.isna(df["slot_wait_s"].iloc[1])
    assert df["served_by"].astype(object).tolist()[1] == "w1"
    assert df["engine_queue_s"].tolist()[1] == 0.5 and pd.isna(df["reason"].iloc[1])


def _sample() -> Records:
    b = Records()
    t = b.agent("a", at=0.0)
    t.call(out=10, queue_ms=30.0).tool(wait=2.0, action="keep", queue=0.5)
    t.call(out=5, cached=100).tool(wait=1.0, action="recompute", planned=1.5).call().end()
    b.agent("b", at=0.2).call(queue_ms=5.0).end()
    b.agent("a/s", at=0.3, parent="a").call().end()
    b.add(0.4, "swap_in", "a", step=2, retained_tokens=10, detail="on the resumed call")
    b.add(0.5, "trajectory_start", "lost", detail=WORKER_LOST)
    for row in b.rows:
        if row["event"] == "call_end":
            row["served_by"] = f"worker-{row['trajectory_id']}"
        if row["event"] == "trajectory_start" and row["trajectory_id"] != "lost":
            row.update(priority="batch" if row.get("parent_id") else "interactive",
                       spawn_step=1 if row.get("parent_id") else None)
    return b


def _as_version(rows: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """The rows as a writer of `version` wrote them: each moved value where it was then."""
    out = []
    for row in rows:
        old = dict(row)
        for new, (src, event) in legacy.MOVED.items():
            if legacy.SINCE[new] > version and row["event"] == event:
                old[new], value = None, old.get(new)
                if value is not None:
                    old[src] = value
        out.append(old)
    return out


def _schema_of(version: int) -> pa.Schema:
    """The records schema of an older `version`."""
    sources = {src for src, _ in legacy.MOVED.values()}
    gone = {new for new in legacy.MOVED if legacy.SINCE[new] > version} - sources
    return pa.schema(
        [f for f in RECORDS_SCHEMA if f.name not in gone]
        + [pa.field(c, pa.float64()) for c, v in legacy.DROPPED.items() if v > version],
        metadata={RECORDS_VERSION_KEY: str(version).encode()})


@pytest.mark.parametrize("version", [3, 4])
def test_an_older_part_reads_as_the_current_version(tmp_path: Path, version: int) -> None:
    b = _sample()
    new = b.write(tmp_path / "new")
    old = tmp_path / "old"
    (old / RECORDS_DIR).mkdir(parents=True)
    part = old / RECORDS_DIR / "part-00000.parquet"
    pq.write_table(pa.Table.from_pylist(_as_version(b.rows, version),
                                        schema=_schema_of(version)), part)
    raw = pq.read_table(part).to_pandas()
    starts = raw[raw["event"] == "trajectory_start"]
    assert starts["detail"].tolist() == ["interactive", "interactive", "batch", WORKER_LOST]
    assert starts["step"].tolist()[2] == 1 and ("value_s" in raw) == (version < 4)
    (old / "run.json").write_text((new / "run.json").read_text())
    # the whole table
    a, c = read_records(old), read_records(new)
    pd.testing.assert_frame_equal(a, c)
    assert a["slot_wait_s"].notna().sum() == 1 and a["engine_queue_s"].notna().sum() == 2
    first = a[a["event"] == "trajectory_start"]
    def texts(col: str) -> list[str | None]:
        return [None if pd.isna(v) else str(v) for v in first[col]]

    assert texts("priority") == ["interactive", "interactive", "batch", None]
    assert texts("detail") == [None, None, None, WORKER_LOST]
    assert first["spawn_step"].tolist()[2] == 1 and first["step"].isna().all()
    # only some columns: what the moved ones are made from is read beside them
    for cols in (["seq", "served_by"], ["seq", "priority"], ["seq", "step"], ["seq", "detail"],
                 ["seq", "reason"]):
        pd.testing.assert_frame_equal(read_records(old, cols), read_records(new, cols))
    # part by part, and linked into frames
    fa, fc = load_frames(old)[0], load_frames(new)[0]
    for name in ("calls", "pauses", "kv", "trajectories"):
        pd.testing.assert_frame_equal(getattr(fa, name), getattr(fc, name))
        pd.testing.assert_frame_equal(getattr(build_frames(a), name), getattr(fa, name))
    assert fa.calls["engine_queue_ms"].dropna().tolist() == [30.0, 5.0]
    assert fa.pauses["planned_s"].tolist() == [2.0, 1.5]
    assert fa.pauses["slot_wait_s"].tolist() == [0.5, 0.0]
    # a shard's part, merged
    merged = read_part(part, RECORDS_SCHEMA, "records")
    assert merged.schema.names == RECORDS_SCHEMA.names
    assert merged.to_pylist() == pq.read_table(new / RECORDS_DIR / "part-00000.parquet").select(
        RECORDS_SCHEMA.names).cast(RECORDS_SCHEMA).to_pylist()


def test_a_current_part_is_read_as_written() -> None:
    table = pa.table({"event": ["call_end"], "reason": ["x"]})
    assert legacy.upgrade(table, RECORDS_SCHEMA_VERSION) is table
    assert legacy.sources(["served_by"], RECORDS_SCHEMA_VERSION) == []
    assert legacy.sources(["served_by"], 3) == ["event", "reason"]
    assert legacy.sources(["served_by"], 4) == []
    assert legacy.sources(["spawn_step", "detail"], 4) == ["event", "reason", "step"]
    assert legacy.sources(["event", "step"], 4) == []
