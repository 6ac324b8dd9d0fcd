"""The compiled event loop: chosen only when its build matches the sources, and it simulates
exactly what the pure-Python sources simulate."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.model.calibration import Calibration, write_calibration
from harness.records.store import RUN_JSON, read_records
from harness.simulate import native
from harness.simulate.native_sources import COMPILED, sources_digest
from harness.traces.generator import generate, provenance_for
from harness.traces.profiles import load_profile
from harness.traces.schema import write_trajectories

PACKAGE_DIR = Path(native.__file__).resolve().parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def sources_in(tmp: Path) -> Path:
    for m in COMPILED:
        shutil.copy(PACKAGE_DIR / f"{m}.py", tmp / f"{m}.py")
    return tmp


def test_the_sources_run_when_asked_or_when_nothing_was_compiled(tmp_path: Path) -> None:
    d = sources_in(tmp_path)
    assert native.python_reason(d, "python") == "HARNESS_SIMULATOR=python"
    assert "not compiled" in str(native.python_reason(d, None))
    assert "not compiled" in str(native.python_reason(d, "auto"))
    with pytest.raises(ValueError, match="HARNESS_SIMULATOR must be auto or python"):
        native.python_reason(d, "fast")


def test_a_build_runs_only_with_the_sources_it_was_built_from(tmp_path: Path) -> None:
    d = sources_in(tmp_path)
    for m in COMPILED[1:]:
        (d / f"{m}{SUFFIX}").write_bytes(b"")  # what the import system would pick
    assert "incomplete build" in str(native.python_reason(d, None))
    (d / f"{COMPILED[0]}{SUFFIX}").write_bytes(b"")
    assert [p.name for p in native.compiled_files(d)] == [f"{m}{SUFFIX}" for m in COMPILED]
    assert "no readable native_build.json" in str(native.python_reason(d, None))
    (d / native.BUILD_RECORD).write_text(json.dumps({"sources_sha256": sources_digest(d)}))
    assert native.python_reason(d, None) is None
    assert native.python_reason(d, "python") == "HARNESS_SIMULATOR=python"
    with (d / "engine.py").open("a") as f:
        f.write("\n# edited\n")
    assert "sources changed" in str(native.python_reason(d, None))
    (d / native.BUILD_RECORD).write_text("{not json")
    assert "no readable" in str(native.python_reason(d, None))


def test_the_digest_covers_every_compiled_source_and_its_name(tmp_path: Path) -> None:
    d = sources_in(tmp_path)
    before = sources_digest(d)
    assert before == sources_digest(d)
    for m in COMPILED:
        text = (d / f"{m}.py").read_bytes()
        (d / f"{m}.py").write_bytes(text + b" ")
        assert sources_digest(d) != before, m
        (d / f"{m}.py").write_bytes(text)
    assert sources_digest(d) == before


def test_the_source_finder_serves_the_compiled_modules_from_their_py_files(
        tmp_path: Path) -> None:
    finder = native.SourceFinder(sources_in(tmp_path))
    for m in COMPILED:
        spec = finder.find_spec(f"harness.simulate.{m}", None)
        assert spec is not None and spec.origin == str(tmp_path / f"{m}.py")
    assert finder.find_spec("harness.simulate.records", None) is None
    assert finder.find_spec("engine", None) is None


def simulate_in_a_process(tmp: Path, name: str, env: dict[str, str], *args: str) -> Path:
    out = tmp / name
    res = subprocess.run([sys.executable, "-m", "harness", "simulate", *args, "--no-summary",
                          "--out", str(out)], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return out


def engine_of(out: Path) -> str:
    return str(json.loads((out / RUN_JSON).read_text())["simulator"]["engine"])


def test_compiled_and_pure_loops_write_the_same_records(tmp_path: Path) -> None:
    if native.ENGINE != native.COMPILED_ENGINE:
        pytest.skip(f"the event loop is not compiled here: {native.ENGINE}")
    profile = dataclasses.replace(load_profile("coding-agent"), turns_min=3, turns_max=8)
    trace = write_trajectories(generate(profile, 300, 5), tmp_path / "trace.parquet",
                               provenance_for(profile, 300, 5))
    cal = write_calibration(tmp_path / "cal.json", Calibration(
        runtime="test", server_version="0", model="m", kv_bytes_per_token=36864.0,
        prefill_tok_s=20_000.0, decode_tok_s=60.0, swap_out_bytes_per_s=2**30,
        swap_in_bytes_per_s=2**30, measured_at="now"))
    cases = {  # a tight token pool (preemptions), slots with TTL, an adaptive policy
        "keep": ["--policy", "keep", "--capacity-tokens", "40000", "--concurrency", "40"],
        "ttl": ["--policy", "ttl", "--policy-arg", "tau=2", "--slots", "8", "--ctx-per-slot",
                "8192", "--concurrency", "20"],
        "threshold": ["--policy", "threshold", "--capacity-tokens", "200000", "--rate", "2"],
    }
    for name, args in cases.items():
        common = ["--trace", str(trace), "--calibration", str(cal), *args]
        compiled = simulate_in_a_process(tmp_path, f"{name}-c", {"HARNESS_SIMULATOR": "auto"},
                                         *common)
        pure = simulate_in_a_process(tmp_path, f"{name}-p", {"HARNESS_SIMULATOR": "python"},
                                     *common)
        assert engine_of(compiled).endswith(native.COMPILED_ENGINE)
        assert "python (HARNESS_SIMULATOR=python)" in engine_of(pure)
        a, b = read_records(compiled), read_records(pure)
        assert len(a) > 1000
        pd.testing.assert_frame_equal(a, b)
