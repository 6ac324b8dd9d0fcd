"""A transformer's iteration time on a GPU, composed from published per-kernel measurements.

NVIDIA's aiconfigurator (https://github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships kernel
timings measured on an H100 SXM for each serving framework and version: GEMMs by (m, n, k),
prompt attention by (batch, prompt length) from an empty cache, decode attention by (batch, KV
length), and the frameworks' own all-reduce by message size, with and without CUDA graphs. This
module reads those tables (Parquet, under `systems/data/h100_sxm/<op>/<framework>/<version>/`)
and adds up one Llama layer the way the framework runs it, times the layers:

- per layer: the QKV projection, attention, the output projection, the gate-and-up projection,
  the down projection (GEMMs with m = the iteration's tokens, n and k this model's shard); with
  tensor parallelism, two all-reduces of m x hidden elements (the graph variant in a decode step,
  which the frameworks capture in CUDA graphs; the eager one in a prompt iteration);
- once: the logits GEMM for each sequence that samples (one row per sequence).

Omitted, and small beside what is kept: the norms, rotary embedding, activation and embedding
(element-wise, memory bound: about 1-2% of a prompt's time at 16k tokens), sampling, and the
framework's own per-step work on the CPU (scheduling, input preparation), which no kernel table
measures: that per-step overhead is what an end-to-end run has and these sums lack.

A table is read at its measured points and linearly interpolated between them (GEMMs: in m, n
and k; attention: in batch and length); a shape beyond a table's largest n or k is scaled in
proportion (a wider GEMM streams proportionally more weights). An appended prompt (k new tokens
after c cached: a kept context's resume) has no table: its attention is priced by a declared
rule, `append_attention_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

H100_DATA = "aic-core/src/aiconfigurator_core/systems/data/h100_sxm"


@dataclass(frozen=True)
class ModelShape:
    """A Llama-architecture model's geometry and its tensor-parallel degree."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    tp: int = 1

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of every layer, over all GPUs."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2

    def gemms(self) -> tuple[tuple[int, int], ...]:
        """(n, k) of each per-layer GEMM on one GPU's shard."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return ((
            (q + 2 * kv) // self.tp, self.hidden),  # QKV
            (self.hidden, q // self.tp),  # output projection
            (2 * self.inter // self.tp, self.hidden),  # gate and up
            (self.hidden, self.inter // self.tp))  # down


# https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json and -70B-'s
LLAMA_8B = ModelShape("Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128, 14336, 128256, 1)
LLAMA_70B_TP4 = ModelShape("Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 128, 28672, 128256, 4)


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Linear in x between measured points; beyond them, the nearest two points' line
    (clamped at or above 0)."""
    if len(xs) == 1:
        return float(ys[0])
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        return float(np.interp(x, xs, ys))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return max(float(ys[i] + slope * (x - xs[i])), 0.0)


class KernelTables:
    """One framework version's H100 tables, queried in milliseconds."""

    def __init__(self, root: Path, framework: str, version: str, shape: ModelShape,
                 attention_kernel: str | None = None) -> None:
        base = Path(root) / H100_DATA
        self.framework, self.version, self.shape = framework, version, shape
        self.sources = {
            "gemm": base / "gemm" / framework / version / "gemm_perf.parquet",
            "context": base / "attention" / framework / version / "context_attention_perf.parquet",
            "generation": (base / "attention" / framework / version
                           / "generation_attention_perf.parquet"),
            "allreduce": base / "comm" / framework / version / "custom_allreduce_perf.parquet"}
        missing = [str(p) for p in self.sources.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"kernel tables missing: {', '.join(missing)}")
        self._gemm = self._gemm_grid(pd.read_parquet(self.sources["gemm"]))
        self.context_rows, self._context = self._attention(
            pd.read_parquet(self.sources["context"]), "isl", attention_kernel)
        self.generation_rows, self._generation = self._attention(
            pd.read_parquet(self.sources["generation"]), "step", attention_kernel)
        self._allreduce = self._allreduce_table(pd.read_parquet(self.sources["allreduce"]))

    # ---- tables ----------------------------------------------------------------------------
    def _gemm_grid(self, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]:
        df = df[df.gemm_dtype == "bfloat16"]
        df = df[df.kernel_source == sorted(df.kernel_source.unique())[-1]] \
            if df.kernel_source.nunique() > 1 else df
        self.gemm_kernel = str(df.kernel_source.iloc[0])
        self.gemm_rows = len(df)
        ms, ns, ks = (np.sort(df[c].unique()).astype(float) for c in ("m", "n", "k"))
        grid = np.full((len(ms), len(ns), len(ks)), np.nan)
        mi = np.searchsorted(ms, df.m.to_numpy(float))
        ni = np.searchsorted(ns, df.n.to_numpy(float))
        ki = np.searchsorted(ks, df.k.to_numpy(float))
        grid[mi, ni, ki] = df.latency.to_numpy(float)
        for j in range(len(ns)):  # a few unmeasured (m, n, k): along m from its neighbours
            for k in range(len(ks)):
                col = grid[:, j, k]
                ok = ~np.isnan(col)
                if ok.any() and not ok.all():
                    grid[:, j, k] = np.interp(ms, ms[ok], col[ok])
        return ms, ns, ks, grid

    def _attention(self, df: pd.DataFrame, length: str, kernel: str | None
                   ) -> tuple[int, dict[int, tuple[np.ndarray, np.ndarray]]]:
        s = self.shape
        df = df[(df.num_heads == s.heads // s.tp) & (df.num_key_value_heads == s.kv_heads // s.tp)
                & (df.head_dim == s.head_dim) & (df.window_size == 0)
                & (df.kv_cache_dtype == "bfloat16") & (df.attn_dtype == "bfloat16")]
        if kernel is not None:
            df = df[df.kernel_source == kernel]
        if df.empty:
            raise ValueError(f"no {length} attention rows for {s.name} TP{s.tp} "
                             f"({self.framework} {self.version})")
        self.attention_kernel = str(df.kernel_source.iloc[0])
        by_batch: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for b, rows in df.groupby("batch_size"):
            rows = rows.sort_values(length)
            by_batch[int(b)] = (rows[length].to_numpy(float), rows.latency.to_numpy(float))
        return len(df), by_batch

    def _allreduce_table(self, df: pd.DataFrame) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
        df = df[(df.num_gpus == self.shape.tp) & (df.allreduce_dtype == "bfloat16")]
        self.allreduce_rows = len(df)
        out: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
        for graph in (True, False):
            rows = df[df.kernel_source.str.contains("graph") == graph].sort_values("message_size")
            if not rows.empty:
                out[graph] = (rows.message_size.to_numpy(float), rows.latency.to_numpy(float))
        return out

    # ---- queries (ms) ----------------------------------------------------------------------
    def gemm_ms(self, m: float, n: float, k: float) -> float:
        """One bf16 GEMM of an (m x k) by (k x n), trilinear between measured shapes."""
        ms, ns, ks, grid = self._gemm
        scale = max(n / ns[-1], 1.0) * max(k / ks[-1], 1.0)
        n, k = min(n, ns[-1]), min(k, ks[-1])

        def along(axis: np.ndarray, x: float) -> tuple[int, int, float]:
            i = int(np.clip(np.searchsorted(axis, x) - 1, 0, len(axis) - 2))
            w = (x - axis[i]) / (axis[i + 1] - axis[i])
            return i, i + 1, float(np.clip(w, 0.0, 1.0)) if x <= axis[-1] else float(w)

        m0, m1, wm = along(ms, m)
        n0, n1, wn = along(ns, n)
        k0, k1, wk = along(ks, k)
        total = 0.0
        for mi, fm in ((m0, 1 - wm), (m1, wm)):
            for ni, fn in ((n0, 1 - wn), (n1, wn)):
                for ki, fk in ((k0, 1 - wk), (k1, wk)):
                    total += fm * fn * fk * grid[mi, ni, ki]
        return max(total, 0.0) * scale

    def ridge_tokens(self) -> int:
        """The roofline's ridge of this model's GEMMs: the tokens per iteration up to which
        they take about the time of one (memory bound: the weights streamed once), i.e. their
        time at one token over their marginal time per token at 4k-8k tokens (compute bound)."""
        def layer(m: float) -> float:
            return sum(self.gemm_ms(m, n, k) for n, k in self.shape.gemms())
        return int(round(layer(1) / ((layer(8192) - layer(4096)) / 4096)))

    def _by_batch(self, table: dict[int, tuple[np.ndarray, np.ndarray]], batch: int,
                  length: float) -> float:
        batches = np.array(sorted(table), dtype=float)
        at = [(_interp(length, *table[int(b)])) for b in batches]
        return _interp(batch, batches, np.array(at))

    def context_attention_ms(self, batch: int, tokens: float) -> float:
        """Prompt attention of `batch` prompts of `tokens` each, from an empty cache (one layer)."""
        return self._by_batch(self._context, batch, tokens)

    def generation_attention_ms(self, batch: int, kv_tokens: float) -> float:
        """Decode attention of `batch` sequences at `kv_tokens` cached each (one layer)."""
        return self._by_batch(self._generation, batch, kv_tokens)

    def append_attention_ms(self, new: int, cached: float) -> float:
        """`new` prompt tokens after `cached` ones (one layer). No public table measures it; the
        rule (declared): the extra cells a cold prompt of cached + new tokens computes beyond one
        of `cached` (causal attention's cells are n (n + 1) / 2, so the difference is exactly the
        appended rows' cells), and never less than one decode step reading the whole cache."""
        grown = self.context_attention_ms(1, cached + new) - self.context_attention_ms(1, cached)
        return max(grown, self.generation_attention_ms(1, cached + new))

    def allreduce_ms(self, elements: float, graph: bool) -> float:
        if self.shape.tp == 1:
            return 0.0
        xs, ys = self._allreduce.get(graph) or self._allreduce[not graph]
        return _interp(elements, xs, ys)

    # ---- one iteration ---------------------------------------------------------------------
    def _dense_ms(self, tokens: float, samples: int, graph: bool) -> float:
        s = self.shape
        layer = sum(self.gemm_ms(tokens, n, k) for n, k in s.gemms())
        layer += 2 * self.allreduce_ms(tokens * s.hidden, graph)
        return s.layers * layer + self.gemm_ms(samples, s.vocab / s.tp, s.hidden)

    def prefill_ms(self, tokens: int) -> float:
        """A cold prompt of `tokens`, alone, in one iteration."""
        return (self._dense_ms(tokens, 1, False)
                + self.shape.layers * self.context_attention_ms(1, tokens))

    def append_ms(self, new: int, cached: int) -> float:
        """`new` prompt tokens appended to `cached` ones (a resumed call), alone."""
        return (self._dense_ms(new, 1, False)
                + self.shape.layers * self.append_attention_ms(new, cached))

    def decode_ms(self, batch: int, context: float) -> float:
        """One decode step of `batch` sequences at `context` cached tokens each."""
        return (self._dense_ms(batch, batch, True)
                + self.shape.layers * self.generation_attention_ms(batch, context))

    def mixed_ms(self, batch: int, context: float, chunk: int) -> float:
        """A decode step of `batch` sequences that also takes a `chunk`-token cold prompt (a
        chunked-prefill iteration: one flattened batch through the GEMMs)."""
        s = self.shape
        return (self._dense_ms(batch + chunk, batch + 1, False)
                + s.layers * (self.generation_attention_ms(batch, context)
                              + self.context_attention_ms(1, chunk)))
