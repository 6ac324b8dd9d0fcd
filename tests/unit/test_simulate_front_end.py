"""The server's front end in the engine model (harness.simulate.client, .scheduler): requests
take their turn in it one at a time, and where it shares the engine's processors its work pauses
the engine's compute, at a request's arrival and at its answer; each streamed token adds its
cost to a decode step.

CAL's iteration costs: ALPHA = 9 ms per iteration, BETA = 1 ms per token (no attention term), no
request overhead. Times in the comments are ms."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from harness.model.calibration import Calibration
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity, ServerModel
from tests.unit.test_simulate import ALPHA, BETA, CAL, llm, t_s, tool, trace

NS = 1e-9  # records are integer ns
MS = 1e-3


def run(tmp: Path, trajs: dict[str, list[tuple[object, ...]]], cal: Calibration,
        starts: dict[str, float] | None = None, engine: str = "sglang") -> pd.DataFrame:
    out = tmp / "out"
    run_simulation(SimOptions(trace(tmp, trajs, starts), "keep-evictable", {}, Capacity(
        tokens=1024, engine=engine, block_size=16), None, Arrivals("trace", 8, 1.0), 0, out,
            write_summary=False), cal)
    return read_records(out)


BURST = {"a": [llm(10, 1)], "b": [llm(10, 1)], "c": [llm(10, 1)]}


def test_without_a_front_end_a_burst_prefills_together(tmp_path: Path) -> None:
    df = run(tmp_path, BURST, CAL)
    for tid in "abc":
        assert t_s(df, "first_token", tid) == pytest.approx(ALPHA + 30 * BETA, abs=2 * NS)


def test_a_burst_takes_its_turns_in_the_front_end(tmp_path: Path) -> None:
    # turns of 2: a reaches the engine at 2, b at 4, c at 6; a's prompt runs alone (2-21), b's
    # and c's together after it (21-50)
    df = run(tmp_path, BURST, replace(CAL, front_end_ms=2.0))
    assert t_s(df, "first_token", "a") == pytest.approx(2 * MS + ALPHA + 10 * BETA, abs=2 * NS)
    for tid in "bc":
        assert t_s(df, "first_token", tid) == pytest.approx(
            2 * MS + 2 * (ALPHA + 10 * BETA) + 10 * BETA, abs=2 * NS)


def test_a_front_end_on_the_engines_processors_holds_its_compute_back(tmp_path: Path) -> None:
    # the same turns, each taking the engine's compute: a's prompt, from 2, waits for b's and
    # c's turns (2-6) and ends at 6 + 19 = 25; b's and c's then run 25-54
    df = run(tmp_path, BURST, replace(CAL, front_end_ms=2.0, front_end_cpu_ms=2.0))
    first_a = 6 * MS + ALPHA + 10 * BETA
    assert t_s(df, "first_token", "a") == pytest.approx(first_a, abs=2 * NS)
    for tid in "bc":
        assert t_s(df, "first_token", tid) == pytest.approx(first_a + ALPHA + 20 * BETA,
                                                           abs=2 * NS)


def test_an_answer_takes_the_engines_compute_too(tmp_path: Path) -> None:
    # a's call ends at 19; its answer's front-end work (3) pauses b's prompt (19-38), sent then
    cal = replace(CAL, front_end_cpu_ms=3.0)
    df = run(tmp_path, {"a": [llm(10, 1)], "b": [llm(10, 1)]}, cal, {"a": 0.0, "b": 0.019})
    assert t_s(df, "call_end", "a") == pytest.approx(ALPHA + 10 * BETA, abs=2 * NS)
    assert t_s(df, "first_token", "b") == pytest.approx(2 * (ALPHA + 10 * BETA) + 3 * MS,
                                                        abs=2 * NS)


def test_a_request_arriving_mid_decode_run_stretches_the_step_it_falls_in(
        tmp_path: Path) -> None:
    # a's turn 0-2, its prompt 2-21, then decode steps of 10 (21-31, ...); b, sent at 30,
    # takes its turn 30-32 from the step 21-31, which ends at 33 and ends the run; b's prompt
    # joins the next (33-53, beside a's token); a's last two tokens at 63 and 73: none lost
    cal = replace(CAL, front_end_ms=2.0, front_end_cpu_ms=2.0)
    df = run(tmp_path, {"a": [llm(10, 5)], "b": [llm(10, 1)]}, cal, {"a": 0.0, "b": 0.030})
    assert t_s(df, "first_token", "a") == pytest.approx(0.021, abs=2 * NS)
    assert t_s(df, "first_token", "b") == pytest.approx(0.053, abs=2 * NS)
    assert t_s(df, "call_end", "a") == pytest.approx(0.073, abs=2 * NS)
    # without the front end: b's prompt joins at the step's end (39-59), a ends at 69
    plain = run(tmp_path / "plain", {"a": [llm(10, 5)], "b": [llm(10, 1)]}, CAL,
                {"a": 0.0, "b": 0.030})
    assert t_s(plain, "first_token", "b") == pytest.approx(0.059, abs=2 * NS)
    assert t_s(plain, "call_end", "a") == pytest.approx(0.069, abs=2 * NS)


def test_each_streamed_token_adds_its_cost_to_a_decode_step(tmp_path: Path) -> None:
    df = run(tmp_path, {"a": [llm(10, 3)]}, replace(CAL, stream_token_ms=0.5))
    assert t_s(df, "call_end", "a") == pytest.approx(
        ALPHA + 10 * BETA + 2 * (ALPHA + BETA + 0.5 * MS), abs=2 * NS)


def test_vllms_pause_controls_take_their_turn_too(tmp_path: Path) -> None:
    # a's turn 0-2, its call 2-31; its pause sends the unpin, whose turn is 31-33; b's call,
    # sent at 32, waits behind it (33-35); the control's prompt iteration runs 33-43, b's
    # prompt with the control's second token 43-63
    trajs = {"a": [llm(10, 2), tool(5.0), llm(10, 2)], "b": [llm(10, 2)]}
    df = run(tmp_path, trajs, replace(CAL, front_end_ms=2.0), {"a": 0.0, "b": 0.032},
             engine="vllm")
    assert t_s(df, "tool_start", "a") == pytest.approx(0.031, abs=2 * NS)
    assert t_s(df, "first_token", "b") == pytest.approx(
        0.033 + (ALPHA + BETA) + (ALPHA + 11 * BETA), abs=2 * NS)


def test_the_front_ends_split_between_arrival_and_answer() -> None:
    model = ServerModel(1000.0, 100.0, 1e6, 1e6, 1.0, front_end_s=0.002, front_end_cpu_s=0.005)
    assert model.front_end() == pytest.approx((0.002, 0.002, 0.003))
    model = ServerModel(1000.0, 100.0, 1e6, 1e6, 1.0, front_end_s=0.004, front_end_cpu_s=0.001)
    assert model.front_end() == pytest.approx((0.004, 0.001, 0.0))
