"""What one iteration of a continuous-batching server costs, from calibrated rates.

A continuous-batching server (llama.cpp's server loop, vLLM's scheduler) works in iterations:
each one computes one token for every request that is generating and a chunk of pending prompt
tokens (up to `batch_tokens` tokens in all), then returns what it produced. To first order an
iteration costs

    alpha + beta * (tokens in the batch) + attention

- `alpha`: fixed cost per forward pass (graph launch, weights streamed once, sampling); llama.cpp
  splits an iteration into micro-batches (`ubatch_tokens`; with one KV stream per slot, equal
  token counts of consecutive slots, see harness.simulate.batch), each a forward pass;
- `beta`: compute per token (the weight matrices);
- attention: per query token, per cached token it attends (`a_tiled`, `a_row` seconds). A prompt
  chunk of at least `tiled_rows` tokens of one sequence runs the tiled (matrix) kernel, at
  `a_tiled`; decode tokens and shorter chunks run row by row, at `a_row`. On llama.cpp's CPU
  backend the row path is the per-query flash-attention loop (tiles of 64 query rows,
  GGML_FA_TILE_Q, otherwise); there it costs ~10x more per cell than the tiled kernel, which makes
  short resumed prompts at long contexts cost about as much per token as decoding.

Fitted from a calibration (harness.model.calibration), never from a trace:

- `prefill_points` (a cold prompt of n tokens takes T(n) = n / rate(n), in u = ceil(n / 512)
  forward passes): T(n) = alpha * u + beta * n + a_tiled * n (n + 1) / 2;
- `decode_tok_s`, measured on one sequence at a short context (DECODE_CONTEXT tokens):
  1 / decode_tok_s = alpha + beta + a_row * DECODE_CONTEXT;
- `decode_points` (optional, decode tokens/s by context c): 1 / rate(c) = alpha + beta + a_row * c,
  which gives `a_row`. Without them `a_row` = `a_tiled` (the row path is not distinguished).
- `append_points` (optional, tokens/s of an APPEND_TOKENS-token prompt appended to a cached
  context c, what a kept request's resume computes): when present they give `a_row` of short
  prompt chunks, and the decode points' slope becomes `a_decode`, the cost per cell of a decode
  token. The two differ on CPUs: a decode row streams the whole cache from memory once per
  token, while the rows of a chunk reuse it from the caches (measured on the development VM:
  about 25 us per cell for a 32-token chunk at 1,500 tokens of context, 40-55 us for decode).

A paged engine (vLLM, SGLang) has no row/tiled split: its prompt kernels cost smoothly in the
chunk's size and in the context it reads. Measured alone on the CPU servers (k new tokens after
c cached, k 8-512, c 0-1,536, each alone): vLLM's prompt time is alpha + beta k + a (k c +
k (k + 1) / 2) + 0.6 us per cached token (median error 2.5%, P95 12%), where the split above
underestimates a 128-token chunk at 1,536 cached tokens 1.6x (a_tiled fits 0 there); SGLang's
adds a term in c^2 (7 ns per squared cached token, so 8 tokens after 1,536 take 30 ms against
3.6 ms after none; median error 2.8%, P95 8.5%). So a calibration that also measured
`long_append_points` (LONG_APPEND_TOKENS appended to each context) is fitted the paged way
(`fit_paged_costs`): every prompt chunk at `a_tiled` per cell (tiled_rows 1), plus
`a_context` per cached token and `a_context_sq` per squared cached token it reads.

On a GPU the token term is not linear from the first token: an iteration streams every weight
once, and up to the roofline's ridge (about 250-290 tokens for a bf16 Llama on an H100, from
aiconfigurator's GEMM tables: benchmarks/derive_presets.py) its GEMMs take about the time of one
row. `free_tokens` (a calibration's, 0 on CPUs) is that ridge: an iteration of T tokens in all
pays beta for max(T - free_tokens, 0) of them, so a 32-token resume costs about a decode step,
not alpha + 32 beta with an alpha fitted low to meet the long prompts (measured against the
composed kernel sums: 32-token appends -31% with a linear token term, within 7% with the ridge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

DECODE_CONTEXT = 80  # harness calibrate decodes 32 tokens after a 64-token prompt
TILED_ROWS = 64  # query rows of one sequence from which attention runs tiled (ggml CPU)
BATCH_TOKENS = 2048  # tokens per iteration (llama.cpp's default n_batch)
UBATCH_TOKENS = 512  # tokens per forward pass (llama.cpp's default n_ubatch)
APPEND_TOKENS = 32  # harness calibrate's appended prompt (shorter than TILED_ROWS: row by row)
NOISE_DRAWS = 1 << 16  # iteration noise factors a simulated server draws once, used in turn
LONG_APPEND_TOKENS = 256  # its long appended prompt (paged engines: splits cells from context)


@dataclass(frozen=True)
class IterationCosts:
    """Seconds: per iteration, per token, per attended cell (tiled, row by row)."""

    alpha: float
    beta: float
    a_tiled: float
    a_row: float
    tiled_rows: int = TILED_ROWS
    batch_tokens: int = BATCH_TOKENS
    ubatch_tokens: int = UBATCH_TOKENS
    a_decode: float | None = None  # per cell of a decode token; None: a_row
    a_context: float = 0.0  # per cached token a prompt chunk reads (paged engines)
    a_context_sq: float = 0.0  # per squared cached token a prompt chunk reads (SGLang's CPU)
    alpha_decode: float | None = None  # an iteration of decode tokens only; None: alpha
    wake: float = 0.0  # what the first iteration after the server idled adds, at most
    wake_tau: float = 0.04  # how fast that grows with the idle time (1 - e^(-idle / tau))
    # (idle s, extra s) measured, ascending: where given, the wake instead of wake / wake_tau
    wake_curve: tuple[tuple[float, float], ...] = ()
    # tokens an iteration computes within its fixed cost (module docstring); 0: none
    free_tokens: int = 0

    def wake_after(self, idle_s: float) -> float:
        """Seconds the first iteration after `idle_s` of idle time adds: `wake_curve`
        interpolated (linearly from 0 at no idle time, flat past its last point) where
        measured, else `wake` (1 - e^(-idle / wake_tau))."""
        if idle_s <= 0.0:
            return 0.0
        if self.wake_curve:
            return curve_at(self.wake_curve, idle_s)
        if self.wake <= 0.0:
            return 0.0
        return self.wake * (1.0 - math.exp(-idle_s / self.wake_tau))

    @property
    def decode_alpha(self) -> float:
        """Seconds of an iteration that computes decode tokens only, before its tokens."""
        return self.alpha if self.alpha_decode is None else self.alpha_decode

    @property
    def decode_cell(self) -> float:
        """Seconds per attended cell of a decode token."""
        return self.a_row if self.a_decode is None else self.a_decode

    def chunk_s(self, position: int, tokens: int) -> float:
        """Prompt tokens [position, position + tokens) of one sequence, without `alpha`."""
        a = self.a_tiled if tokens >= self.tiled_rows else self.a_row
        return (tokens * self.beta + a * (tokens * position + tokens * (tokens + 1) * 0.5)
                + position * (self.a_context + self.a_context_sq * position))

    def decode_s(self, context: float) -> float:
        """One decode token at `context` cached tokens, without `alpha`."""
        return self.beta + self.decode_cell * context

    def free_s(self, tokens: int) -> float:
        """What an iteration of `tokens` tokens in all does not pay of their `beta`: those
        within `free_tokens` ride on the fixed cost's weight streaming."""
        return self.beta * min(tokens, self.free_tokens)

    def prefill_s(self, tokens: int) -> float:
        """A cold prompt alone on the server, in one iteration."""
        passes = -(-tokens // self.ubatch_tokens)
        return (self.alpha * passes + self.chunk_s(0, tokens)
                - self.free_s(min(tokens, self.ubatch_tokens)) * passes)

    def iteration_s(self, decode_contexts: list[float] | tuple[float, ...],
                    chunks: list[tuple[int, int]] | tuple[tuple[int, int], ...] = ()) -> float:
        """One iteration of a paged engine's scheduler (harness.simulate.scheduler, without wake
        and noise): decode tokens at these contexts, and prompt chunks of (position, tokens);
        an iteration with a prompt chunk has `alpha` as its fixed cost, one of decode tokens
        only `decode_alpha`."""
        cost = sum(self.decode_s(c) for c in decode_contexts)
        cost += sum(self.chunk_s(p, m) for p, m in chunks)
        cost -= self.free_s(len(decode_contexts) + sum(m for _, m in chunks))
        return cost + (self.alpha if chunks else self.decode_alpha)

    def to_dict(self) -> dict[str, float]:
        return {"alpha_ms": self.alpha * 1e3, "beta_ms": self.beta * 1e3,
                "a_tiled_us": self.a_tiled * 1e6, "a_row_us": self.a_row * 1e6,
                "a_decode_us": self.decode_cell * 1e6,
                "a_context_us": self.a_context * 1e6, "a_context_sq_us": self.a_context_sq * 1e6,
                "alpha_decode_ms": self.decode_alpha * 1e3, "wake_ms": self.wake * 1e3,
                "wake_tau_ms": self.wake_tau * 1e3,
                "tiled_rows": self.tiled_rows, "batch_tokens": self.batch_tokens,
                "ubatch_tokens": self.ubatch_tokens, "free_tokens": self.free_tokens}


def curve_at(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """`curve` ((x, y) ascending in x, from (0, 0) implied) at `x`: linear between its points,
    its last y past them."""
    x0 = y0 = 0.0
    for x1, y1 in curve:
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        x0, y0 = x1, y1
    return y0


def _decode_line(decode_points: tuple[tuple[int, float], ...]) -> tuple[float, float] | None:
    """(slope, intercept) of one decode token's time by context, from 2+ decode points, or
    None (fewer points, or a time that does not grow with the context)."""
    if len(decode_points) < 2:
        return None
    c = np.array([p for p, _ in decode_points], dtype=float)
    t = 1.0 / np.array([r for _, r in decode_points], dtype=float)
    slope, icept = np.polyfit(c, t, 1)
    return (float(slope), float(icept)) if slope > 0 else None


def _lstsq_nonneg(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares y ~ x @ c with c >= 0 (two columns: drop a negative one and refit)."""
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    if (c >= 0).all():
        return np.asarray(c, dtype=float)
    best = np.zeros(x.shape[1])
    for j in range(x.shape[1]):
        cj = float(np.dot(x[:, j], y) / max(np.dot(x[:, j], x[:, j]), 1e-300))
        if cj > 0:
            trial = np.zeros(x.shape[1])
            trial[j] = cj
            if best.sum() == 0 or np.sum((x @ trial - y) ** 2) < np.sum((x @ best - y) ** 2):
                best = trial
    return best


def fit_iteration_costs(prefill_tok_s: float, decode_tok_s: float,
                        prefill_points: tuple[tuple[int, float], ...] = (),
                        decode_points: tuple[tuple[int, float], ...] = (),
                        append_points: tuple[tuple[int, float], ...] = (),
                        tiled_rows: int = TILED_ROWS, batch_tokens: int = BATCH_TOKENS,
                        ubatch_tokens: int = UBATCH_TOKENS) -> IterationCosts:
    """The iteration cost model that reproduces a calibration's measurements (least squares)."""
    step = 1.0 / decode_tok_s  # one decode token alone at DECODE_CONTEXT
    a_row: float | None = None
    line = _decode_line(decode_points)
    if line is not None:
        a_row = line[0]
        step = line[1] + a_row * DECODE_CONTEXT
    if prefill_points:
        n = np.array([p for p, _ in prefill_points], dtype=float)
        total = n / np.array([r for _, r in prefill_points], dtype=float)
        cells = n * (n + 1) / 2
        u = np.ceil(n / ubatch_tokens)
        # alpha = step - beta - a_row DECODE_CONTEXT, so with a_row = a_tiled:
        # T(n) - u step = beta (n - u) + a_tiled (cells - u DECODE_CONTEXT)
        shift = 0.0 if a_row is not None else DECODE_CONTEXT
        extra = 0.0 if a_row is None else a_row * DECODE_CONTEXT
        y = total - u * (step - extra)
        if len(n) >= 2:
            beta, a_tiled = _lstsq_nonneg(np.column_stack([n - u, cells - u * shift]), y)
        else:
            beta, a_tiled = max(float(y[0] / max(n[0] - u[0], 1)), 0.0), 0.0
    else:
        beta, a_tiled = 1.0 / prefill_tok_s, 0.0
    if beta <= 0:
        beta = 1.0 / prefill_tok_s
    row = a_tiled if a_row is None else a_row
    alpha = step - beta - row * DECODE_CONTEXT
    if alpha < 0:  # a decode step cheaper than a prompt token: no fixed cost per iteration
        alpha = 0.0
    a_decode = None
    if append_points and a_row is not None:
        # T(c) = alpha + k beta + a_row (k c + k (k + 1) / 2) for k appended tokens at context c
        k = APPEND_TOKENS
        c = np.array([p for p, _ in append_points], dtype=float)
        t = k / np.array([r for _, r in append_points], dtype=float)
        x = k * c + k * (k + 1) / 2
        fitted = float(np.dot(x, t - alpha - k * beta) / np.dot(x, x))
        if fitted > 0:
            a_decode, row = row, fitted
    return IterationCosts(float(alpha), float(beta), float(a_tiled), float(row), tiled_rows,
                          batch_tokens, ubatch_tokens, a_decode)


def fit_paged_costs(decode_tok_s: float, prefill_points: tuple[tuple[int, float], ...],
                    decode_points: tuple[tuple[int, float], ...],
                    append_points: tuple[tuple[int, float], ...],
                    long_append_points: tuple[tuple[int, float], ...],
                    batch_tokens: int = BATCH_TOKENS, free_tokens: int = 0) -> IterationCosts:
    """A paged engine's iteration costs (module docstring) from a calibration that measured
    cold prompts (`prefill_points`, context 0), APPEND_TOKENS and LONG_APPEND_TOKENS appended
    to cached contexts, and decode by context: nonnegative least squares of each prompt's time
    T(k, c) = alpha + beta k + a_tiled (k c + k (k + 1) / 2) + a_context c + a_context_sq c^2.
    A decode token at context c adds beta + a_decode c to an iteration, and an iteration of
    decode tokens only has a fixed cost of its own, `alpha_decode` (the decode points' intercept
    less beta): the engines' decode steps and prompt iterations differ there (measured on the
    CPU servers: SGLang 5.2 ms a decode step at context 0 against 3.4-3.6 ms for an 8-token
    prompt; vLLM 2.4 against 2.7)."""
    step, a_decode = 1.0 / decode_tok_s, 0.0
    line = _decode_line(decode_points)
    if line is not None:
        a_decode, step = line
    rows, times = [], []
    for k, points in ((None, prefill_points), (APPEND_TOKENS, append_points),
                      (LONG_APPEND_TOKENS, long_append_points)):
        for n, rate in points:
            new, ctx = (n, 0) if k is None else (k, n)
            rows.append([1.0, max(new - free_tokens, 0), new * ctx + new * (new + 1) / 2, ctx,
                         ctx * ctx])
            times.append(new / rate)
    x, y = np.array(rows, dtype=float), np.array(times, dtype=float)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(x / scale, y)[0] / scale
    alpha, beta, a, a_ctx, a_sq = (float(v) for v in coef)
    # one decode token alone: its beta is free when free_tokens >= 1
    return IterationCosts(alpha, beta, a, a, 1, batch_tokens, batch_tokens,
                          a_decode if a_decode > 0 else None, a_ctx, a_sq,
                          max(step - (beta if free_tokens < 1 else 0.0), 0.0),
                          free_tokens=free_tokens)


@dataclass(frozen=True)
class MeasuredRates:
    """A calibration's measured rates, as the iteration-cost fit reads them: the prompt and
    decode rates, and the points measured (context or prompt tokens, tokens per second) of
    cold prompts, decode, short appends and long appends."""

    prefill_tok_s: float
    decode_tok_s: float
    prefill_points: tuple[tuple[int, float], ...] = ()
    decode_points: tuple[tuple[int, float], ...] = ()
    append_points: tuple[tuple[int, float], ...] = ()
    long_append_points: tuple[tuple[int, float], ...] = ()


def fit_costs(rates: MeasuredRates, batch_tokens: int = BATCH_TOKENS,
              wake: tuple[float, float] | None = None,
              wake_curve: tuple[tuple[float, float], ...] = (),
              free_tokens: int = 0) -> IterationCosts:
    """The iteration costs a calibration's rates give: the paged fit where it measured long
    appends beside cold prompts and short appends (vLLM, SGLang), else the row/tiled one;
    `wake`: (seconds, time constant) of the first iteration after idle time, where measured;
    `wake_curve`: the same measured at several idle times ((idle s, extra s), ascending);
    `free_tokens`: the paged fit's tokens within an iteration's fixed cost (the row/tiled fit,
    llama.cpp's, has none)."""
    prefill_tok_s, decode_tok_s = rates.prefill_tok_s, rates.decode_tok_s
    prefill_points, decode_points = rates.prefill_points, rates.decode_points
    append_points, long_append_points = rates.append_points, rates.long_append_points
    if long_append_points and append_points and prefill_points:
        costs = fit_paged_costs(decode_tok_s, prefill_points, decode_points, append_points,
                                long_append_points, batch_tokens, free_tokens)
    else:
        costs = fit_iteration_costs(prefill_tok_s, decode_tok_s, prefill_points, decode_points,
                                    append_points, batch_tokens=batch_tokens)
    if wake is not None:
        costs = replace(costs, wake=wake[0], wake_tau=wake[1])
    return replace(costs, wake_curve=wake_curve) if wake_curve else costs
