"""Trajectories that cannot fit are found before the first request: refused, or skipped and
recorded with --skip-oversized."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.replay.preflight import MAX_CONTEXT_TOKENS, check_plan, context_needed
from harness.replay.run import RunOptions, execute_run
from harness.specs.shared import arrivals_of
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories
from tests.fakes.runtime import MemoryRuntime


def _traj(tid: str, *calls: tuple[int, int]) -> TrajectoryPlan:
    steps: list[CallStep | ToolStep] = []
    for i, (append, out) in enumerate(calls):
        if i:
            steps.append(ToolStep(2 * i - 1, "cat", "local_read", 0.01, 5.0, "ok", False, True))
        steps.append(CallStep(2 * i, append, i, out))
    return TrajectoryPlan(tid, 0.0, "interactive", "t", tuple(steps))


def _plan(*trajs: TrajectoryPlan) -> Plan:
    return Plan(tuple(trajs), (), Arrivals(), 0, Injection())


def test_context_needed_is_every_prompt_and_output_up_to_the_last_call() -> None:
    assert context_needed(_traj("a", (100, 5), (10, 5), (8, 4))) == 132


def test_a_trajectory_too_long_for_a_slot_is_refused_by_name() -> None:
    plan = _plan(_traj("small", (100, 5)), _traj("big", (4000, 100), (50, 10)))
    with pytest.raises(InputError, match=r"1 of 2 trajectories .* 4,096 tokens: big \(4,160\)"):
        check_plan(plan, 4096, skip=False)
    kept, skipped = check_plan(plan, 4096, skip=True)
    assert [t.trajectory_id for t in kept.trajectories] == ["small"] and skipped == ["big"]
    assert check_plan(plan, 8192, skip=False) == (plan, [])


def test_without_a_known_slot_size_the_client_limit_holds() -> None:
    plan = _plan(_traj("huge", (100_000_000, 1)))
    with pytest.raises(InputError, match=f"{MAX_CONTEXT_TOKENS:,}"):
        check_plan(plan, None, skip=False)


def test_when_nothing_fits_there_is_nothing_to_run() -> None:
    with pytest.raises(InputError, match="nothing to run"):
        check_plan(_plan(_traj("big", (5000, 1))), 4096, skip=True)


def _trace(path: Path) -> Path:
    rows = []
    for tid, first in (("small", 64), ("big", 100_000_000)):
        rows += [{"trajectory_id": tid, "step": 0, "kind": "llm", "input_tokens": first,
                  "output_tokens": 4},
                 {"trajectory_id": tid, "step": 1, "kind": "tool", "tool_class": "local_read",
                  "tool_name": "cat", "latency_s": 0.01, "deadline_s": 5.0, "outcome": "ok",
                  "mutating": False},
                 {"trajectory_id": tid, "step": 2, "kind": "llm", "input_tokens": 8,
                  "output_tokens": 4}]
    return write_trajectories(steps_table(rows, SYNTHETIC_DEFAULTS), path, Provenance("test"))


@pytest.mark.parametrize("skip", [False, True])
def test_a_run_checks_before_its_first_request(tmp_path: Path, skip: bool) -> None:
    trace = _trace(tmp_path / "t.parquet")
    opts = RunOptions(trace=trace, policy="keep", out=tmp_path / "o", runtime="memory",
                      arrivals=arrivals_of(2, None, False, 1.0), pinning=None,
                      scrape_interval_s=0.05, skip_oversized=skip)
    if not skip:
        with pytest.raises(InputError, match="big"):
            execute_run(opts, lambda _: None, runtime=MemoryRuntime())
        assert not (tmp_path / "o" / "records").exists()  # no request was sent
        return
    run = execute_run(opts, lambda _: None, runtime=MemoryRuntime())
    assert run.skipped_oversized == ["big"] and run.outcome is not None
    assert run.outcome.completed == 1
    assert json.loads((tmp_path / "o" / "run.json").read_text())["skipped_oversized"] == ["big"]


def test_a_closed_loop_whose_contexts_exceed_client_memory_is_refused() -> None:
    from harness.replay.preflight import BYTES_PER_CONTEXT_TOKEN, client_bytes

    trajs = [_traj(f"t{i}", (1000 * (i + 1), 10)) for i in range(4)]
    plan = Plan(tuple(trajs), (), Arrivals(concurrency=2), 0, Injection())
    # the two longest (4,010 and 3,010 tokens) are held together
    assert client_bytes(plan) == BYTES_PER_CONTEXT_TOKEN * 7020
    need = BYTES_PER_CONTEXT_TOKEN * 7020
    with pytest.raises(InputError, match="2 agents holding the longest contexts"):
        check_plan(plan, 8192, skip=False, memory=need)
    assert check_plan(plan, 8192, skip=False, memory=2 * need) == (plan, [])
    assert check_plan(plan, 8192, skip=False, memory=None) == (plan, [])
    open_loop = dataclasses.replace(plan, arrivals=Arrivals(mode="poisson"))
    assert client_bytes(open_loop) is None


def test_available_memory_is_read() -> None:
    from harness.replay.preflight import available_memory

    mem = available_memory()
    assert mem is None or mem > 0
