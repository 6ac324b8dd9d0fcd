"""Compare: noise-aware verdicts on synthetic distributions, and the CLI's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from report_fixtures import write_run

from harness.cli import main
from harness.report.compare import (
    IMPROVED,
    NA,
    REGRESSED,
    SAME,
    quantile_verdict,
    scalar_verdict,
)


def lognormal(seed: int, scale: float = 1.0, n: int = 2000) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(np.log(100.0 * scale), 0.5, n)


@pytest.mark.parametrize("q", [50, 95])
def test_real_20_percent_regression_is_caught(q: float) -> None:
    ratio, ci, verdict = quantile_verdict(lognormal(1), lognormal(2, 1.2), q, 1.10)
    assert verdict == REGRESSED and ratio == pytest.approx(1.2, abs=0.1)
    assert ci is not None and ci[0] > 1.0


def test_improvement_is_symmetric() -> None:
    assert quantile_verdict(lognormal(1, 1.2), lognormal(2), 50, 1.10)[2] == IMPROVED


def test_identical_distributions_are_same_in_95_of_100_trials() -> None:
    same = 0
    for trial in range(100):
        base, new = lognormal(1000 + trial, n=300), lognormal(5000 + trial, n=300)
        verdicts = {quantile_verdict(base, new, q, 1.10, seed=trial)[2] for q in (50, 95)}
        same += verdicts == {SAME}
    assert same >= 95


def test_big_ratio_without_significance_is_same() -> None:
    # 3 wildly spread samples each: the ratio is large but the CI straddles 1
    base, new = np.array([1.0, 100.0, 10.0]), np.array([1.5, 150.0, 2.0])
    assert quantile_verdict(base, new, 50, 1.10)[2] == SAME


def test_significant_but_within_threshold_is_same() -> None:
    base = lognormal(1, n=20000)
    ratio, ci, verdict = quantile_verdict(base, base * 1.05, 50, 1.10)
    assert ci is not None and ci[0] > 1.0 and verdict == SAME


def test_tiny_samples_fall_back_to_threshold() -> None:
    assert quantile_verdict(np.array([10.0]), np.array([20.0]), 50, 1.1) == (2.0, None, REGRESSED)
    assert quantile_verdict(np.array([]), np.array([20.0]), 50, 1.1) == (None, None, NA)


@pytest.mark.parametrize(
    ("base", "new", "bigger", "expected"),
    [
        (100.0, 111.0, False, (1.11, REGRESSED)),
        (100.0, 105.0, False, (1.05, SAME)),
        (100.0, 90.0, False, (0.9, IMPROVED)),
        (1.0, 0.8, True, (0.8, REGRESSED)),
        (1.0, 1.2, True, (1.2, IMPROVED)),
        (0, 0, False, (None, SAME)),
        (0, 5, False, (None, REGRESSED)),
        (0, 5, True, (None, IMPROVED)),
        (None, 5, False, (None, NA)),
    ],
)
def test_scalar_verdict(base: float | None, new: float | None, bigger: bool,
                        expected: tuple[float | None, str]) -> None:
    ratio, verdict = scalar_verdict(base, new, 1.10, bigger)
    assert verdict == expected[1]
    assert ratio == (pytest.approx(expected[0]) if expected[0] is not None else None)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cmp")
    return {"base": write_run(root / "base", "keep", n_traj=20, seed=3),
            "same": write_run(root / "same", "keep", n_traj=20, seed=3),
            "slow": write_run(root / "slow", "keep", n_traj=20, seed=3, slow=1.6)}


def test_cli_same_run_exits_0(dirs: dict[str, Path]) -> None:
    res = CliRunner().invoke(main, ["compare", str(dirs["base"]), str(dirs["same"]), "--json",
                                    "--fail-on-regression"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["regressed"] is False
    names = [m["name"] for m in doc["metrics"]]
    assert names[:3] == ["resume_latency_ms.p50", "resume_latency_ms.p95",
                         "resume_latency_ms.p99"]
    assert {"success_rate", "goodput_per_min", "memory_time_mib_s", "bytes_moved",
            "tokens_recomputed", "ttft_ms.p50", "ttft_ms.p95", "e2e_ms.p50"} <= set(names)
    assert all(m["verdict"] == SAME for m in doc["metrics"])
    assert all({"name", "base", "new", "ratio", "verdict"} <= set(m) for m in doc["metrics"])


def test_cli_regression_exit_codes(dirs: dict[str, Path]) -> None:
    args = ["compare", str(dirs["base"]), str(dirs["slow"])]
    gated = CliRunner().invoke(main, [*args, "--json", "--fail-on-regression"])
    assert gated.exit_code == 1
    doc = json.loads(gated.output)
    verdicts = {m["name"]: m["verdict"] for m in doc["metrics"]}
    assert doc["regressed"] and verdicts["resume_latency_ms.p50"] == REGRESSED
    assert verdicts["ttft_ms.p50"] == REGRESSED
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0 and "REGRESSED: resume_latency_ms.p50" in plain.output
    back = CliRunner().invoke(main, ["compare", str(dirs["slow"]), str(dirs["base"]),
                                     "--fail-on-regression"])
    assert back.exit_code == 0 and "improved" in back.output


def test_cli_bad_input_exits_2(dirs: dict[str, Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["compare", str(dirs["base"]), str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "not a results directory" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["compare", str(tmp_path / "empty"), str(dirs["base"])])
    assert res.exit_code == 2 and "no records" in res.output
    res = CliRunner().invoke(main, ["compare", str(dirs["base"]), str(dirs["base"]),
                                    "--threshold", "0.9"])
    assert res.exit_code == 2


def test_cli_unreadable_inputs_exit_2(dirs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    (bad / "records").mkdir(parents=True)
    (bad / "records" / "part-00000.parquet").write_bytes(b"not parquet")
    res = CliRunner().invoke(main, ["compare", str(dirs["base"]), str(bad)])
    assert res.exit_code == 2 and "unreadable records" in res.output
    broken = write_run(tmp_path / "broken", "keep", n_traj=2)
    (broken / "run.json").write_text("{")
    res = CliRunner().invoke(main, ["compare", str(dirs["base"]), str(broken)])
    assert res.exit_code == 2 and "not valid JSON" in res.output


def lagged_run(directory: Path, lag_s: float) -> Path:
    from records_factory import Records, default_run

    b = Records(directory.name)
    t = b.agent("a")
    t.call(ttft=0.05, decode=0.2, appended=500, out=20)
    for _ in range(3):
        t.tool(wait=0.5, cls="local_read", action="keep", lag=lag_s)
        t.call(ttft=0.02, decode=0.2, appended=60, cached=t.context, out=20)
    t.end()
    return b.write(directory, default_run(policy="keep", run_id=directory.name))


def test_the_harness_lag_stands_beside_the_resume_figures_unjudged(tmp_path: Path) -> None:
    from harness.report.compare import compare_dirs, format_text

    # the new run's harness woke 40 ms late to every tool end: its own lag, not the server's
    result = compare_dirs(lagged_run(tmp_path / "base", 0.001), lagged_run(tmp_path / "new", 0.04))
    assert result["client_lag_ms_p99"] == {"base": pytest.approx(1.0), "new": pytest.approx(40.0)}
    assert "client_lag_ms.p99" not in [r["name"] for r in result["metrics"]]
    lines = format_text(result).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("client_lag_ms.p99"))
    assert lines[at - 1].startswith("resume_latency_ms.p99")
    assert lines[at].split()[1:3] == ["1", "40"] and "not judged" in lines[at]
    assert not result["regressed"]
