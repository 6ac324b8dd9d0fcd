"""The hardening sweep's own rules (benchmarks/sweep/core.py): what fails a case, and that the
case list is whole (every family collected, no name twice)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hardening_sweep  # noqa: E402
from sweep.core import Case, Result, expect, judge, run_case  # noqa: E402


def _res(rc: int, stderr: str = "", stdout: str = "") -> Result:
    return Result(rc, stdout, stderr, Path("."), 0.1)


def test_a_case_holds_on_the_documented_code_and_one_error_line() -> None:
    case = Case("f", "n", must_say=("--rate",))
    assert judge(case, _res(2, "error: --rate must be > 0\n")) == []


@pytest.mark.parametrize(("res", "problem"), [
    (_res(1, "error: --rate x\n"), "exit 1, expected [2]"),
    (_res(2, "Traceback (most recent call last):\nerror: --rate x\n"), "a traceback"),
    (_res(2, "error: --rate x\nerror: again\n"), "2 'error:' lines"),
    (_res(2, "warning: w\n"), "0 'error:' lines"),
    (_res(2, "error: the flag is wrong\n"), "does not name '--rate'"),
])
def test_what_fails_a_case(res: Result, problem: str) -> None:
    problems = judge(Case("f", "n", must_say=("--rate",)), res)
    assert any(problem in p for p in problems), problems


def test_a_case_s_own_check_is_applied() -> None:
    case = Case("f", "n", expect=expect(0), check=lambda r: "no output" if not r.stdout else None)
    assert judge(case, _res(0)) == ["no output"]
    assert judge(case, _res(0, stdout="x")) == []


def test_a_real_command_runs_in_its_own_folder_and_is_judged(tmp_path: Path) -> None:
    ok = Case("f", "version", ("--version",), expect=expect(0),
              check=lambda r: None if "harness" in r.stdout else "no version printed")
    assert run_case(ok, tmp_path) == []
    assert not (tmp_path / "f" / "version").exists()  # a case that held leaves nothing
    bad = Case("f", "unknown-command", ("no-such-command",), expect=expect(0))
    problems = run_case(bad, tmp_path)
    assert problems and "exit 2, expected [0]" in problems[0]
    assert (tmp_path / "f" / "unknown-command").is_dir()  # kept, to look at


def test_every_family_is_collected_with_unique_names() -> None:
    cases = hardening_sweep.collect(hardening_sweep.families())
    assert {c.family for c in cases} == set(hardening_sweep.families())
    assert len({c.key for c in cases}) == len(cases) >= 447


def test_a_case_s_memory_bound_is_judged() -> None:
    case = Case("f", "n", expect=expect(0), max_rss_kib=1 << 20)
    assert judge(case, Result(0, "", "", Path("."), 0.1, peak_kib=(1 << 20) + 1)) == [
        "peak RSS 1024 MiB, over 1024 MiB"]
    assert judge(case, Result(0, "", "", Path("."), 0.1, peak_kib=1 << 20)) == []
