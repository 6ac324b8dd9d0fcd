"""Job specs: one declaration per input, read from flags or a benchmark file (--config), the
flags overriding the file; a bad key or value is one line naming the file, the key and the
bound; run.json records the spec."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.records.store import read_records
from harness.specs.bench import BenchSpec
from harness.specs.capacity import CapacitySpec
from harness.specs.fields import read_config
from harness.specs.simulate import SimSpec

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
CALIBRATION = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"


def _config(tmp: Path, text: str) -> Path:
    path = tmp / "bench.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "words"), [
    ("slotz = 4\n", ("bench.toml", "unknown key 'slotz'")),
    ("slots = 0\n", ("bench.toml: slots", "must be in [1, 65,536]")),
    ("ctx-per-slot = 8\n", ("bench.toml: ctx-per-slot", "[16, 16,777,216]")),
    ("seed = 'x'\n", ("bench.toml: seed", "not an integer")),
    ("slots = [\n", ("bench.toml", "not valid TOML")),
])
def test_a_bad_benchmark_file_is_one_line_naming_the_file_and_key(
        tmp_path: Path, text: str, words: tuple[str, ...]) -> None:
    res = CliRunner().invoke(main, ["simulate", "--config", str(_config(tmp_path, text)),
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not (tmp_path / "o").exists()


def test_flags_override_the_file_and_run_json_records_the_spec(tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"trace = '{TRACE}'\npolicy = 'keep'\ncalibration = "
                            f"'{CALIBRATION}'\nslots = 2\nctx-per-slot = 4096\nseed = 5\n"
                            "concurrency = 2\nno-summary = true\n")
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["simulate", "--config", str(cfg), "--slots", "3",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["slots"] == 3 and run["seed"] == 5  # the flag over the file, the file's seed
    spec = run["spec"]
    assert spec["command"] == "simulate" and spec["values"]["slots"] == 3
    assert spec["values"]["ctx-per-slot"] == 4096 and spec["values"]["trace"] == str(TRACE)
    # the record builds the same spec again
    fields = {f.key: f.name for f in SimSpec.fields()}
    again = SimSpec.build({fields[k]: v for k, v in spec["values"].items()})
    assert again.record() == spec


def test_a_missing_required_input_is_named() -> None:
    with pytest.raises(InputError, match="missing option --trace"):
        SimSpec.build({"policy": "keep", "out": "o"})


def _simulate(trace: Path, out: Path) -> None:
    res = CliRunner().invoke(main, ["simulate", "--trace", str(trace), "--policy", "keep",
                                    "--calibration", str(CALIBRATION), "--slots", "2",
                                    "--ctx-per-slot", "4096", "--seed", "5", "--concurrency",
                                    "3", "--out", str(out)])
    assert res.exit_code == 0, res.output


def test_rerun_of_a_simulation_reproduces_its_records(tmp_path: Path) -> None:
    first, again = tmp_path / "first", tmp_path / "again"
    _simulate(TRACE, first)
    res = CliRunner().invoke(main, ["rerun", str(first), "--out", str(again)])
    assert res.exit_code == 0, res.output
    a, b = read_records(first), read_records(again)
    assert len(a) > 0 and a.equals(b)
    spec_a = json.loads((first / "run.json").read_text())["spec"]
    spec_b = json.loads((again / "run.json").read_text())["spec"]
    assert spec_b["values"] == {**spec_a["values"], "out": str(again)}


def test_rerun_refuses_a_directory_without_a_spec(tmp_path: Path) -> None:
    out = tmp_path / "old"
    _simulate(TRACE, out)
    run = json.loads((out / "run.json").read_text())
    del run["spec"]  # as a harness older than the specs wrote it
    (out / "run.json").write_text(json.dumps(run))
    res = CliRunner().invoke(main, ["rerun", str(out), "--out", str(tmp_path / "new")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "records the job's spec" in res.output and not (tmp_path / "new").exists()


def test_rerun_refuses_a_trace_that_changed(tmp_path: Path) -> None:
    trace, out = tmp_path / "t.parquet", tmp_path / "old"
    shutil.copyfile(TRACE, trace)
    _simulate(trace, out)
    shutil.copyfile(ROOT / "traces" / "coding-agent.parquet", trace)
    res = CliRunner().invoke(main, ["rerun", str(out), "--out", str(tmp_path / "new")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "changed since the run" in res.output and not (tmp_path / "new").exists()
    trace.unlink()
    res = CliRunner().invoke(main, ["rerun", str(out)])
    assert res.exit_code == 2 and "is gone" in res.output, res.output


def test_rerun_takes_secrets_only_for_a_job_that_has_them(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    _simulate(TRACE, out)
    res = CliRunner().invoke(main, ["rerun", str(out), "--api-key", "k"])
    assert res.exit_code == 2 and "takes no api-key" in res.output, res.output


def test_the_documented_ci_benchmark_file_parses() -> None:
    path = ROOT / "docs" / "examples" / "ci-bench.toml"
    spec = BenchSpec.build(read_config(path, BenchSpec.fields()))
    assert spec.policies == "keep,swap,recompute" and spec.ctx_per_slot == 4096
    assert spec.trace is not None and (ROOT / spec.trace).is_file()


def test_secrets_are_refused_as_benchmark_file_keys(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown key 'api-key'"):
        read_config(_config(tmp_path, "api-key = 'k'\n"), BenchSpec.fields())


def test_a_section_holds_its_inputs_in_place_under_their_own_names() -> None:
    keys = [f.key for f in CapacitySpec.fields()]
    # the search stands after the policy arguments, the connection last (its pins at its
    # end), as --help lists them
    assert keys[keys.index("policy-arg") + 1:keys.index("policy-arg") + 3] == ["slo", "budget"]
    assert keys[-6:] == ["api-key", "header", "skip-oversized", "pin-release", "pin-expiry-s",
                         "host-cap-bytes"]
    spec = CapacitySpec.build({"slo": "success=0.9", "api_key": "k", "max_agents": 8})
    assert (spec.search.slo, spec.search.max_agents, spec.connection.api_key) == (
        "success=0.9", 8, "k")
    values = spec.record()["values"]
    assert values["slo"] == "success=0.9" and values["max-agents"] == 8
    assert "api-key" not in values and "connection" not in values and "search" not in values
    assert values["pin-release"] == "latest-program" and "pins" not in values
    again = spec.replaced(max_agents=16)
    assert (again.search.max_agents, again.connection.api_key) == (16, "k")
    with pytest.raises(InputError, match="--start 9 is above --max-agents 8"):
        spec.replaced(start=9)
