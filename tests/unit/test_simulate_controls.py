"""vLLM's pause controls in the engine model (harness.simulate.client): the harness's connector
takes each pause's action and each trajectory's release as a request of one prompt token and two
generated, so the model runs one per pause and per trajectory's end through the iterations, and
a trajectory's successor waits for its release's answer. SGLang's model sends none.

CAL's iteration costs: ALPHA = 9 ms per iteration, BETA = 1 ms per token (no attention term), no
request overhead."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import ALPHA, BETA, CAL, ev, llm, t_s, tool, trace

NS = 1e-9  # records are integer ns


def run(tmp: Path, trajs: dict[str, list[tuple[object, ...]]], engine: str,
        arrivals: Arrivals, starts: dict[str, float] | None = None,
        policy: str = "keep-evictable") -> tuple[RunManifest, pd.DataFrame]:
    out = tmp / engine / "out"
    m = run_simulation(SimOptions(trace(tmp, trajs, starts), policy, {}, Capacity(
        tokens=1024, engine=engine, block_size=16), None, arrivals, 0, out, write_summary=False),
            CAL)
    return m, read_records(out)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_next_trajectory_starts_when_the_release_is_answered(tmp_path: Path,
                                                                 engine: str) -> None:
    # one agent, two one-call trajectories: a's call prefills 10 tokens (19 ms) and decodes
    # one (10 ms); on vLLM its release then runs as a request: two iterations of 10 ms
    m, df = run(tmp_path, {"a": [llm(10, 2)], "b": [llm(10, 2)]}, engine,
                Arrivals("closed", 1))
    end_a = t_s(df, "trajectory_end", "a")
    assert end_a == pytest.approx(ALPHA + 10 * BETA + ALPHA + BETA, abs=2 * NS)
    release = 2 * (ALPHA + BETA) if engine == "vllm" else 0.0
    assert t_s(df, "trajectory_start", "b") == pytest.approx(end_a + release, abs=2 * NS)
    assert m.simulator is not None
    assert m.simulator["control_requests"] == (2 if engine == "vllm" else 0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_pause_control_takes_an_iteration_a_new_call_waits_for(tmp_path: Path,
                                                                 engine: str) -> None:
    # a's call ends at 29 ms and its pause sends the unpin; b's call arrives 1 ms later
    trajs = {"a": [llm(10, 2), tool(5.0), llm(10, 2)], "b": [llm(10, 2)]}
    _, df = run(tmp_path, trajs, engine, Arrivals("trace", 8, 1.0),
                {"a": 0.0, "b": 0.030})
    pause = t_s(df, "tool_start", "a")
    assert pause == pytest.approx(0.029, abs=2 * NS)
    first_b = t_s(df, "first_token", "b")
    if engine == "vllm":
        # the control's prompt iteration (ALPHA + BETA) runs from 29 ms; b's prompt joins the
        # next one, beside the control's second token: ALPHA + 10 BETA + BETA
        want = pause + (ALPHA + BETA) + (ALPHA + 11 * BETA)
    else:  # an idle engine starts b's prompt at once
        want = 0.030 + ALPHA + 10 * BETA
    assert first_b == pytest.approx(want, abs=2 * NS)


def test_every_pause_and_every_end_sends_one(tmp_path: Path) -> None:
    trajs = {"a": [llm(10, 2), tool(0.5), llm(10, 2), tool(0.5), llm(5, 2)],
             "b": [llm(10, 2), tool(0.5), llm(10, 2)]}
    for policy in ("keep", "keep-evictable", "recompute", "swap"):
        m, df = run(tmp_path / policy, trajs, "vllm", Arrivals("closed", 2), policy=policy)
        assert m.simulator is not None
        assert m.simulator["control_requests"] == 3 + 2, policy  # 3 pauses, 2 ends
        assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 2


def test_a_stall_without_a_timeout_still_ends_after_a_control(tmp_path: Path) -> None:
    # two agents pin 12 blocks each of 32; each resumed call needs 11 more, 8 are free: the
    # pin-release valve releases the other's pin (to the cache), once the controls are answered
    # both calls end together and their unpins run two iterations (22 ms) from
    # then; both tools return during them, so the queue fills while the engine is busy
    trajs = {"a": [llm(200, 2), tool(0.001), llm(150, 2)],
             "b": [llm(200, 2), tool(0.005), llm(150, 2)]}
    out = tmp_path / "out"
    m = run_simulation(SimOptions(trace(tmp_path, trajs), "keep", {}, Capacity(
        tokens=512, engine="vllm", block_size=16), None, Arrivals("closed", 2), 0, out,
            write_summary=False, first_token_timeout_s=float("inf")), CAL)
    df = read_records(out)
    assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 2
    assert m.simulator is not None and m.simulator["pins_released"] == 1
    assert ev(df, "hint_outcome")["status"].tolist() == ["clipped", "accepted"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_call_after_a_tool_shorter_than_its_control_waits_for_the_answer(
        tmp_path: Path, engine: str) -> None:
    # a's call ends at 29 ms; its pause's unpin runs two iterations (ALPHA + BETA each), while
    # its tool returns after 5 ms: the replay's client awaits the unpin before the next call
    _, df = run(tmp_path, {"a": [llm(10, 2), tool(0.005), llm(10, 2)]}, engine,
                Arrivals("closed", 1))
    pause = t_s(df, "tool_start", "a")
    assert t_s(df, "tool_end", "a") == pytest.approx(pause + 0.005, abs=2 * NS)
    answered = pause + 2 * (ALPHA + BETA) if engine == "vllm" else pause + 0.005
    assert t_s(df, "call_start", "a", 1) == pytest.approx(answered, abs=2 * NS)
    # a tool longer than the control: its call goes when it returns
    _, df = run(tmp_path / "long", {"a": [llm(10, 2), tool(0.5), llm(10, 2)]}, engine,
                Arrivals("closed", 1))
    assert t_s(df, "call_start", "a", 1) == pytest.approx(t_s(df, "tool_end", "a"), abs=2 * NS)
