"""Derive the GPU presets from published kernel measurements, each field's origin stated.

    python benchmarks/derive_presets.py --aiconfigurator DIR [--commit SHA]
        [--presets harness/model/presets] [--sums benchmarks/data/h100_kernel_sums.json]

DIR is a checkout of https://github.com/ai-dynamo/aiconfigurator (Apache-2.0); its H100 SXM
kernel tables (vLLM 0.19.0 and SGLang 0.5.14) are composed per Llama layer by
benchmarks/kernel_sums.py into the project's calibration format:

- `vllm-llama3.1-8b-h100`: Llama-3.1-8B-Instruct, bf16, one H100, vLLM 0.19.0's kernels;
- `vllm-llama3.1-70b-h100x4`: Llama-3.1-70B-Instruct, bf16, tensor parallel 4, the same;
- `sglang-llama3.1-8b-h100`: Llama-3.1-8B-Instruct on SGLang 0.5.14's kernels (FlashAttention 3).

Published (measured on an H100 by aiconfigurator's authors, composed here): the cold prompt
rates (`prefill_points`, `prefill_tok_s`: one prompt of n tokens from an empty cache) and the
decode rates by context (`decode_points`, `decode_tok_s`: one sequence). Declared, with the
reason in each field's provenance: what no public table measures (an appended prompt's
attention, which `append_points` and `long_append_points` price by a rule; swap bandwidth; the
usable KV pool) and what is configuration, not measurement (block size, iteration budget).
The KV bytes per token follow from the model's published geometry; `free_tokens`, the tokens an
iteration computes within its fixed cost, is the GEMM tables' roofline ridge.

Also writes the composed kernel sums the engine model is validated against (`--sums`, read by
benchmarks/bench_kernel_model.py in `make perf`, which needs no checkout): decode steps of 1-64
sequences at contexts to 16k tokens (as far as the pool holds them), cold prompts, appends and
mixed iterations. Exits 2 when the tables are missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_sums import H100_DATA, LLAMA_8B, LLAMA_70B_TP4, KernelTables, ModelShape  # noqa: E402

from harness.model.calibration import DECLARED_NOTE, Calibration, write_calibration  # noqa: E402
from harness.model.iteration import APPEND_TOKENS, DECODE_CONTEXT, LONG_APPEND_TOKENS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPO = "https://github.com/ai-dynamo/aiconfigurator"
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_CONTEXTS = (DECODE_CONTEXT, 512, 1024, 2048, 4096, 8192, 16384, 32768)
APPEND_CONTEXTS = (128, 512, 1024, 2048, 4096, 8192, 16384)
# The validation grid: decode steps, cold prompts, appends and mixed iterations.
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (128, 512, 1024, 2048, 4096, 8192, 16384)
PROMPTS = (64, 256, 1024, 2048, 4096, 8192)
MIXED = ((8, 2048, 512), (32, 2048, 512), (64, 1024, 512), (16, 4096, 2048), (32, 8192, 1024))
GIB = 2 ** 30
PCIE5_BYTES_PER_S = 64e9  # PCIe Gen5 x16, per direction (https://www.nvidia.com/en-us/data-center/h100/)
PCIE_EFFICIENCY = 0.8


def _presets() -> list[dict[str, Any]]:
    """What differs between the three presets: tables, shape, engine configuration, memory."""
    return [
        {"name": "vllm-llama3.1-8b-h100", "framework": "vllm", "version": "0.19.0",
         "shape": LLAMA_8B, "kernel": None, "gpus": 1, "weights_gb": 16.06, "activations_gb": 2.0,
         "block_size": 16, "batch_tokens": 8192, "engine_name": "vLLM",
         "config": "vLLM's defaults for an OpenAI API server on a GPU of 70 GiB or more "
                   "(block_size 16, max_num_batched_tokens 8192: vllm/engine/arg_utils.py)"},
        {"name": "vllm-llama3.1-70b-h100x4", "framework": "vllm", "version": "0.19.0",
         "shape": LLAMA_70B_TP4, "kernel": None, "gpus": 4, "weights_gb": 141.2,
         "activations_gb": 8.0, "block_size": 16, "batch_tokens": 8192, "engine_name": "vLLM",
         "config": "vLLM's defaults for an OpenAI API server on a GPU of 70 GiB or more "
                   "(block_size 16, max_num_batched_tokens 8192: vllm/engine/arg_utils.py)"},
        {"name": "sglang-llama3.1-8b-h100", "framework": "sglang", "version": "0.5.14",
         "shape": LLAMA_8B, "kernel": "fa3", "gpus": 1, "weights_gb": 16.06,
         "activations_gb": 2.0, "block_size": 1, "batch_tokens": 8192, "engine_name": "SGLang",
         "config": "SGLang's defaults on an 80 GB GPU (page_size 1, chunked_prefill_size 8192: "
                   "sglang/srt/server_args.py)"},
    ]


def _capacity(p: dict[str, Any]) -> int:
    """The usable KV pool in tokens: 90% of the GPUs' memory (vLLM's gpu_memory_utilization
    default) less the bf16 weights and an assumed activation peak."""
    usable = p["gpus"] * 79.1 * GIB * 0.9 - (p["weights_gb"] + p["activations_gb"]) * 1e9
    return int(usable // p["shape"].kv_bytes_per_token)


def compose(t: KernelTables) -> dict[str, Any]:
    """The calibration's points from the composed kernel sums."""
    prefill = [(n, n / (t.prefill_ms(n) / 1e3)) for n in PREFILL_TOKENS]
    decode = [(c, 1e3 / t.decode_ms(1, c)) for c in DECODE_CONTEXTS]
    append = [(c, APPEND_TOKENS / (t.append_ms(APPEND_TOKENS, c) / 1e3)) for c in APPEND_CONTEXTS]
    long_append = [(c, LONG_APPEND_TOKENS / (t.append_ms(LONG_APPEND_TOKENS, c) / 1e3))
                   for c in APPEND_CONTEXTS]
    return {"prefill_points": prefill, "prefill_tok_s": prefill[-1][1],
            "decode_points": decode, "decode_tok_s": decode[0][1],
            "append_points": append, "long_append_points": long_append}


def _rows(t: KernelTables) -> str:
    s = t.shape
    return (f"gemm_perf.parquet: {t.gemm_rows} bf16 rows of {t.gemm_kernel} (the per-layer "
            f"GEMMs' (n, k): {', '.join(f'{n}x{k}' for n, k in s.gemms())}, and the logits' "
            f"{s.vocab // s.tp}x{s.hidden}); context_attention_perf.parquet and "
            f"generation_attention_perf.parquet: {t.context_rows} and {t.generation_rows} rows "
            f"of {t.attention_kernel} at {s.heads // s.tp} query heads, {s.kv_heads // s.tp} KV "
            f"heads, head dim {s.head_dim}, bf16, no window"
            + (f"; custom_allreduce_perf.parquet: {t.allreduce_rows} rows at {s.tp} GPUs"
               if s.tp > 1 else ""))


def build(p: dict[str, Any], t: KernelTables, commit: str) -> Calibration:
    """One preset, its provenance field by field."""
    s: ModelShape = p["shape"]
    fw, ver = p["framework"], p["version"]
    where = f"{REPO} at {commit[:12]}, {H100_DATA}/{{gemm,attention,comm}}/{fw}/{ver}/"
    composed = (f"published: composed by benchmarks/kernel_sums.py from aiconfigurator's H100 "
                f"SXM kernel measurements ({where}; {_rows(t)}); per layer the QKV, output, "
                "gate-up and down GEMMs, attention and (tensor parallel) two all-reduces, times "
                f"{s.layers} layers, plus the logits GEMM; element-wise kernels and the "
                "framework's per-step CPU work are not in the tables")
    pts = compose(t)
    swap = p["gpus"] * PCIE5_BYTES_PER_S * PCIE_EFFICIENCY
    cap = _capacity(p)
    ridge = t.ridge_tokens()
    prov = {
        "kv_bytes_per_token": ("published", f"the model's geometry: {s.layers} layers x "
                               f"{s.kv_heads} KV heads x head dim {s.head_dim} x K and V x 2 "
                               f"bytes (https://huggingface.co/meta-llama/{s.name}/blob/main/"
                               "config.json)"),
        "prefill_tok_s": ("published", f"a cold {PREFILL_TOKENS[-1]}-token prompt, {composed}"),
        "prefill_points": ("published", f"cold prompts of {', '.join(map(str, PREFILL_TOKENS))} "
                           f"tokens, {composed}"),
        "decode_tok_s": ("published", f"one sequence at {DECODE_CONTEXT} tokens of context, "
                         f"{composed}"),
        "decode_points": ("published", "one sequence at contexts "
                          f"{', '.join(map(str, DECODE_CONTEXTS))}, {composed}"),
        "append_points": ("declared", f"no public table measures a prompt appended to a cached "
                          "context on this GPU (aiconfigurator's prompt attention starts from an "
                          "empty cache): the GEMMs as measured, the attention by a rule "
                          "(kernel_sums.append_attention_ms: a cold prompt's attention at the "
                          "grown length less that at the cached length, at least one decode "
                          f"step's) for {APPEND_TOKENS} tokens after "
                          f"{', '.join(map(str, APPEND_CONTEXTS))}"),
        "long_append_points": ("declared", f"as append_points, for {LONG_APPEND_TOKENS} tokens"),
        "swap_out_bytes_per_s": ("declared", f"{p['gpus']} x 64 GB/s PCIe Gen5 x16 per direction "
                                 "(https://www.nvidia.com/en-us/data-center/h100/) at an assumed "
                                 f"{PCIE_EFFICIENCY:.0%}: no public measurement of a framework's "
                                 "KV swap on this GPU was found"),
        "swap_in_bytes_per_s": ("declared", "as swap_out_bytes_per_s"),
        "kv_capacity_tokens": ("declared", f"{p['gpus']} x 79.1 GiB x 0.9 "
                               "(gpu_memory_utilization's default) less "
                               f"{p['weights_gb']} GB of bf16 weights and an "
                               f"assumed {p['activations_gb']} GB activation peak, over "
                               f"{s.kv_bytes_per_token:,} B a token: arithmetic, not a "
                               "server's report"),
        "free_tokens": ("published", f"the roofline ridge of the layer's GEMMs, {ridge} tokens: "
                        "their time at 1 token over their marginal time per token between 4,096 "
                        f"and 8,192 (kernel_sums.ridge_tokens), {composed}"),
        "block_size": ("declared", p["config"]),
        "batch_tokens": ("declared", p["config"]),
    }
    return Calibration(
        runtime=fw, engine=fw, server_version=f"{p['engine_name']} {ver} (its kernels)",
        model=f"{s.name}, bf16, {p['gpus']} x H100-80GB-SXM"
              + (f", tensor parallel {s.tp}" if s.tp > 1 else ""),
        measured_at=f"not measured here: aiconfigurator {commit[:12]} kernel tables",
        kv_bytes_per_token=float(s.kv_bytes_per_token),
        prefill_tok_s=round(pts["prefill_tok_s"], 1), decode_tok_s=round(pts["decode_tok_s"], 2),
        prefill_points=tuple((n, round(r, 1)) for n, r in pts["prefill_points"]),
        decode_points=tuple((c, round(r, 2)) for c, r in pts["decode_points"]),
        append_points=tuple((c, round(r, 1)) for c, r in pts["append_points"]),
        long_append_points=tuple((c, round(r, 1)) for c, r in pts["long_append_points"]),
        swap_out_bytes_per_s=swap, swap_in_bytes_per_s=swap,
        block_size=p["block_size"], kv_capacity_tokens=cap, batch_tokens=p["batch_tokens"],
        free_tokens=ridge,
        declared=(f"{DECLARED_SUMMARY} {p['engine_name']} {ver} on H100 SXM "
                  f"(aiconfigurator {commit[:12]}); each field's status and source are in "
                  "`provenance`"),
        field_provenance=tuple((f, st, src) for f, (st, src) in prov.items()))


DECLARED_SUMMARY = f"{DECLARED_NOTE}: composed from published kernel measurements of"


def sums(t: KernelTables, capacity: int) -> dict[str, Any]:
    """The composed kernel sums the model is validated against (ms)."""
    return {
        "decode": [[b, c, round(t.decode_ms(b, c), 4)] for b in BATCHES for c in CONTEXTS
                   if b * c <= capacity],
        "prefill": [[n, round(t.prefill_ms(n), 4)] for n in PROMPTS],
        "append": [[k, c, round(t.append_ms(k, c), 4)] for k in (APPEND_TOKENS, LONG_APPEND_TOKENS)
                   for c in CONTEXTS],
        "mixed": [[b, c, m, round(t.mixed_ms(b, c, m), 4)] for b, c, m in MIXED
                  if b * c <= capacity],
    }


def checkout_commit(path: Path, given: str | None) -> str:
    """`given`, else the checkout's HEAD; exits naming `path` when it is no git checkout."""
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"{path}: not a git checkout; give its commit with --commit") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", type=Path, required=True)
    ap.add_argument("--commit", help="the checkout's commit (default: git rev-parse HEAD)")
    ap.add_argument("--presets", type=Path, default=ROOT / "harness/model/presets")
    ap.add_argument("--sums", type=Path, default=ROOT / "benchmarks/data/h100_kernel_sums.json")
    a = ap.parse_args(argv)
    commit = checkout_commit(a.aiconfigurator, a.commit)
    out: dict[str, Any] = {"source": f"{REPO} at {commit}", "licence": "Apache-2.0",
                           "unit": "ms", "presets": {}}
    for p in _presets():
        try:
            t = KernelTables(a.aiconfigurator, p["framework"], p["version"], p["shape"],
                             p["kernel"])
        except (FileNotFoundError, ValueError) as exc:
            print(f"derive_presets: {exc}", file=sys.stderr)
            return 2
        cal = build(p, t, commit)
        write_calibration(a.presets / f"{p['name']}.json", cal)
        out["presets"][p["name"]] = {"tables": f"{H100_DATA}/*/{p['framework']}/{p['version']}",
                                     **sums(t, cal.kv_capacity_tokens or 0)}
        print(f"{p['name']}: prefill {cal.prefill_tok_s:,.0f} tok/s at {PREFILL_TOKENS[-1]}, "
              f"decode {1e3 / cal.decode_tok_s:.2f} ms/token, pool {cal.kv_capacity_tokens:,} "
              "tokens")
    a.sums.parent.mkdir(parents=True, exist_ok=True)
    a.sums.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.sums}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
