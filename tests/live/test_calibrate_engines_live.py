"""`harness calibrate` on real CPU vLLM and SGLang servers (the tiny random-weight Llama):
cold prefill, decode and append rates through the prefix cache, vLLM's swap through the
project's KV connector (SGLang's recorded as none), and the KV pool each server reports.

Each runtime must already be installed (`make vllm`, `make sglang`); where it is not, its test
is skipped with that message rather than installing it here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.model.calibration import read_calibration

pytestmark = pytest.mark.live

CACHE = Path(os.environ.get("HARNESS_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                     or Path.home() / ".cache")
             / "agent-pause-harness")


def installed(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the launcher at the runtime's cached virtualenv, or skip: not installed here."""
    var = f"HARNESS_{runtime.upper()}_PYTHON"
    if os.environ.get(var):
        return
    found = sorted((CACHE / f"{runtime}-venv").glob("*/bin/python"))
    if not found:
        pytest.skip(f"{runtime} is not installed here (`make {runtime}` installs it once); "
                    "its calibration is not tested")
    monkeypatch.setenv(var, str(found[-1]))


def calibrate(runtime: str, out: Path) -> str:
    res = CliRunner().invoke(main, ["calibrate", "--runtime", runtime, "--repeats", "1",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    return res.output


def test_vllm_calibration_measures_swap_through_the_connector(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed("vllm", monkeypatch)
    said = calibrate("vllm", tmp_path / "vllm.json")
    cal = read_calibration(tmp_path / "vllm.json")
    assert cal.engine_kind == "vllm" and cal.runtime == "vllm"
    assert [c for c, _ in cal.prefill_points] == [128, 512, 1024, 2048]
    assert len(cal.append_points) == 4 and len(cal.decode_points) == 4
    assert cal.has_swap and cal.swap_out_bytes_per_s > 0 and cal.swap_in_bytes_per_s > 0
    # the launcher's --block-size 32, a pool of VLLM_CPU_KVCACHE_SPACE=1 GiB at 512 B a token
    assert cal.block_size == 32 and cal.kv_bytes_per_token == 512.0
    assert cal.kv_capacity_tokens == (1 << 30) // 512
    assert cal.batch_tokens is not None and cal.batch_tokens > 0
    assert "swap out" in said and cal.declared is None


def test_sglang_calibration_records_no_swap_and_its_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed("sglang", monkeypatch)
    said = calibrate("sglang", tmp_path / "sglang.json")
    cal = read_calibration(tmp_path / "sglang.json")
    assert cal.engine_kind == "sglang"
    assert [c for c, _ in cal.prefill_points] == [128, 512, 1024, 2048]
    assert len(cal.append_points) == 4
    assert not cal.has_swap and cal.to_dict()["swap_out_bytes_per_s"] is None
    assert "swap unsupported: SGLang has no per-request KV offload" in said
    # page size 1, the launcher's --max-total-tokens 65536
    assert (cal.block_size, cal.kv_capacity_tokens) == (1, 65536)
    assert cal.batch_tokens is not None and cal.batch_tokens > 0
