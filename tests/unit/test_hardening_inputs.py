"""Simulation and policy inputs that once ran on quietly: a Poisson rate so low its arrivals
wrap round the records' clock, a --pinned-to folder that is no replay or a replay of another
run, continuum's after=swap where the engine has no swap, a --policy-arg key given twice and
an empty --policies. Each ends in one line and exit 2 before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.errors import InputError
from harness.model.calibration import write_calibration
from harness.plan.planner import MAX_ARRIVAL_S, Arrivals, poisson_arrivals
from harness.policies import parse_policy_args
from harness.records.store import RUN_JSON
from tests.unit.test_flag_checks import NOWHERE, TRACE, _invoke, _one_line_exit_2
from tests.unit.test_simulate_pins import FAMILY, KIDS, as_replay, run
from tests.unit.test_simulate_subagents import CAL, trace


def _simulate(tmp_path: Path, *args: str) -> list[str]:
    return ["simulate", "--trace", str(TRACE), "--slots", "4", "--ctx-per-slot", "4096",
            "--no-summary", "--out", str(tmp_path / "sim"), *args]


@pytest.mark.parametrize("rate", ["1e-300", "5e-324", "1e-9"])
def test_simulate_refuses_a_rate_whose_arrivals_pass_the_clock(tmp_path: Path,
                                                               rate: str) -> None:
    _one_line_exit_2(_invoke(*_simulate(tmp_path, "--policy", "keep", "--rate", rate)),
                     f"--rate {float(rate):g}", "clock")
    assert not (tmp_path / "sim").exists()


def test_run_refuses_a_rate_whose_arrivals_pass_the_clock(tmp_path: Path) -> None:
    _one_line_exit_2(_invoke("run", "--url", NOWHERE, "--trace", str(TRACE), "--policy", "keep",
                             "--rate", "1e-300", "--out", str(tmp_path / "o")), "--rate")


def test_a_low_rate_that_fits_the_clock_is_planned() -> None:
    rng = np.random.default_rng(0)
    times = poisson_arrivals(rng, Arrivals("poisson", rate=1e-6), 10)
    assert 0 < times[-1] <= MAX_ARRIVAL_S
    # a closed loop draws the same numbers (the plan's order) and never refuses them
    closed = poisson_arrivals(np.random.default_rng(0), Arrivals("closed", rate=1e-300), 10)
    assert np.isinf(closed[-1]) or closed[-1] > MAX_ARRIVAL_S
    with pytest.raises(InputError, match="--rate"):
        poisson_arrivals(np.random.default_rng(0), Arrivals("poisson", rate=1e-6,
                                                            time_scale=1e6), 10)


def _pinned_base(tmp_path: Path) -> tuple[list[str], Path]:
    path = trace(tmp_path, FAMILY, KIDS)
    cal = tmp_path / "cal.json"
    write_calibration(cal, CAL)
    first = run(tmp_path, "first", path=path)  # a closed loop of 2 agents, seed 0
    base = ["simulate", "--trace", str(path), "--policy", "keep", "--calibration", str(cal),
            "--slots", "4", "--ctx-per-slot", "1000", "--no-summary"]
    return base, as_replay(first, tmp_path / "replay")


def test_pinned_to_a_folder_whose_run_json_says_nothing_is_refused(tmp_path: Path) -> None:
    base, replay = _pinned_base(tmp_path)
    (replay / RUN_JSON).write_text("{}")
    _one_line_exit_2(_invoke(*base, "--concurrency", "2", "--pinned-to", str(replay), "--out",
                             str(tmp_path / "o")), "--pinned-to", "run_id", "runtime")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "words"), [
    (("--concurrency", "3"), ("--concurrency 2 (here 3)",)),
    (("--concurrency", "2", "--seed", "7"), ("--seed 0 (here 7)",)),
    (("--concurrency", "2", "--token-scale", "2"), ("token scale 1 (here 2)",)),
    (("--rate", "1"), ("closed arrivals (here poisson)",)),
])
def test_pinned_to_a_replay_of_another_run_is_refused(tmp_path: Path, args: tuple[str, ...],
                                                      words: tuple[str, ...]) -> None:
    base, replay = _pinned_base(tmp_path)
    _one_line_exit_2(_invoke(*base, *args, "--pinned-to", str(replay), "--out",
                             str(tmp_path / "o")), "--pinned-to", *words)
    assert not (tmp_path / "o").exists()


def test_pinned_to_a_replay_of_another_trace_is_refused(tmp_path: Path) -> None:
    base, replay = _pinned_base(tmp_path)
    doc = json.loads((replay / RUN_JSON).read_text())
    doc["trace"]["sha256"] = "0" * 64
    (replay / RUN_JSON).write_text(json.dumps(doc))
    _one_line_exit_2(_invoke(*base, "--concurrency", "2", "--pinned-to", str(replay), "--out",
                             str(tmp_path / "o")), "another trace")


def test_continuum_after_swap_is_refused_where_the_engine_has_no_swap(tmp_path: Path) -> None:
    res = _invoke("simulate", "--trace", str(TRACE), "--calibration", "sglang-tiny-cpu",
                  "--engine", "sglang", "--policy", "continuum", "--policy-arg", "after=swap",
                  "--no-summary", "--out", str(tmp_path / "sim"))
    _one_line_exit_2(res, "sglang has no swap", "continuum with after=swap",
                     "continuum.after=recompute")
    ttl = _invoke("simulate", "--trace", str(TRACE), "--calibration", "sglang-tiny-cpu",
                  "--engine", "sglang", "--policy", "ttl", "--no-summary", "--out",
                  str(tmp_path / "ttl"))
    _one_line_exit_2(ttl, "sglang has no swap", "ttl with after=swap")


def test_a_policy_arg_key_given_twice_is_refused(tmp_path: Path) -> None:
    res = _invoke(*_simulate(tmp_path, "--policy", "ttl", "--policy-arg", "tau=1",
                             "--policy-arg", " tau =2"))
    _one_line_exit_2(res, "--policy-arg tau: given twice")
    res = _invoke("run", "--url", NOWHERE, "--trace", str(TRACE), "--policy", "ttl",
                  "--policy-arg", "tau=1", "--policy-arg", "tau=1", "--out", str(tmp_path / "o"))
    _one_line_exit_2(res, "--policy-arg tau: given twice")
    res = _invoke("bench", "--url", NOWHERE, "--trace", str(TRACE), "--policies", "ttl,keep",
                  "--policy-arg", "ttl.tau=1", "--policy-arg", "ttl.tau=2", "--out",
                  str(tmp_path / "b"))
    _one_line_exit_2(res, "--policy-arg ttl.tau: given twice")
    assert parse_policy_args(("tau=1", "ttl.tau=2")) == {"tau": "1", "ttl.tau": "2"}
    for bad in ("=3", " =3", "tau"):  # no key: never an argument named ''
        with pytest.raises(InputError, match=f"^--policy-arg {re.escape(repr(bad))}: expected "
                                             "KEY=VALUE$"):
            parse_policy_args((bad,))


def test_bench_refuses_an_empty_policies(tmp_path: Path) -> None:
    for empty in ("", " , "):
        res = _invoke("bench", "--url", NOWHERE, "--trace", str(TRACE), "--policies", empty,
                      "--out", str(tmp_path / "b"))
        _one_line_exit_2(res, f"--policies {empty!r} names no policy")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("names", ["keep,,swap", "keep,", ",keep"])
def test_bench_refuses_an_empty_name_between_commas(tmp_path: Path, names: str) -> None:
    res = _invoke("bench", "--url", NOWHERE, "--trace", str(TRACE), "--policies", names,
                  "--out", str(tmp_path / "b"))
    _one_line_exit_2(res, f"--policies {names!r}: an empty name between commas")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1 x", "http://127.0.0.1:9/\tv1"])
def test_a_url_with_a_space_is_refused_before_any_connection(tmp_path: Path, url: str) -> None:
    res = _invoke("run", "--url", url, "--trace", str(TRACE), "--policy", "keep",
                  "--out", str(tmp_path / "o"))
    _one_line_exit_2(res, "--url must be http://host[:port]")
