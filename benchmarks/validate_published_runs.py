"""The engine model against a published GPU run: same hardware, same vLLM, its own profiles.

    python benchmarks/validate_published_runs.py --llmservingsim DIR [--commit SHA]
        [--out reports/published-runs]

LLMServingSim (https://github.com/casys-kaist/LLMServingSim, MIT) publishes, for Llama-3.1-8B in
bf16 on one RTX 4090 under vLLM 0.19.0, both per-layer kernel profiles
(`profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1/`: dense layers by token count,
attention by prompt chunk, cached context, decoding sequences and their context, the logits
and sampler by sequences) and a measured run on the same machine and version
(`bench/examples/RTX4090/Llama-3.1-8B/vllm/`: 300 ShareGPT requests arriving over 29 s into a
41,408-token KV pool, chunked prefill of 2,048 tokens, prefix caching on; each request's
arrival, first and last token). This script:

1. composes the profiles into the project's calibration format (one layer's dense kernels and
   attention times 32 layers, the embedding, final norm, logits and sampler once): cold
   prompts, one sequence's decode by context, 32- and 256-token prompts appended to cached
   contexts (measured there, unlike on the H100 tables), and `free_tokens`, the dense kernels'
   roofline ridge; the pool, block size and iteration budget from the run's own meta.json;
2. replays the 300 requests through the engine model with vLLM's semantics, each at its
   measured arrival (the engine's queued time), with no client timeout;
3. compares TTFT (first token less queued time), TPOT ((last - first token) / (output - 1))
   and end-to-end latency, mean and P90, measured against simulated.

The profiles were taken with CUDA graphs off (enforce_eager) and measure kernels only; the
measured run used CUDA graphs and has vLLM's per-step CPU work, which no profile holds. Writes
`rtx4090.md` and `rtx4090.json` under `--out`; exits 2 when the checkout lacks the files.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derive_presets import checkout_commit  # noqa: E402

from harness.model.calibration import Calibration, write_calibration  # noqa: E402
from harness.model.iteration import APPEND_TOKENS, DECODE_CONTEXT, LONG_APPEND_TOKENS
from harness.plan.planner import Arrivals
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import run_simulation
from harness.simulate.server import Capacity
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories

ROOT = Path(__file__).resolve().parents[1]
REPO = "https://github.com/casys-kaist/LLMServingSim"
PROFILES = "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1"
RUN = "bench/examples/RTX4090/Llama-3.1-8B/vllm"
LAYERS = 32
KV_BYTES = 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B's geometry, bf16
PER_LAYER = ("layernorm", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj",
             "act_fn", "down_proj")
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
ONCE = ("embedding", "final_layernorm")


class Profiles:
    """LLMServingSim's per-layer profiles of one model on one GPU, in seconds."""

    def __init__(self, folder: Path, step_s: float = 0.0) -> None:
        self.step_s = step_s  # a per-step overhead added to every iteration (none profiled)
        dense = pd.read_csv(folder / "dense.csv")
        self.dense = {str(k): (g.tokens.to_numpy(float), g.time_us.to_numpy(float) / 1e6)
                      for k, g in dense.groupby("layer")}
        seq = pd.read_csv(folder / "per_sequence.csv")
        self.per_seq = {str(k): (g.sequences.to_numpy(float), g.time_us.to_numpy(float) / 1e6)
                        for k, g in seq.groupby("layer")}
        att = pd.read_csv(folder / "attention.csv")
        self.attention = {(int(r.prefill_chunk), int(r.kv_prefill), int(r.n_decode),
                           int(r.kv_decode)): float(r.time_us) / 1e6 for r in att.itertuples()}
        self.rows = {"dense.csv": len(dense), "per_sequence.csv": len(seq),
                     "attention.csv": len(att)}

    def _op(self, table: dict[str, tuple[np.ndarray, np.ndarray]], name: str, x: float) -> float:
        xs, ys = table[name]
        return float(np.interp(x, xs, ys))

    def dense_s(self, tokens: int, sequences: int) -> float:
        """An iteration's work outside attention: the layers' dense kernels, the embedding and
        final norm on `tokens`, the logits and sampler on `sequences`."""
        layer = sum(self._op(self.dense, n, tokens) for n in PER_LAYER)
        once = sum(self._op(self.dense, n, tokens) for n in ONCE)
        return (LAYERS * layer + once + self._op(self.per_seq, "lm_head", sequences)
                + self._op(self.per_seq, "sampler", sequences) + self.step_s)

    def prompt_s(self, new: int, cached: int) -> float:
        """A prompt chunk of `new` tokens after `cached` ones, alone."""
        return self.dense_s(new, 1) + LAYERS * self.attention[(new, cached, 0, 0)]

    def decode_s(self, context: int) -> float:
        """One sequence's decode step at `context` cached tokens."""
        return self.dense_s(1, 1) + LAYERS * self.attention[(0, 0, 1, context)]

    def ridge_tokens(self) -> int:
        """The dense GEMMs' roofline ridge: their one-token time over their marginal time per
        token between 1,024 and 2,048 tokens."""
        def gemm(t: float) -> float:
            return sum(self._op(self.dense, n, t) for n in GEMMS)
        return int(round(gemm(1) / ((gemm(2048) - gemm(1024)) / 1024)))


def nearest_context(p: Profiles, c: int) -> int:
    """The profiled decode context nearest to `c` from below (the grid is powers of two)."""
    return max(k for (_, _, n, k) in p.attention if n == 1 and k <= max(c, 16))


def calibration(p: Profiles, meta: dict[str, Any], commit: str) -> Calibration:
    """The run's server as a calibration, each field's origin stated."""
    src = f"{REPO} at {commit[:12]}"
    prof = (f"published: composed from LLMServingSim's RTX 4090 profiles of vLLM 0.19.0 ({src}, "
            f"{PROFILES}/: " + ", ".join(f"{k} {v} rows" for k, v in p.rows.items())
            + f"), one layer's kernels times {LAYERS}")
    cfg = f"published: the measured run's configuration ({src}, {RUN}/meta.json)"
    prefill = tuple((n, n / p.prompt_s(n, 0)) for n in (128, 256, 512, 1024, 2048))
    decode_ctx = (16, 64, 128, 512, 1024, 2048, 4096, 8192, 16384)
    decode = tuple((c, 1 / p.decode_s(c)) for c in decode_ctx)
    ctxs = (128, 512, 1024, 2048, 4096, 8192, 16384)
    append = tuple((c, APPEND_TOKENS / p.prompt_s(APPEND_TOKENS, c)) for c in ctxs)
    long = tuple((c, LONG_APPEND_TOKENS / p.prompt_s(LONG_APPEND_TOKENS, c)) for c in ctxs)
    kv = meta["kv_cache"]
    prov = {"prefill_points": ("published", prof), "prefill_tok_s": ("published", prof),
            "decode_points": ("published", prof),
            "decode_tok_s": ("published", f"{prof}; at {nearest_context(p, DECODE_CONTEXT)} "
                             "tokens of context, the profiled point nearest below "
                             f"{DECODE_CONTEXT}"),
            "append_points": ("published", prof), "long_append_points": ("published", prof),
            "free_tokens": ("published", f"the dense GEMMs' roofline ridge, {prof}"),
            "kv_bytes_per_token": ("published", "Llama-3.1-8B's geometry (32 layers x 8 KV "
                                   "heads x head dim 128 x K and V x 2 bytes)"),
            "kv_capacity_tokens": ("published", f"num_kv_tokens, {cfg}"),
            "block_size": ("published", cfg), "batch_tokens": ("published", cfg)}
    return Calibration(
        runtime="vllm", engine="vllm", server_version="vLLM 0.19.0 (LLMServingSim's profiles)",
        model="Llama-3.1-8B, bf16, 1 x RTX 4090", measured_at=f"not measured here: {src}",
        kv_bytes_per_token=float(KV_BYTES), prefill_tok_s=prefill[-1][1],
        decode_tok_s=1 / p.decode_s(nearest_context(p, DECODE_CONTEXT)),
        swap_out_bytes_per_s=0.0, swap_in_bytes_per_s=0.0,
        prefill_points=prefill, decode_points=decode, append_points=append,
        long_append_points=long, block_size=int(kv["block_size"]),
        kv_capacity_tokens=int(kv["num_kv_tokens"]),
        batch_tokens=int(meta["engine_kwargs"]["max_num_batched_tokens"]),
        free_tokens=p.ridge_tokens(),
        declared=(f"declared, not measured here: composed from LLMServingSim's published RTX "
                  f"4090 profiles ({src}); each field's status and source are in `provenance`"),
        field_provenance=tuple((f, st, s) for f, (st, s) in prov.items()))


def requests_frame(path: Path) -> pd.DataFrame:
    """The measured run's requests, with TTFT, TPOT and end-to-end latency in ms."""
    r = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line])
    r["ttft_ms"] = (r.first_token_ts - r.queued_ts) * 1e3
    r["tpot_ms"] = (r.last_token_ts - r.first_token_ts) / (r.output_toks - 1).clip(lower=1) * 1e3
    r["e2e_ms"] = (r.last_token_ts - r.queued_ts) * 1e3
    return r


def requests_trace(r: pd.DataFrame, path: Path) -> Path:
    """One single-call trajectory per request, arriving when the engine queued it."""
    t0 = float(r.queued_ts.min())
    steps = steps_table(({"trajectory_id": str(q.request_id), "step": 0, "kind": "llm",
                          "start_s": float(q.queued_ts - t0), "input_tokens": int(q.input_toks),
                          "output_tokens": int(q.output_toks)} for q in r.itertuples()),
                        SYNTHETIC_DEFAULTS)
    write_trajectories(steps, path, Provenance("llmservingsim-rtx4090", [RUN],
                                               notes=["arrivals at the engine's queued time"]))
    return path


def simulated_frame(out: Path) -> pd.DataFrame:
    """Per call of a simulation: TTFT, TPOT and end-to-end latency in ms, from the request's
    arrival (its trajectory's start: a call_start record is its admission by the engine)."""
    rec = read_records(out)
    t = {e: rec[rec.event == e].set_index("trajectory_id")["t_ns"] for e in
         ("trajectory_start", "first_token", "call_end")}
    n = rec[rec.event == "call_end"].set_index("trajectory_id")["output_tokens"]
    f = pd.DataFrame({"ttft_ms": (t["first_token"] - t["trajectory_start"]) / 1e6,
                      "e2e_ms": (t["call_end"] - t["trajectory_start"]) / 1e6,
                      "tpot_ms": (t["call_end"] - t["first_token"]) / 1e6
                      / (n.astype(float) - 1).clip(lower=1)})
    return f.dropna()


def compare(measured: pd.DataFrame, simulated: pd.DataFrame) -> list[dict[str, Any]]:
    """Metric by metric, mean and P90: measured, simulated, error."""
    rows = []
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for stat in ("mean", "p90"):
            m, s = (float(f[metric].mean()) if stat == "mean" else
                    float(f[metric].quantile(0.9)) for f in (measured, simulated))
            rows.append({"metric": f"{metric[:-3].upper()} {stat}", "measured_ms": m,
                         "simulated_ms": s, "error": s / m - 1.0})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llmservingsim", type=Path, required=True)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "published-runs")
    a = ap.parse_args(argv)
    need = [a.llmservingsim / PROFILES / f for f in ("dense.csv", "attention.csv",
                                                      "per_sequence.csv")]
    need += [a.llmservingsim / RUN / f for f in ("meta.json", "requests.jsonl")]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        print(f"validate_published_runs: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    commit = checkout_commit(a.llmservingsim, a.commit)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((a.llmservingsim / RUN / "meta.json").read_text())
    measured = requests_frame(a.llmservingsim / RUN / "requests.jsonl")
    trace = requests_trace(measured, a.out / "rtx4090-requests.parquet")

    def simulate(step_s: float, name: str) -> tuple[Calibration, list[dict[str, Any]]]:
        cal = calibration(Profiles(a.llmservingsim / PROFILES, step_s), meta, commit)
        assert cal.kv_capacity_tokens is not None and cal.block_size is not None
        d = a.out / name
        shutil.rmtree(d, ignore_errors=True)  # this script's own output, written again
        run_simulation(SimOptions(trace, "keep-evictable", {}, Capacity(
            tokens=cal.kv_capacity_tokens, engine="vllm", block_size=cal.block_size), None,
            Arrivals("trace"), 0, d, first_token_timeout_s=math.inf), cal)
        return cal, compare(measured, simulated_frame(d))

    cal, kernels = simulate(0.0, "rtx4090-sim")
    write_calibration(a.out / "rtx4090-calibration.json", cal)
    # One per-step overhead, fitted to the measured TPOT mean alone (bisection: TPOT grows with
    # it); TTFT, E2E and TPOT's P90 stay held out.
    target = kernels[2]["measured_ms"]
    lo, hi = 0.0, 0.05
    for _ in range(16):
        mid = (lo + hi) / 2
        if simulate(mid, "rtx4090-fit")[1][2]["simulated_ms"] < target:
            lo = mid
        else:
            hi = mid
    step = round((lo + hi) / 2, 5)
    _, fitted = simulate(step, "rtx4090-fit")
    title = (f"LLMServingSim's RTX 4090 run ({meta['num_requests']} requests, vLLM "
             f"{meta['vllm_version']}, {cal.kv_capacity_tokens:,}-token pool) against the "
             "engine model calibrated from the same machine's profiles")
    md = "\n".join([f"**{title}**", "",
                    "| metric | measured ms | kernels only: simulated ms | error | "
                    f"+{step * 1e3:.2f} ms a step (fitted to TPOT mean): simulated ms | error |",
                    "|---|---|---|---|---|---|"]
                   + [f"| {k['metric']} | {k['measured_ms']:,.1f} | {k['simulated_ms']:,.1f} | "
                      f"{k['error'] * 100:+.1f}% | {f['simulated_ms']:,.1f} | "
                      f"{f['error'] * 100:+.1f}%{' (fitted)' if i == 2 else ''} |"
                      for i, (k, f) in enumerate(zip(kernels, fitted, strict=True))])
    (a.out / "rtx4090.md").write_text(md + "\n")
    (a.out / "rtx4090.json").write_text(json.dumps(
        {"source": f"{REPO} at {commit}", "kernels_only": kernels, "step_overhead_s": step,
         "fitted": fitted, "free_tokens": cal.free_tokens}, indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
