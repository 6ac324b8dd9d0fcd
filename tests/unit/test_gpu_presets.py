"""The GPU presets composed from published kernel tables: the composition (on small synthetic
tables), the iteration model's tokens within its fixed cost (`free_tokens`), per-field
provenance, and bad preset files refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import (
    DECLARED_NOTE,
    PRESETS_DIR,
    Calibration,
    resolve_calibration,
)
from harness.model.iteration import (
    APPEND_TOKENS,
    LONG_APPEND_TOKENS,
    IterationCosts,
    fit_paged_costs,
)
from harness.simulate.server import Capacity
from tests.unit.test_simulate import CAL, llm, tool
from tests.unit.test_simulate_batching import call_ends

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_kernel_model  # noqa: E402
import kernel_sums  # noqa: E402
import validate_published_h100 as h100  # noqa: E402
import validate_published_runs as vpr  # noqa: E402

GPU_PRESETS = ("sglang-llama3.1-8b-h100", "vllm-llama3.1-70b-h100x4", "vllm-llama3.1-8b-h100")
SUMS = ROOT / "benchmarks/data/h100_kernel_sums.json"


# ---- the iteration model's free tokens -----------------------------------------------------
def test_an_iteration_pays_beta_only_beyond_its_free_tokens() -> None:
    c = IterationCosts(alpha=0.010, beta=0.001, a_tiled=0.0, a_row=0.0, tiled_rows=1,
                       alpha_decode=0.008, free_tokens=100)
    assert c.iteration_s([0.0] * 4) == pytest.approx(0.008)  # 4 decode tokens: all free
    assert c.iteration_s([], [(0, 40)]) == pytest.approx(0.010)
    assert c.iteration_s([0.0] * 10, [(0, 150)]) == pytest.approx(0.010 + 60 * 0.001)
    assert c.prefill_s(300) == pytest.approx(0.010 + 200 * 0.001)
    assert c.free_s(30) == pytest.approx(0.030) and c.free_s(3000) == pytest.approx(0.100)
    linear = dataclasses.replace(c, free_tokens=0)  # a CPU's: every token costs beta
    assert linear.iteration_s([0.0] * 10, [(0, 150)]) == pytest.approx(0.010 + 160 * 0.001)


def test_the_paged_fit_recovers_costs_with_free_tokens() -> None:
    true = IterationCosts(alpha=0.006, beta=17e-6, a_tiled=1.3e-9, a_row=1.3e-9, tiled_rows=1,
                          a_decode=46e-9, a_context=1e-8, alpha_decode=0.0061, free_tokens=256)

    def rate(new: int, ctx: int) -> float:
        return new / true.iteration_s([], [(ctx, new)])

    prefill = tuple((n, rate(n, 0)) for n in (128, 512, 2048, 8192))
    append = tuple((c, rate(APPEND_TOKENS, c)) for c in (128, 1024, 8192))
    long = tuple((c, rate(LONG_APPEND_TOKENS, c)) for c in (128, 1024, 8192))
    decode = tuple((c, 1 / true.iteration_s([float(c)])) for c in (80, 1024, 8192))
    fit = fit_paged_costs(decode[0][1], prefill, decode, append, long, 8192, free_tokens=256)
    for got, want in ((fit.alpha, true.alpha), (fit.beta, true.beta),
                      (fit.a_tiled, true.a_tiled), (fit.a_context, true.a_context),
                      (fit.decode_cell, true.decode_cell), (fit.decode_alpha, true.decode_alpha)):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-13)
    for b, ctx in ((1, 100.0), (64, 4096.0)):
        assert fit.iteration_s([ctx] * b) == pytest.approx(true.iteration_s([ctx] * b), rel=1e-4)


def test_the_engine_model_prices_a_gpu_resume_with_its_free_tokens(tmp_path: Path) -> None:
    true = IterationCosts(alpha=0.003, beta=1e-4, a_tiled=1e-7, a_row=1e-7, tiled_rows=1,
                          a_decode=1e-6, a_context=2e-5, alpha_decode=0.0035, free_tokens=64)

    def rates(k: int | None, ctxs: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
        return tuple((c, (k or c) / true.iteration_s([], [(0 if k is None else c, k or c)]))
                     for c in ctxs)

    decode = tuple((c, 1 / true.iteration_s([float(c)])) for c in (128, 512))
    cal = dataclasses.replace(CAL, prefill_points=rates(None, (128, 512, 1024)),
                              decode_points=decode,
                              append_points=rates(APPEND_TOKENS, (128, 512)),
                              long_append_points=rates(LONG_APPEND_TOKENS, (128, 512)),
                              engine="vllm", free_tokens=64)
    assert cal.iteration_costs().free_tokens == 64
    ends = call_ends(tmp_path, {"a": [llm(200, 2), tool(1.0), llm(40, 2)]}, cal,
                     Capacity(tokens=4096, engine="vllm", block_size=16))
    cold, resume = ends.iloc[0], ends.iloc[1]
    assert cold["server_ms"] == pytest.approx(true.iteration_s([], [(0, 200)]) * 1e3, rel=1e-6)
    cached = int(resume["cached_tokens"])
    new = 200 + 2 + 40 - cached
    assert 0 < new <= 64  # the resume rides within the free tokens: alpha and attention only
    assert resume["server_ms"] == pytest.approx(
        (true.alpha + true.chunk_s(cached, new) - new * true.beta) * 1e3, rel=1e-6)
    assert resume["decode_ms"] == pytest.approx(true.iteration_s([243.0]) * 1e3, rel=1e-6)


# ---- the composition of kernel tables --------------------------------------------------------
TINY = kernel_sums.ModelShape("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                              inter=128, vocab=256, tp=2)


def _tables(root: Path) -> Path:
    """aiconfigurator's layout with small tables: a GEMM costs 1 + m n k / 1e6 ms (the grid
    covers this model's shapes), prompt attention 0.01 + 1e-6 b n^2 ms, decode attention 0.005 +
    1e-5 b s ms, an all-reduce 0.002 + 1e-6 x elements ms (graph) and twice that eager."""
    base = root / kernel_sums.H100_DATA
    grid = (1, 16, 64, 256, 1024)
    dims = (16, 32, 64, 128, 256)
    rows = [{"gemm_dtype": "bfloat16", "kernel_source": "k", "m": m, "n": n, "k": k,
             "latency": 1 + m * n * k / 1e6} for m in grid for n in dims for k in dims]
    att: list[dict[str, Any]] = []
    gen: list[dict[str, Any]] = []
    for b in (1, 4):
        common = {"num_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "window_size": 0,
                  "kv_cache_dtype": "bfloat16", "attn_dtype": "bfloat16", "kernel_source": "fa",
                  "batch_size": b}
        att += [{**common, "isl": n, "latency": 0.01 + 1e-6 * b * n * n} for n in (16, 256, 1024)]
        gen += [{**common, "step": s, "latency": 0.005 + 1e-5 * b * s} for s in (15, 255, 1023)]
    ar = [{"num_gpus": 2, "allreduce_dtype": "bfloat16", "kernel_source": f"x_{kind}",
           "message_size": e, "latency": f * (0.002 + 1e-6 * e)}
          for kind, f in (("graph", 1), ("eager", 2)) for e in (64, 65536)]
    for sub, name, data in (("gemm", "gemm_perf", rows),
                            ("attention", "context_attention_perf", att),
                            ("attention", "generation_attention_perf", gen),
                            ("comm", "custom_allreduce_perf", ar)):
        d = base / sub / "fw" / "1.0"
        d.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(data).to_parquet(d / f"{name}.parquet")
    return root


def test_kernel_sums_compose_a_layer_as_the_framework_runs_it(tmp_path: Path) -> None:
    t = kernel_sums.KernelTables(_tables(tmp_path), "fw", "1.0", TINY)
    assert TINY.gemms() == ((64, 64), (64, 32), (128, 64), (64, 64))
    assert t.gemm_ms(16, 64, 64) == pytest.approx(1 + 16 * 64 * 64 / 1e6)
    # between measured m, n and k: linear in each (exact for this bilinear-in-each table)
    assert t.gemm_ms(40, 48, 64) == pytest.approx(1 + 40 * 48 * 64 / 1e6)
    # past the largest n: in proportion
    assert t.gemm_ms(16, 512, 64) == pytest.approx(2 * (1 + 16 * 256 * 64 / 1e6))
    dense = sum(1 + 256 * n * k / 1e6 for n, k in TINY.gemms()) + 2 * 2 * (0.002 + 256 * 64e-6)
    logits = 1 + 1 * 128 * 64 / 1e6
    assert t.prefill_ms(256) == pytest.approx(2 * (dense + 0.01 + 256 * 256e-6) + logits)
    dense4 = sum(1 + 4 * n * k / 1e6 for n, k in TINY.gemms()) + 2 * (0.002 + 4 * 64e-6)
    assert t.decode_ms(4, 255) == pytest.approx(
        2 * (dense4 + 0.005 + 1e-5 * 4 * 255) + 1 + 4 * 128 * 64 / 1e6)
    # an append: the grown prompt's attention less the cached one's, at least a decode step
    grown = 1e-6 * (256 ** 2 - 16 ** 2)
    assert t.append_attention_ms(240, 16) == pytest.approx(grown)
    assert t.append_attention_ms(1, 1000) == pytest.approx(0.005 + 1e-5 * 1001)
    # the ridge: the GEMMs' one-token time over their marginal time per token
    assert t.ridge_tokens() == round(sum(1 + n * k / 1e6 for n, k in TINY.gemms())
                                     / sum(n * k / 1e6 for n, k in TINY.gemms()))


def test_kernel_sums_name_missing_tables(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="gemm_perf.parquet"):
        kernel_sums.KernelTables(tmp_path, "fw", "1.0", TINY)


# ---- the shipped presets and their provenance ------------------------------------------------
@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_presets_state_each_fields_origin(name: str) -> None:
    cal = resolve_calibration(name)
    assert cal.is_declared and cal.provenance().startswith(DECLARED_NOTE)
    prov = {f: (st, src) for f, st, src in cal.field_provenance}
    assert set(cal.declared_fields()) == {"append_points", "long_append_points",
                                          "swap_out_bytes_per_s", "swap_in_bytes_per_s",
                                          "kv_capacity_tokens", "block_size", "batch_tokens"}
    for field in ("prefill_points", "prefill_tok_s", "decode_points", "decode_tok_s",
                  "free_tokens"):
        status, source = prov[field]
        assert status == "published" and "aiconfigurator" in source
        assert "095f58a51c4c" in source and "rows of" in source  # commit and rows
    assert prov["kv_bytes_per_token"][0] == "published"
    assert cal.free_tokens is not None and 200 <= cal.free_tokens <= 320
    shape = kernel_sums.LLAMA_70B_TP4 if "70b" in name else kernel_sums.LLAMA_8B
    assert cal.kv_bytes_per_token == shape.kv_bytes_per_token
    assert cal.iteration_costs().free_tokens == cal.free_tokens


def test_calibrate_list_and_simulate_print_the_declared_fields(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["calibrate", "--list"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name in GPU_PRESETS:
        i = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}:"))
        assert lines[i + 1].strip().startswith("declared (measured by no one): append_points")
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration", GPU_PRESETS[1],
                                    "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "fields measured by no one: append_points" in res.output
    run = json.loads((tmp_path / "s" / "run.json").read_text())
    assert run["calibration"]["provenance"]["swap_in_bytes_per_s"]["status"] == "declared"
    res = CliRunner().invoke(main, ["report", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "s" / "report.html").read_text()
    assert "declared, not measured here" in page
    assert "Fields measured by no one: append_points" in page


BAD_FIELDS = [("decode_tok_s", None, "decode_tok_s"), ("prefill_tok_s", -5.0, "prefill_tok_s"),
              ("kv_bytes_per_token", math.nan, "kv_bytes_per_token"),
              ("free_tokens", 10 ** 9, "free_tokens"),
              ("kv_capacity_tokens", -1, "kv_capacity_tokens"),
              ("swap_in_bytes_per_s", 1e300, "swap_in_bytes_per_s"),
              ("provenance", {"nope": {"status": "published", "source": "x"}}, "nope"),
              ("provenance", {"decode_tok_s": {"status": "guessed", "source": "x"}},
               "provenance.decode_tok_s.status"),
              ("provenance", {"decode_tok_s": {"status": "declared", "source": ""}},
               "provenance.decode_tok_s.source")]


@pytest.mark.parametrize(("field", "value", "named"), BAD_FIELDS)
def test_a_bad_preset_file_is_refused_in_one_line(tmp_path: Path, field: str, value: Any,
                                                  named: str) -> None:
    data = json.loads((PRESETS_DIR / "vllm-llama3.1-8b-h100.json").read_text())
    if value is None:
        del data[field]
    else:
        data[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["simulate", "--trace", "traces/bench-small.parquet",
                                    "--policy", "keep", "--calibration", str(bad),
                                    "--out", str(tmp_path / "s")])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and named in res.output
    assert len(res.output.strip().splitlines()) == 1
    with pytest.raises(InputError):
        Calibration.from_dict(data)


def test_the_shipped_kernel_sums_cover_the_gpu_presets_and_the_model_prices_them() -> None:
    data = json.loads(SUMS.read_text())
    assert sorted(data["presets"]) == sorted(GPU_PRESETS)
    assert "aiconfigurator" in data["source"] and data["licence"] == "Apache-2.0"
    costs = resolve_calibration(GPU_PRESETS[2]).iteration_costs()
    assert bench_kernel_model.model_ms(costs, "decode", [8, 1024, 0.0]) == pytest.approx(
        costs.iteration_s([1024.0] * 8) * 1e3)
    assert bench_kernel_model.model_ms(costs, "mixed", [4, 512, 256, 0.0]) == pytest.approx(
        costs.iteration_s([512.0] * 4, [(0, 256)]) * 1e3)
    rows = bench_kernel_model.compare(GPU_PRESETS[2], data["presets"][GPU_PRESETS[2]])
    assert {r["kind"] for r in rows} == {"decode", "prefill", "append", "mixed"}
    # the decode grid stops where the preset's pool would not hold the batch's contexts
    cap = resolve_calibration(GPU_PRESETS[2]).kv_capacity_tokens
    assert cap is not None
    assert all(b * c <= cap for b, c, _ in data["presets"][GPU_PRESETS[2]]["decode"])


# ---- the end-to-end validation against a published run --------------------------------------
def _profiles(folder: Path) -> Path:
    """LLMServingSim's layout with small tables: each dense op 1 + 0.01 t us at t tokens (the
    GEMMs 10 + 0.1 t), attention 2 + 0.001 (chunk x (chunk + cached)) + 0.01 decode x kv us,
    the logits 100 + s us and the sampler 5 us at s sequences."""
    folder.mkdir(parents=True)
    ops = set(vpr.PER_LAYER) | set(vpr.ONCE)
    pd.DataFrame([{"layer": op, "tokens": t,
                   "time_us": (10 + 0.1 * t) if op in vpr.GEMMS else (1 + 0.01 * t)}
                  for op in sorted(ops) for t in (1, 1024, 2048)]).to_csv(
        folder / "dense.csv", index=False)
    rows = []
    for pc in (0, 32, 128, 256, 512, 1024, 2048):
        for kvp in (0, 128, 512, 1024, 2048, 4096, 8192, 16384):
            rows.append({"prefill_chunk": pc, "kv_prefill": kvp, "n_decode": 0, "kv_decode": 0,
                         "time_us": 2 + 0.001 * pc * (pc + kvp)})
    for kvd in (16, 64, 128, 512, 1024, 2048, 4096, 8192, 16384):
        rows.append({"prefill_chunk": 0, "kv_prefill": 0, "n_decode": 1, "kv_decode": kvd,
                     "time_us": 2 + 0.01 * kvd})
    pd.DataFrame(rows).to_csv(folder / "attention.csv", index=False)
    pd.DataFrame([{"layer": n, "sequences": s, "time_us": (100 + s) if n == "lm_head" else 5}
                  for n in ("lm_head", "sampler") for s in (1, 256)]).to_csv(
        folder / "per_sequence.csv", index=False)
    return folder


def test_published_profiles_compose_into_a_calibration(tmp_path: Path) -> None:
    p = vpr.Profiles(_profiles(tmp_path / "prof"), step_s=0.002)
    dense_1 = 32 * (4 * (10 + 0.1) + 4 * (1 + 0.01)) + 2 * (1 + 0.01) + 101 + 5  # us
    assert p.dense_s(1, 1) == pytest.approx(dense_1 / 1e6 + 0.002)
    assert p.prompt_s(256, 1024) == pytest.approx(
        (32 * (4 * (10 + 25.6) + 4 * (1 + 2.56) + 2 + 0.001 * 256 * 1280) + 2 * (1 + 2.56)
         + 101 + 5) / 1e6 + 0.002)
    assert p.decode_s(512) == pytest.approx(dense_1 / 1e6 + 32 * (2 + 5.12) / 1e6 + 0.002)
    assert p.ridge_tokens() == round(4 * 10.1 / (4 * 0.1))
    meta = {"kv_cache": {"block_size": 16, "num_kv_tokens": 41408},
            "engine_kwargs": {"max_num_batched_tokens": 2048}}
    cal = vpr.calibration(p, meta, "0" * 40)
    assert (cal.kv_capacity_tokens, cal.block_size, cal.batch_tokens) == (41408, 16, 2048)
    assert cal.free_tokens == p.ridge_tokens() and not cal.has_swap
    assert dict(cal.append_points)[1024] == pytest.approx(APPEND_TOKENS / p.prompt_s(32, 1024))
    assert cal.declared_fields() == []  # every field from the profiles or the run's config


def test_published_requests_give_ttft_tpot_and_e2e(tmp_path: Path) -> None:
    f = tmp_path / "requests.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        {"request_id": "a", "input_toks": 100, "output_toks": 11, "arrival_time": 0,
         "queued_ts": 10.0, "scheduled_ts": 10.0, "first_token_ts": 10.5, "last_token_ts": 11.5},
        {"request_id": "b", "input_toks": 50, "output_toks": 1, "arrival_time": 0,
         "queued_ts": 12.0, "scheduled_ts": 12.0, "first_token_ts": 12.2,
         "last_token_ts": 12.2})) + "\n")
    r = vpr.requests_frame(f)
    assert r.ttft_ms.tolist() == pytest.approx([500.0, 200.0])
    assert r.tpot_ms.tolist() == pytest.approx([100.0, 0.0])
    assert r.e2e_ms.tolist() == pytest.approx([1500.0, 200.0])
    trace = vpr.requests_trace(r, tmp_path / "t.parquet")
    steps = pd.read_parquet(trace)
    assert steps.start_s.tolist() == [0.0, 2.0] and steps.input_tokens.tolist() == [100, 50]
    rows = vpr.compare(r, r)
    assert [x["metric"] for x in rows] == ["TTFT mean", "TTFT p90", "TPOT mean", "TPOT p90",
                                           "E2E mean", "E2E p90"]
    assert all(x["error"] == 0 for x in rows)
    assert vpr.main(["--llmservingsim", str(tmp_path / "none"), "--commit", "x",
                     "--out", str(tmp_path / "o")]) == 2


def test_the_h100_runs_workload_and_step_overhead(tmp_path: Path) -> None:
    steps = pd.read_parquet(h100.workload(tmp_path / "w.parquet"))
    assert len(steps) == 8 * 600 + 20 * 600
    assert steps.start_s.iloc[:3].tolist() == pytest.approx([0.0, 0.125, 0.25])
    assert steps.start_s.iloc[4800] == pytest.approx(600.0)
    assert steps.start_s.iloc[4801] == pytest.approx(600.05)
    # inference-perf sends its 100 prompts in turn: request i repeats request i - 100's prompt
    assert steps.prefix_group.iloc[:3].tolist() == ["prompt-0", "prompt-1", "prompt-2"]
    assert steps.prefix_group.iloc[100] == "prompt-0" and steps.prefix_group.nunique() == 100
    assert set(steps.prefix_tokens) == {575} and set(steps.input_tokens) == {575}
    cal = resolve_calibration(GPU_PRESETS[1])
    slow = h100.with_step_overhead(cal, 0.002)
    for (c, r), (c2, r2) in zip(cal.decode_points, slow.decode_points, strict=True):
        assert c == c2 and 1 / r2 == pytest.approx(1 / r + 0.002)
    for (n, r), (_, r2) in zip(cal.prefill_points, slow.prefill_points, strict=True):
        assert n / r2 == pytest.approx(n / r + 0.002)
    assert 32 / dict(slow.append_points)[2048] == pytest.approx(
        32 / dict(cal.append_points)[2048] + 0.002)
    assert h100.main(["--aiconfigurator", str(tmp_path), "--aic-commit", "x",
                      "--inference-sim", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
