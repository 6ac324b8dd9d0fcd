"""A bounded run (plan horizon): nothing starts after it, what runs is stopped and recorded,
and the window's figures leave out the warm-up and what the horizon cut short."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.errors import InputError
from harness.metrics.summary import load_frames
from harness.metrics.window import mean_paused_tokens, window_figures
from harness.policies import make_policy
from harness.specs.run import check_window
from harness.traces.tile import copies_needed, copy_id, least_trajectory_s, tile_steps
from tests.unit.test_executor import plan_of, run_plan, traj


def test_horizon_stops_running_trajectories_and_starts_no_more(tmp_path: Path) -> None:
    # 2 agents, 8 trajectories of 2.21 s each (2 s of tool); the horizon at 5 s.
    plan = dataclasses.replace(plan_of(*(traj(f"t{i}", latency=2.0) for i in range(8)),
                                       concurrency=2), horizon_s=5.0)
    rec, run, adapter = run_plan(tmp_path, plan, make_policy("keep"))
    ends = rec[rec.event == "trajectory_end"]
    assert run["status"] == "finished"
    assert run["duration_s"] == pytest.approx(5.0, abs=0.01)
    cut = ends[ends.reason == "run-horizon"]
    assert len(cut) == 2 and set(cut.status) == {"interrupted"}
    assert (ends.status == "completed").sum() == 4  # each agent finished two before 5 s
    assert len(ends) == 6  # two never started
    assert adapter.cache == {} and adapter.files == {}  # the cut ones were released


def test_window_figures_leave_out_warmup_and_the_cut(tmp_path: Path) -> None:
    plan = dataclasses.replace(plan_of(*(traj(f"t{i}", latency=2.0) for i in range(8)),
                                       concurrency=2), horizon_s=5.0)
    run_plan(tmp_path, plan, make_policy("keep"))
    frames, _, _ = load_frames(tmp_path / "out")
    w = window_figures(frames, 1.0, 5.0, bpt=100.0)
    assert w["window_s"] == [1.0, pytest.approx(5.0, abs=0.01)]
    # ended at 2.21 s and 4.42 s (two per agent), both inside [1, 5)
    assert w["tasks"] == {"ended": 4, "succeeded": 4, "cut_at_horizon": 2}
    assert w["success_rate"] == 1.0
    assert w["goodput_per_min"] == pytest.approx(4 / (4.0 / 60), rel=1e-3)
    assert w["jobs_per_hour"] == pytest.approx(60 * w["goodput_per_min"])
    # Tools returned at 2.1 s and 4.31 s for each agent: four resumes in the window.
    assert w["resume_latency_ms"]["n"] == 4
    # The calls sent in [1, 5): the two resumes (the first calls went at 0 s, the next
    # trajectories' first calls after their predecessors ended).
    assert w["calls"] >= 2
    assert w["kv_paused_mean_mib"] == pytest.approx(w["kv_paused_mean_tokens"] * 100 / 2**20)
    assert mean_paused_tokens(frames, 3.0, 3.0) == 0.0


def test_check_window_refuses_bad_flags() -> None:
    check_window(None, 0.0)
    check_window(30.0, 5.0)
    for d, w in ((None, 5.0), (0.0, 0.0), (10.0, 10.0), (10.0, -1.0), (math.nan, 0.0)):
        with pytest.raises(InputError):
            check_window(d, w)


def _steps() -> pd.DataFrame:
    return pd.DataFrame({
        "trajectory_id": ["a", "a", "a", "c", "c"],
        "parent_id": [None, None, None, "a", "a"],
        "kind": ["llm", "tool", "llm", "llm", "tool"],
        "latency_s": [None, 3.0, None, None, 1.0],
    })


def test_tile_renames_copies_and_their_parents() -> None:
    out = tile_steps(_steps(), 3)
    assert out["trajectory_id"].tolist() == ["a"] * 3 + ["c"] * 2 + ["a~1"] * 3 + ["c~1"] * 2 \
        + ["a~2"] * 3 + ["c~2"] * 2
    assert out["parent_id"].tolist()[3:5] == ["a", "a"]
    assert out["parent_id"].tolist()[8:10] == ["a~1", "a~1"]
    assert pd.isna(out["parent_id"].tolist()[5])
    assert tile_steps(_steps(), 1) is not None and copy_id("x", 0) == "x"
    with pytest.raises(InputError):
        tile_steps(_steps(), 0)


def test_a_tiled_trace_tiles_again_without_a_clash() -> None:
    # the tiled trace has a~1 beside a: its copies are a~~1, a~1~~1, ...; parents follow
    twice = tile_steps(tile_steps(_steps(), 2), 3)
    ids = twice.drop_duplicates("trajectory_id")
    assert ids["trajectory_id"].tolist() == ["a", "c", "a~1", "c~1", "a~~1", "c~~1", "a~1~~1",
                                             "c~1~~1", "a~~2", "c~~2", "a~1~~2", "c~1~~2"]
    assert ids["parent_id"].tolist()[5:8:2] == ["a~~1", "a~1~~1"]
    # a trace whose own ids end in ~ and a number that no copy would take keeps "~"
    once = tile_steps(_steps().replace({"a": "a~7"}), 3)
    assert "a~7~1" in set(once["trajectory_id"])


def test_tile_jitter_parts_the_copies_tools_and_nothing_else() -> None:
    steps = _steps()
    steps.loc[4, "latency_s"] = float("nan")  # a tool that never returns stays so
    out = tile_steps(steps, 4, jitter=0.1, seed=3)
    tools = out[out["kind"] == "tool"]["latency_s"].to_numpy(dtype="float64")
    base = tile_steps(steps, 4)[lambda d: d["kind"] == "tool"]["latency_s"].to_numpy(
        dtype="float64")
    returns = ~np.isnan(base)
    assert np.isnan(tools[~returns]).all()
    ratio = tools[returns] / base[returns]
    assert ((ratio >= 0.9) & (ratio <= 1.1)).all()
    assert len(set(ratio.round(12))) == len(ratio)  # every tool its own draw: copies differ
    # calls untouched; the same seed draws the same; another seed, others
    assert out[out["kind"] == "llm"]["latency_s"].isna().all()
    again = tile_steps(steps, 4, jitter=0.1, seed=3)["latency_s"].to_numpy(dtype="float64")
    other = tile_steps(steps, 4, jitter=0.1, seed=4)["latency_s"].to_numpy(dtype="float64")
    mine = out["latency_s"].to_numpy(dtype="float64")
    assert np.array_equal(mine, again, equal_nan=True)
    assert not np.array_equal(mine, other, equal_nan=True)
    # one copy is jittered too; jitter 0 is the trace itself
    assert not np.array_equal(tile_steps(steps, 1, 0.1)["latency_s"].to_numpy(dtype="float64"),
                              steps["latency_s"].to_numpy(dtype="float64"), equal_nan=True)
    assert tile_steps(steps, 1) is steps
    with pytest.raises(InputError):
        tile_steps(steps, 2, jitter=1.0)
    # a tool keeps its side of its deadline: 2.9 s of 3 stays under 2.95, 3.2 stays over 3.1
    near = steps.assign(deadline_s=[None, 3.0, None, None, 3.0])
    near.loc[1, "latency_s"], near.loc[4, "latency_s"] = 2.9, 3.2
    for seed in range(20):
        lat = tile_steps(near, 1, jitter=0.5, seed=seed)["latency_s"].tolist()
        assert 1.45 <= lat[1] <= 2.95 and 3.1 <= lat[4] <= 4.8
    # without one of its own a tool takes the default (the replay's profile), a sub-agent's
    # none: a 30-s tool at a 30-s default never later than 30 s; the sub-agent's free
    dflt = steps.assign(tool_class=[None, "sandbox", None, None, "subagent"])
    dflt.loc[1, "latency_s"], dflt.loc[4, "latency_s"] = 30.0, 30.0
    lat = [tile_steps(dflt, 1, 0.1, seed, default_deadline_s=30.0)["latency_s"].tolist()
           for seed in range(20)]
    assert all(27.0 <= x[1] <= 30.0 for x in lat) and max(x[4] for x in lat) > 30.0


def test_copies_cover_the_duration() -> None:
    # one root; tool time 4 s + 3 calls x 0.02 s
    assert least_trajectory_s(_steps()) == pytest.approx(4.06)
    # 4 agents x 60 s / 4.06 s each, twice over, for one root
    assert copies_needed(_steps(), 4, 60.0) == math.ceil(2 * 4 * 60 / 4.06)
    assert copies_needed(_steps(), 1, 1.0) == 1
