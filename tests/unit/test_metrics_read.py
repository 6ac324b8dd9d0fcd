"""Reading records for metrics: summarize_dir (records read part by part, split by event) gives
the summary and frames that summarize() gives on the whole table in memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from records_factory import Records, default_run

from harness.metrics import events as events_mod
from harness.metrics.events import FRAME_COLUMNS, read_events
from harness.metrics.frames import Frames, _Latest, build_frames, link_events
from harness.metrics.summary import summarize, summarize_dir
from harness.metrics.summary_types import Summary
from harness.records import store
from harness.records.manifest import RunManifest, read_manifest
from harness.records.schema import RECORDS_SCHEMA
from harness.records.store import RECORDS_DIR, RUN_JSON, read_records, write_json
from harness.report.data import load_run


def representative() -> Records:
    """Several agents interleaved in time (keep, swap, recompute, ttl both ways, queueing,
    client lag, cancel, a failed call, an unfinished trajectory) and bystanders, one failing."""
    b = Records()
    t = b.agent("keep", at=0.0)
    t.call(ttft=0.1, decode=0.4, out=10, decode_ms=350.0)
    t.tool(wait=2.0, action="keep", retained=4096, cls="sandbox", lag=0.002)
    t.call(ttft=0.05, decode=0.2, appended=20, out=5, cached=4096).end()
    t = b.agent("swap", at=0.3)
    t.call(ttft=0.2, out=1).tool(wait=0.05, action="swap", swap_bytes=1 << 20, swap_out_ms=3.0,
                                 swap_in_ms=4.0, cls="local_read", name="cat")
    t.call(ttft=0.07, cached=300, server_ms=12.0).tool(wait=12.0, action="keep", queue=0.5)
    t.call(ttft=0.04).end()
    t = b.agent("recompute", at=0.5)
    t.call().tool(wait=0.5, action="recompute", cls="browser").call(ttft=0.3, cached=0,
                                                                      server_ms=40.0)
    t.tool(wait=1.5, action="ttl", ttl_expire_after=0.5, ttl_after="swap", swap_bytes=512)
    t.call(ttft=0.1).tool(wait=3.0, action="ttl", ttl_expire_after=1.0).call(cached=4000).end()
    t = b.agent("cancelled", at=1.0)
    t.call().tool(wait=30.0, status="abandoned", cls="human").cancel()
    b.agent("failed", at=1.2).call(status="error", ttft=None).end("failed")
    b.agent("unfinished", at=2.0).call().tool(wait=1.0, status="timeout")
    b.agent("stopped", at=2.5).call().end("interrupted")
    for i in range(4):
        b.bystander(f"bystander-{i}", at=0.2 + i, ttft=0.1 + 0.05 * i, decode=0.3,
                    status="error" if i == 2 else "ok")
    # the replay writes events as they happen: interleave the trajectories in time
    b.rows.sort(key=lambda r: r["t_ns"])
    for seq, row in enumerate(b.rows):
        row["seq"] = seq
    return b


def write_parts(rec: Records, directory: Path, sizes: list[int], shuffle: bool = False,
                old_part: int | None = None) -> Path:
    """The rows as parts of these sizes (the last part takes the rest); `shuffle` numbers them
    out of seq order; `old_part`: that part lacks two columns, as an older writer's would."""
    table = pa.Table.from_pylist(rec.rows, schema=RECORDS_SCHEMA)
    (directory / RECORDS_DIR).mkdir(parents=True)
    bounds = np.cumsum([0, *sizes])
    slices = [table.slice(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:],
                                                                strict=True)]
    slices.append(table.slice(int(bounds[-1])))
    order = list(range(len(slices)))[::-1] if shuffle else list(range(len(slices)))
    for name, i in enumerate(order):
        part = slices[i]
        if i == old_part:
            part = part.drop_columns(["deadline_s", "tool_name"])
        pq.write_table(part, directory / RECORDS_DIR / f"part-{name:05d}.parquet")
    write_json(directory / RUN_JSON, default_run(cache_block_tokens=16))
    return directory


def whole_table(directory: Path, strings: str) -> pd.DataFrame:
    """The records as the harness used to read them: every part at once, one pandas frame;
    strings as pyarrow gives them ("str") or as plain Python objects ("object")."""
    parts = sorted((directory / RECORDS_DIR).glob("part-*.parquet"))
    df = pa.concat_tables([pq.read_table(p, schema=RECORDS_SCHEMA) for p in parts]).to_pandas()
    df = df.sort_values("seq", kind="stable").reset_index(drop=True)
    if strings == "object":
        for f in RECORDS_SCHEMA:
            if pa.types.is_string(f.type):
                df[f.name] = df[f.name].astype(object).where(df[f.name].notna(), None)
    return df


def dumps(summary: Summary) -> str:
    return json.dumps(summary.to_json(), indent=2, sort_keys=True, default=str)


def assert_frames_equal(a: Frames, b: Frames) -> None:
    for name in ("calls", "pauses", "kv", "trajectories"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True,
                                      obj=name)
    assert (a.t_min_ns, a.t_max_ns) == (b.t_min_ns, b.t_max_ns)


LAYOUTS: dict[str, dict[str, Any]] = {
    "one part": {"sizes": []},
    "many parts": {"sizes": [1, 7, 30, 2, 50, 13]},
    "out of order, one without two columns": {"sizes": [20, 20, 20], "shuffle": True,
                                              "old_part": 1},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch_rows", [5, 1 << 16])
def test_summarize_dir_equals_summarize_on_the_whole_table(
    tmp_path: Path, layout: str, batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_mod, "BATCH_ROWS", batch_rows)
    monkeypatch.setattr(store, "READ_BATCH_ROWS", batch_rows)
    d = write_parts(representative(), tmp_path / "run", **LAYOUTS[layout])
    run = read_manifest(d)
    expected = summarize(whole_table(d, "object"), run, None)
    # a real workout: every action, resumes, mismatches, moved bytes, lag, every outcome
    assert expected["pause_actions"] == {"keep": 4, "recompute": 1, "swap": 1, "ttl": 2}
    assert expected["resume_latency_ms"]["n"] == 6 and expected["cache_mismatches"] == 3
    assert expected["bytes_moved"] > 0 and expected["client_lag_ms"]["n"] == 1
    assert expected["trajectories"] == {"total": 7, "succeeded": 3, "cancelled": 1, "failed": 1,
                                        "interrupted": 1, "slo_violating": 0, "incomplete": 1}
    assert dumps(summarize(whole_table(d, "str"), run, None)) == dumps(expected)
    assert dumps(summarize_dir(d)) == dumps(expected)
    assert dumps(summarize(read_records(d), run, None)) == dumps(expected)
    assert dumps(load_run(d).summary) == dumps(expected)


def bystanders_only() -> Records:
    """Every row has a step: that int column has no null, and keeps its int dtype."""
    b = Records()
    for i in range(5):
        b.bystander(f"bystander-{i}", at=0.1 * i, ttft=0.05, decode=0.2)
    return b


@pytest.mark.parametrize("build", [representative, bystanders_only])
@pytest.mark.parametrize("batch_rows", [3, 1 << 16])
def test_frames_do_not_depend_on_how_the_records_were_read(
    tmp_path: Path, build: Any, batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_mod, "BATCH_ROWS", batch_rows)
    d = write_parts(build(), tmp_path / "run", [2, 4, 3], shuffle=True, old_part=2)
    expected = build_frames(whole_table(d, "str"))
    assert len(expected.calls) >= 5
    assert_frames_equal(link_events(read_events(d)), expected)
    assert_frames_equal(build_frames(read_records(d)), expected)
    assert_frames_equal(build_frames(read_records(d, FRAME_COLUMNS)), expected)


def test_summarize_dir_takes_the_manifest_a_run_holds(tmp_path: Path) -> None:
    d = write_parts(representative(), tmp_path / "run", [10])
    run = RunManifest.from_dict(default_run(policy="other", runtime="vllm"))
    s = summarize_dir(d, run=run)
    assert s["policy"] == "other" and s["runtime"] == "vllm"
    assert summarize_dir(d)["policy"] == "keep"


def test_read_records_strings_are_categorical_and_values_unchanged(tmp_path: Path) -> None:
    d = write_parts(representative(), tmp_path / "run", [5, 17, 40], shuffle=True, old_part=0)
    got = read_records(d)
    want = whole_table(d, "str")
    assert list(got.columns) == list(RECORDS_SCHEMA.names)
    assert got["seq"].tolist() == list(range(len(want)))  # parts out of order, rows by seq
    for f in RECORDS_SCHEMA:
        if pa.types.is_string(f.type):
            cats = got[f.name].cat.categories
            assert list(cats) == sorted(cats)  # sorting the column sorts it as strings
            got[f.name] = got[f.name].astype("str")
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    picked = read_records(d, ["event", "step"])
    assert list(picked.columns) == ["event", "step"] and len(picked) == len(want)


def test_read_records_dtypes_follow_the_whole_column(tmp_path: Path) -> None:
    """An int column is int64 without a null anywhere and float64 with one in any part, and a
    bool column bool or object alike, as pandas has them for the concatenated table."""
    (tmp_path / RECORDS_DIR).mkdir()
    rows = [{"run_id": "r", "seq": i, "t_ns": 10 * i, "event": "kv_state", "kv_tokens": i,
             "is_resume": True, "prompt_n": None if i == 3 else i, "detail": None}
            for i in range(6)]
    for k in range(3):
        pq.write_table(pa.Table.from_pylist(rows[2 * k:2 * k + 2], schema=RECORDS_SCHEMA),
                       tmp_path / RECORDS_DIR / f"part-{k:05d}.parquet")
    got = read_records(tmp_path)
    want = whole_table(tmp_path, "str")
    assert got["kv_tokens"].dtype == np.int64 and got["is_resume"].dtype == bool
    assert got["prompt_n"].dtype == np.float64 and np.isnan(got["prompt_n"].iloc[3])
    assert got["step"].dtype == np.float64 and got["slot"].dtype == np.float64
    assert all(got[c].dtype == want[c].dtype for c in want.columns
               if not isinstance(got[c].dtype, pd.CategoricalDtype))


def test_read_records_of_no_parts_is_empty_with_every_column(tmp_path: Path) -> None:
    df = read_records(tmp_path)
    assert df.empty and list(df.columns) == list(RECORDS_SCHEMA.names)
    assert len(read_events(tmp_path)) == 0


def test_latest_matches_a_groupby_ffill() -> None:
    rng = np.random.default_rng(5)
    codes = rng.integers(-1, 12, 4000)
    seq = np.arange(4000, dtype="float64")
    latest = _Latest(codes)
    for p in (0.0, 0.01, 0.3, 1.0):
        mask = rng.random(4000) < p
        want = pd.Series(np.where(mask, seq, np.nan)).groupby(codes).ffill().to_numpy()
        np.testing.assert_array_equal(latest(mask, seq), want)
