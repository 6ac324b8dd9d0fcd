"""The plan is pure and seeded: same inputs, same plan; injection rates as configured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.plan.injection import Injection, load_injection
from harness.plan.planner import Arrivals, CallStep, ToolStep, make_plan
from harness.plan.tokens import LOW_ID, stable_seed, token_ids
from harness.traces.generator import generate
from harness.traces.profiles import load_profile


@pytest.fixture(scope="module")
def steps():  # type: ignore[no-untyped-def]
    return generate(load_profile("flaky-tools"), 400, 5)


def test_plan_is_deterministic(steps) -> None:  # type: ignore[no-untyped-def]
    a = make_plan(steps, load_injection("chaos"), Arrivals(mode="poisson", rate=2.0), 11)
    b = make_plan(steps, load_injection("chaos"), Arrivals(mode="poisson", rate=2.0), 11)
    c = make_plan(steps, load_injection("chaos"), Arrivals(mode="poisson", rate=2.0), 12)
    assert a == b
    assert a != c


def test_plan_follows_the_trace(steps) -> None:  # type: ignore[no-untyped-def]
    plan = make_plan(steps, Injection(), Arrivals(), 0)
    assert len(plan.trajectories) == steps["trajectory_id"].nunique()
    first = plan.trajectories[0]
    rows = steps[steps.trajectory_id == first.trajectory_id]
    assert [s.step for s in first.steps] == rows.step.tolist()
    call = first.steps[0]
    assert isinstance(call, CallStep)
    assert call.append_tokens == rows.input_tokens.iloc[0]
    assert call.output_tokens == rows.output_tokens.iloc[0]
    tools = [s for t in plan.trajectories for s in t.steps if isinstance(s, ToolStep)]
    lat = steps[steps.kind == "tool"].latency_s
    assert sum(t.latency_s is None for t in tools) == int(lat.isna().sum())


def test_injection_rates(steps) -> None:  # type: ignore[no-untyped-def]
    inj = Injection(slow_fraction=0.2, slow_factor=10.0, never_return_fraction=0.1,
                    error_fraction=0.05)
    plan = make_plan(steps, inj, Arrivals(), 3)
    tools = [s for t in plan.trajectories for s in t.steps if isinstance(s, ToolStep)]
    injected = [t.injected for t in tools]
    n = len(tools)
    assert injected.count("never-return") / n == pytest.approx(0.1, abs=0.02)
    slow = sum(1 for x in injected if x and x.startswith("slow")) / n
    assert slow == pytest.approx(0.2 * 0.9, abs=0.03)
    assert all(t.latency_s is None and t.outcome == "abandoned"
               for t in tools if t.injected == "never-return")


def test_time_scale_and_trace_timing(steps) -> None:  # type: ignore[no-untyped-def]
    base = make_plan(steps, Injection(), Arrivals(mode="trace"), 0)
    half = make_plan(steps, Injection(), Arrivals(mode="trace", time_scale=0.5), 0)
    for a, b in zip(base.trajectories, half.trajectories, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s * 0.5)
        for x, y in zip(a.steps, b.steps, strict=True):
            if isinstance(x, ToolStep) and isinstance(y, ToolStep) and x.latency_s is not None:
                assert y.latency_s == pytest.approx(x.latency_s * 0.5)
                assert y.deadline_s == pytest.approx(x.deadline_s * 0.5)


def test_bystanders_are_planned_at_rate(steps) -> None:  # type: ignore[no-untyped-def]
    inj = Injection(bystander_rate_per_s=2.0)
    plan = make_plan(steps, inj, Arrivals(), 0)
    times = np.array([b.arrival_s for b in plan.bystanders])
    assert np.all(np.diff(times) > 0)
    assert len(times[times < 300]) / 300 == pytest.approx(2.0, rel=0.1)


def test_token_ids_are_stable_and_in_range() -> None:
    a = token_ids(stable_seed("t", 0), 500, 49152)
    assert a == token_ids(stable_seed("t", 0), 500, 49152)
    assert a != token_ids(stable_seed("t", 1), 500, 49152)
    assert min(a) >= LOW_ID and max(a) < 49152 - LOW_ID
    assert stable_seed("x") == 2697552496229297191  # stable across processes and versions


def test_shared_prefix_groups_share_their_first_tokens(steps) -> None:  # type: ignore
    df = steps.copy()
    df["prefix_group"] = "system-prompt"
    plan = make_plan(df, Injection(), Arrivals(), 0)
    a, b = (t.steps[0] for t in plan.trajectories[:2])
    assert isinstance(a, CallStep) and isinstance(b, CallStep)
    ia, ib = a.append_ids(1000), b.append_ids(1000)
    assert ia[:128] == ib[:128] and ia[128:] != ib[128:]


def test_bad_arrivals_and_injections_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        Arrivals(concurrency=0)
    with pytest.raises(InputError):
        Arrivals(mode="poisson", rate=-1)
    bad = tmp_path / "bad.toml"
    bad.write_text("[tools]\nslow_fraction = 2.0\n")
    with pytest.raises(InputError, match="slow_fraction"):
        load_injection(str(bad))
    bad.write_text("[tool]\nslow_fraction = 0.1\n")
    with pytest.raises(InputError, match=r"unknown section \[tool\]"):
        load_injection(str(bad))
    with pytest.raises(InputError, match="unknown injection profile"):
        load_injection("nope")


def test_run_cli_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["traces", "gen", "--profile", "bench-small", "--trajectories",
                                "2", "--out", str(trace)]).exit_code == 0
    cases = [
        (["--policy", "nope"], "nope"),
        (["--policy", "ttl", "--policy-arg", "tau=-1"], "tau"),
        (["--policy", "ttl", "--policy-arg", "colour=red"], "colour"),
        (["--policy", "keep", "--inject", "nope"], "nope"),
        (["--policy", "keep", "--concurrency", "2", "--rate", "1"], "choose one"),
    ]
    for extra, needle in cases:
        res = runner.invoke(main, ["run", "--trace", str(trace), "--out",
                                   str(tmp_path / "o"), *extra])
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
    missing = runner.invoke(main, ["run", "--trace", str(tmp_path / "missing.parquet"),
                                   "--policy", "keep", "--out", str(tmp_path / "o")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_bystanders_outlast_a_long_closed_loop() -> None:
    from harness.plan.planner import agent_span_s
    from harness.traces.schema import SYNTHETIC_DEFAULTS, steps_table

    rows = []
    for a in range(4):  # 4 trajectories of 3 tools x 400 s, 2 agents: >= 2,400 s of tools
        for k in range(7):
            rows.append({"trajectory_id": f"a{a}", "step": k,
                         "kind": "llm" if k % 2 == 0 else "tool", "input_tokens": 8,
                         "output_tokens": 2, "tool_class": "sandbox", "tool_name": "run",
                         "latency_s": 400.0, "deadline_s": 900.0, "outcome": "ok",
                         "mutating": False, "start_s": 0.0})
    steps = steps_table(rows, SYNTHETIC_DEFAULTS).to_pandas()
    arrivals = Arrivals(mode="closed", concurrency=2)
    plan = make_plan(steps, Injection(bystander_rate_per_s=0.5), arrivals, 0)
    assert agent_span_s(list(plan.trajectories), arrivals) == pytest.approx(2400.0)
    # planned past 3x the agents' tool time, not cut at 600 s
    assert plan.bystanders[-1].arrival_s > 3 * 2400.0
