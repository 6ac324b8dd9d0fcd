"""Geometry from GGUF and config.json, the calibration file, and pricing a trace."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import Calibration, read_calibration, write_calibration
from harness.model.geometry import PRESETS, from_gguf, from_hf_config, lookup_preset
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from harness.traces.schema import Provenance, write_trajectories

SMOLLM = Path.home() / ".cache/agent-pause-harness/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def tiny_gguf(path: Path, kv_heads: int = 2, key_length: int | None = None) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_head_count_kv(kv_heads)
    w.add_embedding_length(256)
    if key_length is not None:
        w.add_key_length(key_length)
        w.add_value_length(key_length)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_gguf_reader_on_a_written_file(tmp_path: Path) -> None:
    g = from_gguf(tiny_gguf(tmp_path / "t.gguf"))
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes) == (4, 2, 32, 2)
    assert g.kv_bytes_per_token == 4 * 2 * 2 * 32 * 2
    g = from_gguf(tiny_gguf(tmp_path / "k.gguf", key_length=48))
    assert g.head_dim == 48


def test_gguf_refusals(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        from_gguf(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(InputError, match="GGUF"):
        from_gguf(junk)


@pytest.mark.skipif(not SMOLLM.is_file(), reason="SmolLM2 GGUF not downloaded")
def test_smollm2_preset_matches_the_real_gguf() -> None:
    g, p = from_gguf(SMOLLM), PRESETS["smollm2-135m"]
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes) == (
        p.layers, p.kv_heads, p.head_dim, p.dtype_bytes)
    assert g.kv_bytes_per_token == 23040


def test_hf_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 36, "num_attention_heads": 16,
                               "num_key_value_heads": 2, "hidden_size": 2048,
                               "torch_dtype": "bfloat16"}))
    g = from_hf_config(cfg)
    assert g.kv_bytes_per_token == 36864
    cfg.write_text(json.dumps({"text_config": {"num_hidden_layers": 2, "num_attention_heads": 4,
                                               "head_dim": 10, "torch_dtype": "float32"}}))
    g = from_hf_config(cfg)
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes) == (2, 4, 10, 4)
    cfg.write_text(json.dumps({"num_hidden_layers": 0}))
    with pytest.raises(InputError, match="num_hidden_layers"):
        from_hf_config(cfg)


def test_presets() -> None:
    assert lookup_preset("llama-3.1-70b")[0].kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    assert lookup_preset("qwen2.5-3b")[0].kv_bytes_per_token == 36864
    with pytest.raises(InputError):
        lookup_preset("gpt-9")


def calibration(**kw: object) -> Calibration:
    base = Calibration(runtime="llama.cpp", server_version="b1", model="m",
                       kv_bytes_per_token=36864, prefill_tok_s=20000.0, decode_tok_s=50.0,
                       swap_out_bytes_per_s=8 * 2**30, swap_in_bytes_per_s=4 * 2**30,
                       measured_at="2026-01-01T00:00:00Z",
                       prefill_points=((1000, 25000.0), (5000, 15000.0)))
    return replace(base, **kw)  # type: ignore[arg-type]


def test_calibration_round_trip_and_rates(tmp_path: Path) -> None:
    cal = calibration()
    p = write_calibration(tmp_path / "cal.json", cal)
    back = read_calibration(p)
    assert back == cal
    r = back.rates()
    assert (r.prefill_tok_s, r.swap_bytes_per_s, r.kv_bytes_per_token) == (20000, 4 * 2**30,
                                                                           36864)
    assert back.prefill_tok_s_at(500) == 25000
    assert back.prefill_tok_s_at(3000) == 20000
    assert back.prefill_tok_s_at(9000) == 15000


@pytest.mark.parametrize("patch, needle", [
    ({"prefill_tok_s": 0}, "prefill_tok_s"),
    ({"swap_in_bytes_per_s": "fast"}, "swap_in_bytes_per_s"),
    ({"bogus": 1}, "unknown key"),
    ({"prefill_points": [[100, 1.0], [50, 2.0]]}, "increasing"),
    ({"version": "9"}, "version"),
])
def test_calibration_refusals(tmp_path: Path, patch: dict[str, object], needle: str) -> None:
    data = calibration().to_dict() | patch
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InputError, match=needle):
        read_calibration(p)
    with pytest.raises(InputError, match="missing"):
        Calibration.from_dict({"runtime": "x"})


def test_trace_with_calibration_writes_prediction(tmp_path: Path) -> None:
    prof = load_profile("seed-lab")
    trace = write_trajectories(generate(prof, 0, 0), tmp_path / "t.parquet",
                               Provenance("generator"))
    cal = write_calibration(tmp_path / "cal.json",
                            calibration(swap_in_bytes_per_s=8 * 2**30, prefill_points=()))
    out = tmp_path / "prediction.json"
    res = CliRunner().invoke(main, ["model", "--calibration", str(cal), "--trace", str(trace),
                                    "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    pred = json.loads(out.read_text())
    assert pred["swap"]["resume_ms"] == pytest.approx(
        {"n": 2, "p50": 17.578125, "p95": 17.578125, "p99": 17.578125, "total": 35.15625,
         "mean": 17.578125})
    assert pred["recompute"]["resume_ms"]["p99"] == 204.8
    assert pred["keep"]["mib_s"]["total"] == 727.2
    assert pred["recompute"]["tokens_recomputed"]["total"] == 8192
    assert json.loads(res.output)["geometry"]["source"] == "calibration"


def test_trace_never_returning_priced_to_deadline(tmp_path: Path) -> None:
    prof = load_profile("flaky-tools")
    df = generate(prof, 300, 1)
    trace = write_trajectories(df, tmp_path / "f.parquet", Provenance("generator"))
    res = CliRunner().invoke(main, ["model", "--preset", "smollm2-135m", "--trace", str(trace),
                                    "--bandwidth-gib-s", "4", "--prefill-tok-s", "240",
                                    "--policy", "keep", "--json", "--per-pause"])
    doc = json.loads(res.output)
    never = [p for p in doc["pauses"] if not p["resumes"]]
    assert never and all(p["policies"]["keep"]["resume_ms"] is None for p in never)
    abandoned = df[(df["kind"] == "tool") & df["latency_s"].isna()]
    assert {p["pause_s"] for p in never} >= set(abandoned["deadline_s"].unique())
