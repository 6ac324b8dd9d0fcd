"""Numeric flags are checked against their documented ranges, never silently replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

TRACE = Path(__file__).resolve().parents[2] / "traces" / "bench-small.parquet"


@pytest.mark.parametrize(("flag", "value"), [
    ("--concurrency", "0"), ("--concurrency", "-2"), ("--rate", "0"), ("--rate", "nan"),
    ("--scrape-interval", "0"), ("--time-scale", "1e300"), ("--time-scale", "0"),
    ("--slots", "0"), ("--threads", "0"), ("--ctx-per-slot", "-1"),
])
def test_run_refuses_a_flag_out_of_range(flag: str, value: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--trace",
                                    str(TRACE), "--policy", "keep", "--out",
                                    str(tmp_path / "o"), flag, value])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()  # nothing was started or written


@pytest.mark.parametrize(("flag", "value"), [("--concurrency", "0"), ("--slots", "0"),
                                             ("--time-scale", "inf"),
                                             ("--scrape-interval", "0")])
def test_bench_refuses_a_flag_out_of_range(flag: str, value: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--out",
                                    str(tmp_path / "b"), flag, value])
    assert res.exit_code == 2, res.output
    assert flag in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["2.7", "0", "-1", "1e9"])
def test_an_integer_policy_argument_is_a_whole_number_in_range(value: str) -> None:
    from harness.errors import InputError
    from harness.policies import make_policy

    with pytest.raises(InputError, match="min_history"):
        make_policy("ttl", {"min_history": value})
    assert make_policy("ttl", {"min_history": "4"}).min_history == 4  # type: ignore[attr-defined]


def test_traces_gen_refuses_a_negative_count(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["traces", "gen", "--profile", "bench-small",
                                    "--trajectories", "-3", "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and "--trajectories" in res.output
    assert not (tmp_path / "t.parquet").exists()
