"""A calibration's values outside their documented ranges (harness.limits), read from a file or
given to `harness simulate --calibration`: one line naming the file and the key, exit 2, before
anything runs; and summary.json and run.json never hold NaN or Infinity."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.jsontypes import finite_json, non_finite
from harness.limits import MAX_BLOCK_SIZE
from harness.metrics.summary_types import read_summary
from harness.model.calibration import PRESETS_DIR, Calibration, read_calibration

PRESET = json.loads((PRESETS_DIR / "vllm-tiny-cpu.json").read_text())

# (what the file holds, what the one line says after the key)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"block_size": 2**40}, f"block_size must be a positive integer <= {MAX_BLOCK_SIZE:,}"),
    ({"kv_capacity_tokens": 2**62}, "kv_capacity_tokens must be a positive integer <="),
    ({"batch_tokens": 10**9}, "batch_tokens must be a positive integer <="),
    ({"iteration_noise_samples": [0, 0, 0]}, "iteration_noise_samples must be ascending, each "
                                             "a finite number >= 0.001"),
    ({"kv_bytes_per_token": 1e308}, "kv_bytes_per_token must be a finite number >= 1 and <="),
    ({"kv_bytes_per_token": 10**400}, "kv_bytes_per_token must be a finite number"),
    ({"prefill_tok_s": 1e-300}, "prefill_tok_s must be a finite number >= 0.01"),
    ({"decode_tok_s": 1e300}, "decode_tok_s must be a finite number >= 0.01 and <= "),
    ({"swap_in_bytes_per_s": 1e300}, "swap_in_bytes_per_s must be a finite number >= 1 and <="),
    ({"prefill_points": [[128, 1e-9]]}, "prefill_points[0] tok_s must be a finite number"),
    ({"decode_points": [[10**12, 30.0]]}, "decode_points[0] context_len must be a positive "
                                          "integer <="),
    ({"request_overhead_ms": 1e300}, "request_overhead_ms must be a finite number >= 0 and <="),
    ({"request_overhead_samples_ms": [1.0, 1e300]}, "request_overhead_samples_ms must be "
                                                    "ascending"),
    ({"front_end_ms": 10**400}, "front_end_ms must be a finite number >= 0 and <="),
    ({"wake_ms": 1e300, "wake_tau_ms": 40.0}, "wake_ms must be a finite number >= 0 and <="),
    ({"wake_ms": 1.0, "wake_tau_ms": 0}, "wake_tau_ms must be a finite number > 0 and <="),
    ({"wake_curve_ms": [[10.0, 1.0, 10**400]]}, "wake_curve_ms must be"),
]


def _file(tmp_path: Path, patch: dict[str, Any]) -> Path:
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(PRESET | patch))
    return p


@pytest.mark.parametrize(("patch", "needle"), BAD)
def test_read_calibration_refuses_a_value_outside_its_range(patch: dict[str, Any], needle: str,
                                                            tmp_path: Path) -> None:
    p = _file(tmp_path, patch)
    with pytest.raises(InputError) as err:
        read_calibration(p)
    message = str(err.value)
    assert message.startswith(f"{p}: ") and needle in message and "\n" not in message


@pytest.mark.parametrize(("patch", "needle"), BAD[:5])
def test_simulate_refuses_a_calibration_value_outside_its_range(
        patch: dict[str, Any], needle: str, tmp_path: Path) -> None:
    p, out = _file(tmp_path, patch), tmp_path / "sim"
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration", str(p), "--out",
                                    str(out)])
    assert res.exit_code == 2, res.output
    lines = res.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {p}: {needle}"), res.output
    assert not (out / "summary.json").exists()


def test_a_calibration_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="JSON nested too deeply to be a calibration"):
        read_calibration(p)
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration", str(p), "--out",
                                    str(tmp_path / "sim")])
    assert res.exit_code == 2
    assert res.output == f"error: {p}: JSON nested too deeply to be a calibration\n"


def test_a_calibration_that_is_no_regular_file_is_refused_before_it_is_read(
        tmp_path: Path) -> None:
    fifo = tmp_path / "cal.json"
    os.mkfifo(fifo)  # reading it would wait for a writer for ever
    (tmp_path / "dir.json").mkdir()
    for p in (fifo, tmp_path / "dir.json"):
        with pytest.raises(InputError, match=f"^{re.escape(str(p))}: not a regular file$"):
            read_calibration(p)
        res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                        "--policy", "keep", "--calibration", str(p), "--out",
                                        str(tmp_path / "sim")])
        assert (res.exit_code, res.output) == (2, f"error: {p}: not a regular file\n")
    with pytest.raises(InputError, match="calibration file does not exist"):
        read_calibration(tmp_path / "none.json")


def test_the_flag_and_the_file_share_the_block_size_bound(tmp_path: Path) -> None:
    trace = ["simulate", "--trace", "traces/bench-small.parquet", "--policy", "keep",
             "--calibration", "vllm-tiny-cpu", "--out", str(tmp_path / "sim")]
    res = CliRunner().invoke(main, [*trace, "--block-size", str(MAX_BLOCK_SIZE + 1)])
    assert res.exit_code == 2 and "--block-size" in res.output
    Calibration.from_dict(PRESET | {"block_size": MAX_BLOCK_SIZE})  # the bound itself is taken


def test_a_measured_calibration_is_checked_as_a_file_is() -> None:
    cal = Calibration.from_dict(PRESET)
    with pytest.raises(InputError, match="calibration: iteration_noise_samples must be"):
        Calibration(**{**cal.__dict__, "iteration_noise_samples": (0.0, 0.0)})


def test_summary_and_run_json_hold_only_finite_numbers(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration",
                                    str(_file(tmp_path, {"kv_bytes_per_token": 2.0**30})),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    for name in ("summary.json", "run.json"):
        text = (out / name).read_text()
        assert "Infinity" not in text and "NaN" not in text
    assert math.isfinite(read_summary(out)["memory_time_mib_s"])


def test_a_non_finite_value_is_never_written_and_is_named() -> None:
    assert non_finite({"a": [1.0, {"b": 2}], "c": "x"}) is None
    assert non_finite({"a": [1.0, {"b": math.inf}]}) == "a[1].b"


def test_a_non_finite_result_is_written_as_null_and_named(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"kv": {"gb": math.nan, "n": 3}, "p": [1.5, -math.inf]}
    assert finite_json(doc, "summary.json") == {"kv": {"gb": None, "n": 3}, "p": [1.5, None]}
    assert capsys.readouterr().err == ("warning: summary.json: kv.gb is not a finite number; "
                                       "written as null\n")
    assert finite_json({"a": 1.0}, "run.json") == {"a": 1.0}
