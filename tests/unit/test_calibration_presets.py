"""The calibration file's engine keys (engine, block size, KV capacity, batch tokens, declared,
null swap rates), the shipped presets, and `harness simulate` without --calibration."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import (
    DECLARED_NOTE,
    DEFAULT_PRESET,
    PRESETS_DIR,
    Calibration,
    check_swap,
    preset_names,
    read_calibration,
    resolve_calibration,
    write_calibration,
)
from harness.policies.base import ServerRates
from harness.records.manifest import read_manifest

SHIPPED = ("llamacpp-smollm2-cpu", "sglang-llama3.1-8b-h100", "sglang-tiny-cpu",
           "vllm-llama3.1-70b-h100x4", "vllm-llama3.1-8b-h100", "vllm-tiny-cpu")
GPU = ("sglang-llama3.1-8b-h100", "vllm-llama3.1-70b-h100x4", "vllm-llama3.1-8b-h100")


def base(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": "1", "runtime": "vllm", "server_version": "0.32.0", "model": "tiny",
        "measured_at": "2026-12-03T00:00:00+00:00", "kv_bytes_per_token": 512.0,
        "prefill_tok_s": 50_000.0, "decode_tok_s": 150.0, "swap_out_bytes_per_s": 3.5e9,
        "swap_in_bytes_per_s": 2.5e9, "prefill_points": [[128, 17_000.0], [2048, 50_000.0]]}
    return doc | kw


@pytest.mark.parametrize("extra", [
    {},
    {"engine": "vllm", "block_size": 32, "kv_capacity_tokens": 2_097_152, "batch_tokens": 2048},
    {"runtime": "sglang", "swap_out_bytes_per_s": None, "swap_in_bytes_per_s": None,
     "block_size": 1, "kv_capacity_tokens": 65_536, "batch_tokens": 4096},
    {"declared": "declared, not measured here: https://example.org/a"},
    {"decode_points": [[128, 200.0]], "append_points": [[128, 4000.0], [512, 3000.0]]},
    {"append_points": [[128, 4000.0]], "long_append_points": [[128, 9000.0], [512, 7000.0]]},
    {"wake_ms": 1.4, "wake_tau_ms": 40.0, "iteration_noise_samples": [0.9, 1.0, 1.0, 1.6]},
    {"request_overhead_ms": 7.0, "request_overhead_samples_ms": [5.0, 7.0, 17.0, 40.0]},
])
def test_round_trips_are_exact(extra: dict[str, Any], tmp_path: Path) -> None:
    doc = base(**extra)
    cal = Calibration.from_dict(doc)
    assert cal.to_dict() == doc
    back = read_calibration(write_calibration(tmp_path / "c.json", cal))
    assert back == cal and back.to_dict() == doc


def test_engine_kind_falls_back_to_runtime() -> None:
    assert Calibration.from_dict(base()).engine_kind == "vllm"
    assert Calibration.from_dict(base(runtime="llamacpp")).engine_kind == "llamacpp"
    assert Calibration.from_dict(base(runtime="sglang")).engine_kind == "sglang"
    assert Calibration.from_dict(base(runtime="openai")).engine_kind is None
    assert Calibration.from_dict(base(runtime="openai", engine="sglang")).engine_kind == "sglang"


@pytest.mark.parametrize(("patch", "needle"), [
    ({"engine": "trtllm"}, "engine must be one of llamacpp, vllm, sglang"),
    ({"engine": 3}, "engine must be one of"),
    ({"block_size": 0}, "block_size must be a positive integer"),
    ({"block_size": 16.0}, "block_size must be a positive integer"),
    ({"kv_capacity_tokens": -1}, "kv_capacity_tokens must be a positive integer"),
    ({"kv_capacity_tokens": True}, "kv_capacity_tokens must be a positive integer"),
    ({"batch_tokens": "2048"}, "batch_tokens must be a positive integer"),
    ({"declared": ""}, "declared must be a non-empty string"),
    ({"declared": ["a"]}, "declared must be a non-empty string"),
    ({"swap_out_bytes_per_s": None}, "both null"),
    ({"swap_in_bytes_per_s": 0}, "swap_in_bytes_per_s must be a finite number >= 1"),
    ({"swap_out_bytes_per_s": "fast"}, "swap_out_bytes_per_s must be a number"),
])
def test_each_bad_value_is_one_line_naming_the_key(patch: dict[str, Any], needle: str,
                                                   tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(base(**patch)))
    with pytest.raises(InputError) as err:
        read_calibration(p)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(p) in str(err.value)


def test_an_engine_without_swap_prices_restore_as_never_and_refuses_swap() -> None:
    cal = Calibration.from_dict(base(swap_out_bytes_per_s=None, swap_in_bytes_per_s=None,
                                     runtime="sglang"))
    assert not cal.has_swap and cal.swap_in_bytes_per_s == 0.0
    rates: ServerRates = cal.rates()
    assert math.isinf(rates.restore_s(100)) and rates.recompute_s(100) > 0
    for policy, args in (("swap", {}), ("ttl", {}), ("ttl", {"after": "swap"})):
        with pytest.raises(InputError, match="sglang has no swap"):
            check_swap(cal, policy, args)
    for policy, args in (("keep", {}), ("ttl", {"after": "recompute"}), ("threshold", {})):
        check_swap(cal, policy, args)
    check_swap(Calibration.from_dict(base()), "swap")  # a vLLM calibration swaps


def test_every_shipped_preset_loads_validates_and_says_where_it_comes_from() -> None:
    assert tuple(preset_names()) == SHIPPED and DEFAULT_PRESET in SHIPPED
    for name in SHIPPED:
        cal = resolve_calibration(name)
        raw = json.loads((PRESETS_DIR / f"{name}.json").read_text())
        assert cal.to_dict() == raw  # exact: nothing lost or added
        assert cal.engine_kind in ("llamacpp", "vllm", "sglang")
        assert cal.kv_capacity_tokens and cal.block_size
        if cal.is_declared:
            assert name in GPU
            assert cal.declared is not None and cal.declared.startswith(DECLARED_NOTE)
            assert "aiconfigurator" in cal.declared and DECLARED_NOTE in cal.provenance()
            assert all("https://" in src for _, st, src in cal.field_provenance
                       if st == "published")
            assert cal.kv_bytes_per_token == 2 * (80 if "70b" in name else 32) * 8 * 128 * 2
        else:
            assert "measured on" in cal.provenance() and cal.prefill_points
            assert cal.decode_points and cal.append_points
    assert not resolve_calibration("sglang-tiny-cpu").has_swap
    assert resolve_calibration("vllm-tiny-cpu").has_swap


def test_resolve_takes_a_file_and_refuses_an_unknown_name_in_one_line(tmp_path: Path) -> None:
    p = write_calibration(tmp_path / "mine.json", Calibration.from_dict(base()))
    assert resolve_calibration(p) == resolve_calibration(str(p))
    with pytest.raises(InputError) as err:
        resolve_calibration("vllm-giant")
    assert "vllm-giant" in str(err.value) and "\n" not in str(err.value)
    assert all(name in str(err.value) for name in SHIPPED)
    said: list[str] = []
    resolve_calibration("vllm-llama3.1-70b-h100x4", note=said.append)
    resolve_calibration("vllm-tiny-cpu", note=said.append)
    assert len(said) == 1 and DECLARED_NOTE in said[0]


def test_calibrate_list_names_every_preset_and_the_declared_one() -> None:
    res = CliRunner().invoke(main, ["calibrate", "--list"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if not ln.startswith(" ")]
    assert [ln.split(":")[0] for ln in lines] == list(SHIPPED)
    assert all(DECLARED_NOTE in ln for ln in lines if ln.split(":")[0] in GPU)
    assert all("measured on" in ln for ln in lines if ln.split(":")[0] not in GPU)
    res = CliRunner().invoke(main, ["calibrate"])
    assert res.exit_code == 2 and "needs --out" in res.output


def test_simulate_without_calibration_uses_the_default_preset(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--slots", "4", "--ctx-per-slot", "4096",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = read_manifest(out)
    assert run.calibration is not None and run.calibration["path"] == DEFAULT_PRESET
    assert run.calibration["runtime"] == "llamacpp"
    assert DECLARED_NOTE not in res.output


def test_simulate_with_the_declared_preset_says_so(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "recompute", "--calibration",
                                    "vllm-llama3.1-70b-h100x4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert DECLARED_NOTE in res.output
    run = read_manifest(out)
    assert run.calibration is not None and DECLARED_NOTE in run.calibration["declared"]


def test_simulate_says_when_the_servers_front_end_is_modelled(tmp_path: Path) -> None:
    def said(preset: str) -> str:
        res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                        "--policy", "keep-evictable", "--calibration", preset,
                                        "--capacity-tokens", "4096", "--out",
                                        str(tmp_path / preset)])
        assert res.exit_code == 0, res.output
        return res.output

    cal = resolve_calibration("vllm-tiny-cpu")
    assert f"{cal.front_end_ms:.2f} ms a request in turn" in said("vllm-tiny-cpu")
    assert "front end" not in said("vllm-llama3.1-70b-h100x4")  # declared without one


def test_simulate_refuses_an_unknown_preset_in_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration", "nope",
                                    "--slots", "4", "--ctx-per-slot", "4096",
                                    "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "neither a file nor a shipped preset" in res.output
    assert "Traceback" not in res.output


def test_model_takes_a_preset_and_refuses_pricing_swap_without_it(tmp_path: Path) -> None:
    trace = "traces/bench-small.parquet"
    res = CliRunner().invoke(main, ["model", "--calibration", "vllm-tiny-cpu", "--trace", trace,
                                    "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["geometry"]["source"] == "calibration"
    res = CliRunner().invoke(main, ["model", "--calibration", "sglang-tiny-cpu", "--trace",
                                    trace, "--json"])
    assert res.exit_code == 2 and "sglang has no swap" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["model", "--calibration", "sglang-tiny-cpu", "--trace",
                                    trace, "--bandwidth-gib-s", "8", "--json"])
    assert res.exit_code == 0, res.output


def test_a_missing_file_is_named_as_a_file() -> None:
    for raw in ("/nonexistent.json", "results/cal", "cal.json"):
        with pytest.raises(InputError, match="calibration file does not exist"):
            resolve_calibration(raw)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_simulator_and_the_speed_check_price_a_calibration_alike(name: str) -> None:
    """The simulator's server model and a replay's speed factors (run_rates.server_speed)
    fit one set of iteration costs to a calibration: both from Calibration.iteration_costs,
    the wake's server part in the iterations; its way part goes to the requests' way
    (harness.simulate.client), as the speed check takes it out of their overheads."""
    from harness.simulate.run import server_model

    cal = resolve_calibration(name)
    model = server_model(cal)
    assert model.iteration_costs() == cal.iteration_costs(way=False)
    assert model.way_wake_curve == cal.way_wake_curve()
    if cal.wake_curve_ms:
        assert model.way_wake_curve and model.way_wake_curve[-1][1] == pytest.approx(
            cal.wake_curve_ms[-1][2] / 1e3)
