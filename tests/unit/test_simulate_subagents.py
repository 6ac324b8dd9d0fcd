"""The simulator with sub-agents and keep_tokens cuts, on tiny hand-computable traces.

Every scenario runs in the loop this process loaded (compiled when the build matches) and in
the pure-Python sources (HARNESS_SIMULATOR=python, in a process of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from harness.errors import InputError
from harness.model.calibration import Calibration, write_calibration
from harness.records.schema import RECORD_COLUMNS
from harness.records.store import RUN_JSON, read_records
from harness.simulate import native
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from harness.simulate.workload import build_workload
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories
from tests.unit.test_simulate import ev, t_s

BPT = 1000  # bytes of KV per token
CAL = Calibration(runtime="test", server_version="0", model="m", kv_bytes_per_token=BPT,
                  prefill_tok_s=1000.0, decode_tok_s=100.0, swap_out_bytes_per_s=1e6,
                  swap_in_bytes_per_s=1e6, measured_at="now")
# The iteration model fitted to CAL: 1 ms per prompt token, 9 ms per iteration besides.
BETA = 1 / 1000
ALPHA = 1 / 100 - BETA
ENGINES = ["loaded", "python"]
Row = dict[str, Any]


def llm(inp: int, out: int, keep: int | None = None) -> Row:
    return {"kind": "llm", "input_tokens": inp, "output_tokens": out, "keep_tokens": keep}


def tool(latency: float, deadline: float | None = 60.0, cls: str = "remote_read") -> Row:
    return {"kind": "tool", "tool_name": cls, "tool_class": cls, "latency_s": latency,
            "deadline_s": deadline, "outcome": "ok", "mutating": False}


def spawn(residual: float, deadline: float | None = None) -> Row:
    """A parent's step that starts sub-agents; `residual`: its wait after the last has ended."""
    return tool(residual, deadline, "subagent")


def trace(tmp: Path, trajs: dict[str, list[Row]],
          parents: dict[str, tuple[str, int]] | None = None) -> Path:
    """A trace file; `parents`: sub-agent -> (its parent, the parent's spawning step)."""
    rows = []
    for tid, steps in trajs.items():
        parent, at = (parents or {}).get(tid, (None, None))
        rows += [{"trajectory_id": tid, "step": i, "parent_id": parent, "spawn_step": at, **s}
                 for i, s in enumerate(steps)]
    return write_trajectories(steps_table(rows, SYNTHETIC_DEFAULTS), tmp / "trace.parquet",
                              Provenance("test"))


def cap_args(cap: Capacity) -> list[str]:
    if cap.slot_mode:
        return ["--slots", str(cap.slots), "--ctx-per-slot", str(cap.ctx_per_slot)]
    return ["--capacity-tokens", str(cap.tokens)]


def sim(tmp: Path, path: Path, policy: str, cap: Capacity, engine: str,
        concurrency: int = 8, name: str = "out") -> pd.DataFrame:
    """The records of one simulation, in this process's loop or the pure-Python one."""
    out = tmp / f"{name}-{engine}"
    if engine == "loaded":
        run_simulation(SimOptions(path, policy, {}, cap, None, Arrivals("closed", concurrency), 0,
                                  out, write_summary=False), CAL)
        return read_records(out)
    cal = write_calibration(tmp / "cal.json", CAL)
    res = subprocess.run(
        [sys.executable, "-m", "harness", "simulate", "--trace", str(path), "--policy", policy,
         "--calibration", str(cal), "--concurrency", str(concurrency), *cap_args(cap),
         "--no-summary", "--out", str(out)],
        env={**os.environ, "HARNESS_SIMULATOR": "python"}, capture_output=True, text=True,
        timeout=300)
    assert res.returncode == 0, res.stderr
    assert '"engine": "heapq event loop, python (HARNESS_SIMULATOR=python)"' in (
        out / RUN_JSON).read_text()
    return read_records(out)


def device_kv(df: pd.DataFrame) -> pd.Series:
    """Device KV tokens held by all trajectories together after each record (kv_state)."""
    kv = ev(df, "kv_state")
    held = kv["kv_tokens"].where(kv["status"] != "released", 0).astype("int64")
    per = held.groupby(kv["trajectory_id"].astype(str)).diff().fillna(held)
    return per.cumsum()


# P spawns A and B at its step 1; A is quick (1 s tool), B slow (3 s tool).
FAMILY = {"P": [llm(100, 10), spawn(0.5), llm(20, 5)],
          "A": [llm(50, 2), tool(1.0), llm(10, 2)],
          "B": [llm(60, 2), tool(3.0), llm(10, 2)]}
KIDS = {"A": ("P", 1), "B": ("P", 1)}


def test_the_workload_lists_children_and_what_each_call_keeps(tmp_path: Path) -> None:
    path = trace(tmp_path, FAMILY | {"C": [llm(100, 10), tool(1.0), llm(20, 5, keep=40)]}, KIDS)
    w = build_workload(pd.read_parquet(path), 30.0)
    assert w.parent.tolist() == [-1, 0, 0, -1] and w.spawn_step.tolist() == [-1, 1, 1, -1]
    assert w.roots.tolist() == [0, 3] and w.children() == {1: [1, 2]}
    assert w.deadline[1] == np.inf  # a parent waits as long as its children run
    c = w.first[3]
    # C's resume: the context is cut to 40 tokens, then 20 appended: prompt 60, after 65
    assert (w.ctx[c:c + 3].tolist(), w.kept[c:c + 3].tolist()) == ([110, 110, 65], [0, 40, 40])
    assert w.inp[c + 2] == 20  # what the call prefills on top of what it keeps


@pytest.mark.parametrize("engine", ENGINES)
def test_children_start_at_the_pause_run_together_and_the_parent_waits_for_both(
        tmp_path: Path, engine: str) -> None:
    df = sim(tmp_path, trace(tmp_path, FAMILY, KIDS), "keep", Capacity(tokens=1000), engine)
    pause = t_s(df, "pause_decision", "P")
    starts = ev(df, "trajectory_start").set_index("trajectory_id")
    assert starts.loc["A", "t_ns"] == starts.loc["B", "t_ns"] == round(pause * 1e9)
    assert starts.loc["A", "spawn_step"] == starts.loc["B", "spawn_step"] == 1
    assert pd.isna(starts.loc["P", "spawn_step"])
    if "parent_id" in RECORD_COLUMNS:
        assert starts["parent_id"].dropna().astype(str).to_dict() == {"A": "P", "B": "P"}
    # Both children prefill in one iteration: 110 prompt tokens, from the pause on.
    for tid in "AB":
        assert t_s(df, "call_start", tid) == pytest.approx(pause)
        assert t_s(df, "first_token", tid) == pytest.approx(pause + ALPHA + 110 * BETA)
    a_end, b_end = t_s(df, "trajectory_end", "A"), t_s(df, "trajectory_end", "B")
    assert a_end < b_end
    # The parent's tool ends 0.5 s (its residual) after the last child, and it resumes then.
    assert t_s(df, "tool_end", "P") == pytest.approx(b_end + 0.5)
    assert t_s(df, "call_start", "P", 1) == pytest.approx(b_end + 0.5)
    ends = ev(df, "trajectory_end").set_index("trajectory_id")["status"]
    assert ends.to_dict() == {"A": "completed", "B": "completed", "P": "completed"}


@pytest.mark.parametrize("engine", ENGINES)
def test_policies_account_the_parents_kv_while_its_children_run(tmp_path: Path,
                                                                 engine: str) -> None:
    path = trace(tmp_path, FAMILY, KIDS)
    slots = Capacity(slots=2, ctx_per_slot=1000)
    keep = sim(tmp_path, path, "keep", slots, engine, name="keep")
    # The parent keeps its slot through the pause: A and B share the other one, in turn.
    assert t_s(keep, "call_start", "B") == pytest.approx(t_s(keep, "trajectory_end", "A"))
    assert ev(keep, "slot_wait", "B")["slot_wait_s"].iloc[0] > 0
    assert ev(keep, "recompute").empty and ev(keep, "swap_out").empty
    rc = sim(tmp_path, path, "recompute", slots, engine, name="rc")
    # Recompute frees the parent's slot as it pauses: both children run at once.
    assert t_s(rc, "call_start", "A") == t_s(rc, "call_start", "B") == pytest.approx(
        t_s(rc, "pause_decision", "P"))
    assert ev(rc, "recompute", "P")["recomputed_tokens"].tolist() == [110]
    assert ev(rc, "slot_wait").empty
    # A pool of 200 tokens holds the parent's 110 and A's first call's 52, not B's 62 too.
    pool = Capacity(tokens=200)
    kept = sim(tmp_path, path, "keep", pool, engine, name="pool")
    assert t_s(kept, "call_start", "B") == pytest.approx(t_s(kept, "trajectory_end", "A"))
    swap = sim(tmp_path, path, "swap", pool, engine, name="swap")
    # B gets memory once the parent's 110 tokens are out (0.11 s at 1 MB/s).
    assert t_s(swap, "call_start", "B") == pytest.approx(t_s(swap, "swap_out", "P"))
    assert t_s(swap, "swap_out", "P") - t_s(swap, "pause_decision", "P") == pytest.approx(0.11)
    assert ev(swap, "swap_in", "P")["bytes"].tolist() == [110 * BPT]
    for df in (keep, rc, kept, swap):
        assert int(device_kv(df).iloc[-1]) == 0  # everything released at the end
        assert ev(df, "trajectory_end")["status"].eq("completed").all()
    for df in (kept, swap):
        assert int(device_kv(df).max()) <= 200


@pytest.mark.parametrize("engine", ENGINES)
def test_children_do_not_take_closed_loop_agents(tmp_path: Path, engine: str) -> None:
    path = trace(tmp_path, FAMILY | {"R2": [llm(10, 2)], "R3": [llm(10, 2)]}, KIDS)
    df = sim(tmp_path, path, "keep", Capacity(tokens=10_000), engine, concurrency=2)
    starts = ev(df, "trajectory_start").set_index("trajectory_id")["t_ns"] / 1e9
    # Two agents: P and R2 at once; R3 when R2 ends (the first to), children on top.
    assert starts["P"] == starts["R2"] == 0.0
    assert starts["R3"] == pytest.approx(t_s(df, "trajectory_end", "R2"))
    assert starts["A"] == starts["B"] == pytest.approx(t_s(df, "pause_decision", "P"))
    one = sim(tmp_path, path, "keep", Capacity(tokens=10_000), engine, concurrency=1, name="c1")
    starts = ev(one, "trajectory_start").set_index("trajectory_id")["t_ns"] / 1e9
    # One agent: R2 waits for P, children and all, to end; P's children ran beside it.
    assert starts["R2"] == pytest.approx(t_s(one, "trajectory_end", "P"))
    assert starts["R3"] == pytest.approx(t_s(one, "trajectory_end", "R2"))
    assert len(ev(one, "trajectory_end")) == 5


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deadline_cancels_the_parent_and_its_running_children(tmp_path: Path,
                                                                engine: str) -> None:
    # A sits in a long tool at the deadline, B in a long decode (300 tokens, 3 s); the
    # bystander R keeps running.
    path = trace(tmp_path, {"P": [llm(100, 10), spawn(0.0, deadline=1.0), llm(20, 5)],
                            "A": [llm(50, 2), tool(30.0), llm(10, 2)],
                            "B": [llm(60, 300)],
                            "R": [llm(20, 2), tool(2.0), llm(10, 2)]}, KIDS)
    df = sim(tmp_path, path, "keep", Capacity(tokens=1000), engine)
    deadline = t_s(df, "pause_decision", "P") + 1.0
    end = ev(df, "tool_end", "P").iloc[0]
    assert end["status"] == "timeout" and end["t_ns"] / 1e9 == pytest.approx(deadline)
    ends = ev(df, "trajectory_end").set_index("trajectory_id")
    assert ends["status"].to_dict() == {"P": "cancelled", "A": "cancelled", "B": "cancelled",
                                        "R": "completed"}
    for tid in "PAB":  # released at the end of the iteration running then
        assert ends.loc[tid, "t_ns"] / 1e9 == pytest.approx(deadline, abs=0.011)
    assert ev(df, "cancel", "P")["reason"].tolist() == ["tool timeout: deadline 1s"]
    for tid in "AB":
        assert ev(df, "cancel", tid)["reason"].tolist() == ["parent-cancelled"]
    assert ev(df, "call_end", "B").empty  # its call was cut short
    assert ev(df, "call_start", "P")["step"].tolist() == [0]
    assert int(device_kv(df).iloc[-1]) == 0
    # B's decode left the batch at the deadline: R's last call runs alone after it.
    r_start = t_s(df, "call_start", "R", 1)
    assert r_start > deadline
    assert t_s(df, "first_token", "R", 1) - r_start == pytest.approx(ALPHA + 10 * BETA)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_child_waiting_for_a_slot_is_cancelled_without_a_call(tmp_path: Path,
                                                                engine: str) -> None:
    # Two slots: the parent keeps one, A holds the other through a long tool, B waits.
    path = trace(tmp_path, {"P": [llm(100, 10), spawn(0.0, deadline=2.0), llm(20, 5)],
                            "A": [llm(50, 2), tool(30.0), llm(10, 2)],
                            "B": [llm(60, 2)]}, KIDS)
    df = sim(tmp_path, path, "keep", Capacity(slots=2, ctx_per_slot=1000), engine)
    assert ev(df, "call_start", "B").empty and ev(df, "slot_wait", "B").empty
    assert ev(df, "trajectory_end", "B")["status"].tolist() == ["cancelled"]
    assert sorted(ev(df, "erase")["trajectory_id"].astype(str)) == ["A", "P"]


@pytest.mark.parametrize("engine", ENGINES)
def test_children_that_end_in_time_let_the_residual_run_past_the_deadline(
        tmp_path: Path, engine: str) -> None:
    path = trace(tmp_path, {"P": [llm(100, 10), spawn(2.0, deadline=1.5), llm(20, 5)],
                            "A": [llm(50, 2), tool(1.0), llm(10, 2)]}, {"A": ("P", 1)})
    df = sim(tmp_path, path, "keep", Capacity(tokens=1000), engine)
    assert t_s(df, "tool_end", "P") == pytest.approx(t_s(df, "trajectory_end", "A") + 2.0)
    assert ev(df, "trajectory_end")["status"].eq("completed").all()


@pytest.mark.parametrize("engine", ENGINES)
def test_keep_tokens_reuses_only_the_kept_tokens(tmp_path: Path, engine: str) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(20, 5, keep=50)]})
    pool = Capacity(tokens=1000)
    keep = sim(tmp_path, path, "keep", pool, engine, name="keep")
    start, end = ev(keep, "call_start").iloc[1], ev(keep, "call_end").iloc[1]
    assert (start["prompt_tokens"], start["appended_tokens"]) == (70, 20)
    assert (end["prompt_n"], end["cached_tokens"]) == (20, 50)
    assert t_s(keep, "first_token", "a", 1) - t_s(keep, "tool_end", "a") == pytest.approx(
        ALPHA + 20 * BETA)
    # The cut part is freed as the call starts: 110 tokens paused, then the 70 of its prompt.
    assert ev(keep, "kv_state")["kv_tokens"].tolist()[:3] == [100, 110, 70]
    rc = sim(tmp_path, path, "recompute", pool, engine, name="rc")
    assert ev(rc, "recompute")["recomputed_tokens"].tolist() == [50]
    end = ev(rc, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (70, 0)
    assert t_s(rc, "first_token", "a", 1) - t_s(rc, "tool_end", "a") == pytest.approx(
        ALPHA + 70 * BETA)
    swap = sim(tmp_path, path, "swap", pool, engine, name="swap")
    # All of the retained context goes out; only the kept 50 tokens come back.
    assert ev(swap, "swap_out")["retained_tokens"].tolist() == [110]
    assert ev(swap, "swap_in")["retained_tokens"].tolist() == [50]
    assert ev(swap, "swap_in")["bytes"].tolist() == [50 * BPT]
    end = ev(swap, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (20, 50)


def test_children_of_a_step_the_parent_never_reaches_never_start(tmp_path: Path) -> None:
    path = trace(tmp_path, {"P": [llm(100, 10), tool(5.0, deadline=1.0), llm(10, 2), spawn(0.0),
                                  llm(20, 5)],
                            "A": [llm(50, 2)]}, {"A": ("P", 3)})
    df = sim(tmp_path, path, "keep", Capacity(tokens=1000), "loaded")
    assert ev(df, "trajectory_start")["trajectory_id"].astype(str).tolist() == ["P"]
    assert ev(df, "trajectory_end", "P")["status"].tolist() == ["cancelled"]


def test_children_that_can_never_get_memory_are_an_error(tmp_path: Path) -> None:
    # One slot, kept by the parent through a wait without a deadline: its children (and so
    # the parent) never go on.
    path = trace(tmp_path, FAMILY, KIDS)
    with pytest.raises(InputError, match="3 trajectories never ended"):
        sim(tmp_path, path, "keep", Capacity(slots=1, ctx_per_slot=1000), "loaded")


def test_both_loops_write_the_same_records(tmp_path: Path) -> None:
    if native.ENGINE != native.COMPILED_ENGINE:
        pytest.skip(f"the event loop is not compiled here: {native.ENGINE}")
    path = trace(tmp_path, {"P": [llm(100, 10), spawn(0.2, deadline=2.0), llm(20, 5, keep=60)],
                            "A": [llm(50, 2), tool(1.0), llm(10, 2, keep=20)],
                            "B": [llm(60, 200)],
                            "Q": [llm(80, 10), spawn(0.1), llm(20, 5)],
                            "C": [llm(40, 20), tool(0.5), llm(10, 2)],
                            "R": [llm(20, 2), tool(2.0), llm(10, 2, keep=0)]},
                 KIDS | {"C": ("Q", 1)})
    for policy, cap in (("swap", Capacity(tokens=300)), ("ttl", Capacity(slots=2,
                                                                          ctx_per_slot=400))):
        a = sim(tmp_path, path, policy, cap, "loaded", concurrency=2, name=policy)
        b = sim(tmp_path, path, policy, cap, "python", concurrency=2, name=policy)
        assert len(a) > 50
        pd.testing.assert_frame_equal(a, b)
