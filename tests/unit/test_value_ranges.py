"""Values in profiles, injections and SLOs are checked against the documented ranges in
harness.limits: refused with the rule named, never clamped, replaced or left to a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.limits import MAX_RATE_PER_S, MAX_SECONDS, MAX_TOKENS
from harness.metrics.outcomes import check_slo
from harness.plan.injection import Injection, parse_injection
from harness.plan.planner import Arrivals, BystanderPlan, Plan
from harness.replay.preflight import check_plan
from harness.traces.profiles import parse_profile

TRACE = Path(__file__).resolve().parents[2] / "traces" / "bench-small.parquet"


def _profile(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "p", "turns": {"min": 1, "max": 3},
                            "tool_class": [{"name": "cat", "latency_s": 1.0}]}
    base.update(over)
    return base


@pytest.mark.parametrize(("over", "named"), [
    ({"prompt_tokens": 1e12}, "median"),
    ({"output_tokens": {"median": 10, "max": 2e7}}, "max"),
    ({"prompt_tokens": {"median": 100, "sigma": 50}}, "sigma"),
    ({"max_context_tokens": MAX_TOKENS + 1}, "max_context_tokens"),
    ({"arrival_rate_per_s": 1e9}, "arrival_rate_per_s"),
    ({"turns": {"min": 1, "max": 1e7}}, "max"),
    ({"prefix_groups": 1e12}, "prefix_groups"),
    ({"tool_class": [{"name": "cat", "latency_s": MAX_SECONDS * 10}]}, "latency_s"),
    ({"tool_class": [{"name": "cat", "latency_s": 1, "deadline_s": 1e15}]}, "deadline_s"),
    ({"tool_class": [{"name": "cat", "latency_s": 1, "result_tokens": 1e13}]}, "result_tokens"),
    ({"tool_class": [], "trajectory": [{"steps": [{"kind": "llm", "input_tokens": 10**12,
                                                   "output_tokens": 1}]}]}, "input_tokens"),
])
def test_a_profile_value_past_its_bound_is_refused_by_name(over: dict[str, Any],
                                                            named: str) -> None:
    with pytest.raises(InputError, match=rf"{named}.*<= [\d,]+, got"):
        parse_profile(_profile(**over), "p.toml")


def test_profile_values_at_their_bounds_are_accepted() -> None:
    p = parse_profile(_profile(prompt_tokens=MAX_TOKENS, arrival_rate_per_s=MAX_RATE_PER_S),
                      "p.toml")
    assert p.prompt_tokens.median == MAX_TOKENS and p.arrival_rate_per_s == MAX_RATE_PER_S


@pytest.mark.parametrize(("section", "key", "value", "rule"), [
    ("bystander", "prompt_tokens", 1e12, "a whole number in [1, 10,000,000]"),
    ("bystander", "output_tokens", 2.5, "a whole number"),
    ("bystander", "rate_per_s", 1e9, ">= 0 and <= 10,000"),
    ("tools", "slow_factor", 1e15, "> 0 and <= 1,000,000"),
    ("tools", "default_deadline_s", 0, "> 0"),
    ("tools", "error_fraction", 1.5, "in [0, 1]"),
])
def test_an_injection_value_out_of_range_names_its_rule(section: str, key: str, value: float,
                                                        rule: str) -> None:
    with pytest.raises(InputError) as err:
        parse_injection({section: {key: value}}, "i.toml")
    msg = str(err.value)
    assert f"{section}.{key}={value!r} is out of range" in msg and rule in msg


def test_an_injection_in_range_is_read() -> None:
    inj = parse_injection({"bystander": {"rate_per_s": 2.0, "prompt_tokens": 300}}, "i.toml")
    assert inj.bystander_rate_per_s == 2.0 and inj.bystander_prompt_tokens == 300


@pytest.mark.parametrize("bound", [-5, 0, float("nan"), float("inf"), 1e300])
def test_an_slo_bound_must_be_positive_and_finite(bound: float) -> None:
    with pytest.raises(InputError, match="resume_ms"):
        check_slo({"resume_ms": bound})
    assert check_slo({"resume_ms": 2000}) == {"resume_ms": 2000.0}


@pytest.mark.parametrize("item", ["resume_ms=-1", "ttft_ms=0", "latency=5"])
def test_report_refuses_a_bad_slo_in_one_line(item: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["report", str(tmp_path), "--slo", item])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_bystanders_larger_than_a_slot_are_refused_before_the_run() -> None:
    plan = Plan((), (BystanderPlan("bystander-0", 0.0, 5000, 16, 1),), Arrivals(), 0,
                Injection())
    with pytest.raises(InputError, match="bystander requests need 5,016 tokens"):
        check_plan(plan, 4096, skip=False)


def test_an_injection_file_with_a_huge_bystander_exits_2(tmp_path: Path) -> None:
    inj = tmp_path / "big.toml"
    inj.write_text("[bystander]\nrate_per_s = 1.0\nprompt_tokens = 1e12\n", encoding="utf-8")
    res = CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--trace", str(TRACE),
                                    "--policy", "keep", "--inject", str(inj),
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert "prompt_tokens" in res.output and "Traceback" not in res.output


def test_a_heavy_tail_never_samples_past_the_bound() -> None:
    import numpy as np

    from harness.traces.generator import sample
    from harness.traces.profiles import Dist

    d = Dist(median=100, sigma=10.0, tail_fraction=1.0, tail_scale=1.0, tail_alpha=0.01)
    x = sample(d, 1000, np.random.default_rng(0), MAX_TOKENS)
    assert np.isfinite(x).all() and x.max() == MAX_TOKENS and x.min() >= 0
