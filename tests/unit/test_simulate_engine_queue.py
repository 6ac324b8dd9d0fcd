"""Admission in a token pool, on the engine model (vLLM, SGLang) as in llama.cpp's plain pool: a
resumed call whose context is held (pinned) grows first, ahead of calls that came before it
and do not fit, unless the pin-release valve releases its pin first (harness.simulate.valve);
a stall ends by the valve, the first-token timeout, or, without either, by preemption."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import CAL, ev, llm, t_s, tool, trace

# a pins 110 tokens through its pause and resumes at about 1.2 s needing 25 more; b holds 250
# until about 2.2 s; c arrives at 1.1 s needing 70 of the 40 left.
TRAJS = {"a": [llm(100, 10), tool(1.0), llm(20, 5)], "b": [llm(50, 200)], "c": [llm(60, 10)]}
STARTS = {"a": 0.0, "b": 0.0, "c": 1.1}


def run(tmp: Path, cap: Capacity, timeout_s: float = 600.0,
        pin_release: str = "latest-program") -> pd.DataFrame:
    out = tmp / "out"
    run_simulation(SimOptions(trace(tmp, TRAJS, STARTS), "keep", {}, cap, None, Arrivals("trace",
                              8, 1.0), 0, out, write_summary=False,
                              first_token_timeout_s=timeout_s, pin_release=pin_release), CAL)
    return read_records(out)


def test_a_pinned_resume_grows_ahead_of_an_earlier_call(tmp_path: Path) -> None:
    # llama.cpp's plain pool pins with no valve (SGLang's engine model: below)
    for cap in (Capacity(tokens=400),):
        df = run(tmp_path / cap.engine, cap)
        assert t_s(df, "tool_end", "a") > 1.1  # c has been waiting since 1.1 s
        assert t_s(df, "call_start", "a", 1) == t_s(df, "tool_end", "a")  # no wait
        # c fits once a's trajectory ends and releases its 135 tokens (between iterations),
        # before b's end
        assert t_s(df, "call_end", "a", 1) <= t_s(df, "call_start", "c") < t_s(
            df, "call_end", "b")
        assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 3


def test_on_sglang_the_valve_releases_the_pin_that_stops_an_earlier_call(tmp_path: Path) -> None:
    # c needs 70 of the 40 left beside b's 250 and a's pinned 110: under lru a's pin goes to
    # the cache at 1.1 s (held 0.842 s since its pause), c starts then, and a's resume reuses
    # the 80 of its context that c's call did not evict, once c has ended
    df = run(tmp_path, Capacity(tokens=400, engine="sglang", block_size=1), pin_release="lru")
    assert t_s(df, "call_start", "c") == 1.1
    hint = ev(df, "hint_outcome").iloc[0]
    assert (hint["trajectory_id"], hint["status"], hint["reason"]) == (
        "a", "clipped", "valve: lru")
    assert hint["held_s"] == pytest.approx(1.1 - t_s(df, "pause_decision", "a"))
    assert ev(df, "call_end", "a")["cached_tokens"].tolist() == [0, 80]
    assert t_s(df, "call_start", "a", 1) == pytest.approx(t_s(df, "trajectory_end", "c"))
    assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 3


def test_latest_program_keeps_an_earlier_program_s_pin_while_calls_run(tmp_path: Path) -> None:
    # programs first come, first served: c, which arrived after a, does not take a's pin while
    # b runs; a resumes onto it, and c starts once the pool has room without it
    df = run(tmp_path, Capacity(tokens=400, engine="sglang", block_size=1))
    assert t_s(df, "call_start", "c") > 1.1
    assert t_s(df, "call_start", "a", 1) == t_s(df, "tool_end", "a")
    assert ev(df, "hint_outcome")["status"].tolist() == ["accepted"]
    assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 3


def test_without_a_timeout_an_idle_engine_releases_a_pin(tmp_path: Path) -> None:
    # Both pin 110 of a 250-token pool and cannot grow by the 110 their next call needs: the
    # valve releases the pin of b (a's call is the one admitted) to the cache, nothing is
    # preempted, and b's resume reuses the 30 tokens a's call left of it.
    trajs = {"a": [llm(100, 10), tool(1.0), llm(100, 10)],
             "b": [llm(100, 10), tool(2.0), llm(100, 10)]}
    out = tmp_path / "out"
    m = run_simulation(SimOptions(trace(tmp_path, trajs), "keep", {}, Capacity(
        tokens=250, engine="vllm", block_size=1), None, Arrivals("closed", 8), 0, out,
            write_summary=False, first_token_timeout_s=math.inf), CAL)
    df = read_records(out)
    assert m.simulator is not None and m.simulator["preemptions"] == 0
    assert m.simulator["pins_released"] == 1
    assert ev(df, "erase", "b")["reason"].tolist() == ["trajectory-end"]
    assert ev(df, "recompute", "b")["recomputed_tokens"].tolist() == [80]
    assert ev(df, "call_end", "b")["cached_tokens"].tolist() == [0, 30]
    assert m.outcome is not None and m.outcome.completed == 2
