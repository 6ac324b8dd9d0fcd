"""How fast a server computed during a run, against its calibration: the rate each call alone
on the server had, from the server's own timings in the records.

A simulator's error against a replay has two sources: the rates it was given (a calibration
taken minutes before, on a machine whose speed moves) and its model of what happens between
calls (queueing, batching, the cache). To tell them apart, `rate_factors` reads the calls that
ran alone on the server (no other call in flight from their start to their end), where there is
no queueing or batching to model, and compares each one's server-reported prompt time
(`server_ms`) and decode time (`decode_ms`) with what the calibration's iteration costs give for
the same call alone: the factor is measured over predicted, the median over those calls (2.0:
the server computed half as fast as calibrated). Their time to first token less the prompt
time is the request's way to the engine and back (HTTP, the API server), less what the
calibration's wake curve adds to that way after the call's idle time: the run's own request
overhead on a busy server. A call's idle time counts from the server's last work, calls and
the pauses' requests to it alike. Where the calibration has a wake curve (the engines), what idle
time adds is the run's own too: the prompt factor, the busy way and the curve's points are
fitted together from the calls alone (harness.model.wake_fit), as a calibration's wake moves
several-fold within minutes on a shared machine. `rescaled` divides a calibration's rates by the
factors and takes that overhead, so that a simulation with it runs at the run's own speed, and
whatever error is left is the model's.

The same estimator on a simulated run's records gives factors of 1 (to rounding): what the
simulator writes for a call alone is what these costs predict. (Its overhead there reads 0: a
simulated call starts when its request reaches the engine, the overhead spent before.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from harness.arrays import FloatArray
from harness.metrics.frames import build_frames
from harness.model.calibration import Calibration
from harness.model.calibration_values import noise_from, overhead_samples
from harness.model.iteration import IterationCosts
from harness.model.wake_fit import curve_weights, fit_wake


@dataclass(frozen=True)
class RateFactors:
    """Measured over calibrated time of calls alone on the server (> 1: the server was slower);
    None where no such call had the timing. `calls`: the calls alone that had both timings."""

    prefill: float | None
    decode: float | None
    calls: int
    overhead_ms: float | None = None  # the client's time to first token less server_ms
    overhead_samples_ms: tuple[float, ...] = ()  # each call's, ascending (overhead_samples)
    # each call's prompt factor over their median, ascending: the server's spread around
    # the model (the simulator's iteration noise at the run's own rates)
    noise_samples: tuple[float, ...] = ()
    # the run's own wake curve ([idle_ms, server_ms, way_ms], the calibration's idle times;
    # empty: not fitted, the calibration's kept) and which of its points the run's calls
    # informed (the others are the calibration's)
    wake_curve_ms: tuple[tuple[float, float, float], ...] = ()
    wake_fitted: tuple[bool, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode, "calls": self.calls,
                "overhead_ms": self.overhead_ms,
                "overhead_samples_ms": list(self.overhead_samples_ms),
                "noise_samples": list(self.noise_samples),
                "wake_curve_ms": [list(p) for p in self.wake_curve_ms],
                "wake_fitted": list(self.wake_fitted)}



def _ended_calls(records: pd.DataFrame) -> pd.DataFrame:
    """The run's calls that ended, as harness.metrics.frames links them (each call_end and
    first token to its call_start): `t0`, `t_first` (NaN where no first token came), `t1`,
    the call_start's `trajectory_id`, `step`, `prompt_tokens` and the call_end's fields."""
    calls = build_frames(records).calls
    calls = calls[calls["end_ns"].notna()]
    return calls.rename(columns={"start_ns": "t0", "ft_ns": "t_first", "end_ns": "t1",
                                 "tid": "trajectory_id"}).reset_index(drop=True)


# Records written when a server-side control ends: a slot's erase, save or restore, and where
# the server's pause controls are requests (vLLM's connector, SGLang's sessions) a context's
# hold, unpin or release (its kv_state after the request's answer). The server worked until
# then, so it was not idle.
CONTROL_END_EVENTS = ("erase", "swap_out", "swap_in")
CONTROL_END_STATES = ("paused", "evictable", "released")


def control_ends_ns(records: pd.DataFrame) -> np.ndarray:
    """When each server-side control of the run ended (its record's t_ns), ascending."""
    event = records["event"]
    ends = event.isin(CONTROL_END_EVENTS) | (
        (event == "kv_state") & records["status"].isin(CONTROL_END_STATES))
    return np.sort(records.loc[ends, "t_ns"].to_numpy(dtype=np.int64))


def solo_calls(records: pd.DataFrame) -> pd.DataFrame:
    """The calls (status ok; `_ended_calls`' columns) no other call overlapped, from their
    call_start to their call_end; bystander traffic counts as a call. `idle_s`: how long the
    server had had nothing to do when each was sent: since the later of the last call's end
    and the last server-side control's (`control_ends_ns`: a pause's request to the server
    keeps it busy between two calls; since the run's first call for the first)."""
    calls = _ended_calls(records)
    if calls.empty:
        return calls
    calls = calls.sort_values("t0", kind="stable").reset_index(drop=True)
    t0 = calls["t0"].to_numpy(dtype=np.int64)
    t1 = calls["t1"].to_numpy(dtype=np.int64)
    # Overlap with an earlier call: it ends after this one starts (running max of the ends);
    # with a later one: the next start comes before this end.
    ended_before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(t1)[:-1]])
    next_start = np.concatenate([t0[1:], [np.iinfo(np.int64).max]])
    alone = (ended_before <= t0) & (next_start >= t1)
    # the latest control's end at or before each send (a sentinel before the first)
    controls = np.concatenate([[np.iinfo(np.int64).min], control_ends_ns(records)])
    control_before = controls[np.searchsorted(controls, t0, side="right") - 1]
    busy_until = np.maximum(np.maximum(ended_before, control_before), t0[0])
    calls["idle_s"] = np.maximum(t0 - busy_until, 0) / 1e9
    return calls[alone & (calls["status"] == "ok").to_numpy()]


def _prefill_s(costs: IterationCosts, position: int, tokens: int, per_pass: int) -> float:
    return costs.alpha * max(1, -(-tokens // per_pass)) + costs.chunk_s(position, tokens)


def rate_factors(records: pd.DataFrame, costs: IterationCosts, per_pass: int,
                 with_way: IterationCosts | None = None,
                 wake_curve_ms: tuple[tuple[float, float, float], ...] = ()) -> RateFactors:
    """The factors of a run's records against `costs`; `per_pass` is the most prompt tokens one
    forward pass takes (llama.cpp's micro-batch, an engine's iteration budget). `with_way`:
    the same costs with a wake curve's way part (Calibration.iteration_costs()): what it adds
    over `costs` after a call's idle time is the slower way there and back after that idle
    time, taken out of the call's overhead, so that the overheads are the busy server's and
    the curve adds the rest per call, as at the calibrated rates. `wake_curve_ms`: the
    calibration's wake curve; where given, the run's own curve at its idle times is fitted
    with the prompt factor and the busy way (`_own_wake`) instead, and returned."""
    solo = solo_calls(records)
    if solo.empty:
        return RateFactors(None, None, 0)
    def col(name: str) -> np.ndarray:
        return solo[name].to_numpy(dtype=float, na_value=np.nan)

    prompt, computed, server_ms = col("prompt_tokens"), col("prompt_n"), col("server_ms")
    idle = col("idle_s")
    out, decode_ms = col("output_tokens"), col("decode_ms")
    t0, t_first = col("t0"), col("t_first")
    # each call with a prompt timing: its prompt time at `costs` (s, no wake), its idle time,
    # its server-reported prompt time and its way there and back (ms; NaN: no first token)
    timed: list[tuple[float, float, float, float]] = []
    dec: list[float] = []
    for i in range(len(solo)):
        if math.isfinite(server_ms[i] + prompt[i] + computed[i]) and computed[i] > 0:
            timed.append((_prefill_s(costs, int(prompt[i] - computed[i]), int(computed[i]),
                                     per_pass), idle[i], server_ms[i],
                          (t_first[i] - t0[i]) / 1e6 - server_ms[i]))
        if math.isfinite(decode_ms[i] + out[i] + prompt[i]) and out[i] >= 2:
            # One iteration per token after the first (the prefill's), at its mean context.
            step = costs.decode_alpha + costs.decode_s(prompt[i] + out[i] / 2.0)
            dec.append(decode_ms[i] / 1e3 / ((out[i] - 1) * step))
    x, at_idle, srv, way = np.array(timed, dtype=float).reshape(-1, 4).T
    wake = np.array([costs.wake_after(v) for v in at_idle])  # an engine that idled wakes slower
    want = x + wake
    pre = [float(v) for v in srv[want > 0] / 1e3 / want[want > 0]]
    calls = int(min(len(pre), len(dec)))
    decode = float(np.median(dec)) if dec else None
    own = _own_wake(x, at_idle, srv, way, wake_curve_ms) if wake_curve_ms else None
    if own is not None:
        return replace(own, decode=decode, calls=calls)
    has_way = np.isfinite(way)
    way_wake = (np.zeros(int(has_way.sum())) if with_way is None else
                np.array([with_way.wake_after(v) for v in at_idle[has_way]]) - wake[has_way])
    lag = [float(v) for v in way[has_way] - way_wake * 1e3]
    return RateFactors(float(np.median(pre)) if pre else None, decode, calls,
                       max(0.0, float(np.median(lag))) if lag else None,
                       overhead_samples(lag), noise_from(pre))


def _own_wake(x: FloatArray, idle: FloatArray, server_ms: FloatArray, way_ms: FloatArray,
              curve_ms: tuple[tuple[float, float, float], ...]) -> RateFactors | None:
    """The prompt factor, the busy way and the run's own wake curve at `curve_ms`' idle times,
    fitted (harness.model.wake_fit) from the calls alone with a prompt timing: each one's
    prompt time at the calibration (`x`, s, no wake), idle time, server-reported prompt time and
    way there and back (ms; NaN where no first token came); decode and calls left to the
    caller. None where either fit has no call or fails."""
    gaps = np.array([g for g, _, _ in curve_ms]) / 1e3
    server = fit_wake(x, idle, server_ms / 1e3, gaps,
                      np.array([s for _, s, _ in curve_ms]) / 1e3, scaled=True)
    has_way = np.isfinite(way_ms)
    way_s = way_ms[has_way] / 1e3
    way = fit_wake(np.ones(len(way_s)), idle[has_way], way_s, gaps,
                   np.array([w for _, _, w in curve_ms]) / 1e3, scaled=False)
    if server is None or way is None or server.factor <= 0:
        return None
    predicted = server.factor * x + server.at(curve_weights(idle, gaps))
    pre = [float(v) for v in server_ms / 1e3 / predicted if v > 0 and math.isfinite(v)]
    lag = [float(v) for v in (way_s - way.at(curve_weights(idle[has_way], gaps))) * 1e3]
    return RateFactors(server.factor, None, 0,
                       max(0.0, float(np.median(lag))) if lag else None,
                       overhead_samples(lag), noise_from(pre),
                       tuple((float(g), s, w) for (g, _, _), s, w
                             in zip(curve_ms, _ms_rising(server.curve), _ms_rising(way.curve),
                                    strict=True)),
                       tuple(a and b for a, b in zip(server.fitted, way.fitted, strict=True)))


def _ms_rising(curve_s: tuple[float, ...]) -> list[float]:
    """A fitted curve in ms to 1e-4, non-decreasing (the solver's rounding taken out)."""
    return [round(float(v), 4) for v in np.maximum.accumulate(np.array(curve_s) * 1e3)]


SERVER_SPEED_JSON = "server_speed.json"


def server_speed(records: pd.DataFrame, cal: Calibration) -> RateFactors:
    """`rate_factors` of a replay's records against the iteration costs the simulator fits to
    `cal` (llama.cpp: prompts in micro-batches; vLLM, SGLang: in iterations of batch_tokens;
    a wake curve's server part alone: the server's prompt time holds no way to it; its way
    part comes out of the overheads)."""
    costs = cal.iteration_costs(way=False)
    slots = cal.engine_kind in (None, "llamacpp")
    return rate_factors(records, costs, costs.ubatch_tokens if slots else costs.batch_tokens,
                        cal.iteration_costs(), cal.wake_curve_ms)


def speed_doc(f: RateFactors, calibration: str) -> dict[str, Any]:
    """SERVER_SPEED_JSON: the factors, against which calibration, and what they mean."""
    return {**f.to_dict(), "calibration": calibration,
            "meaning": "the replay's calls that ran alone on the server: their server-reported "
                       "prompt (prefill) and decode times over what the calibration predicts "
                       "for them, median (> 1: the server computed slower than calibrated); "
                       "overhead_ms: their time to first token less the prompt time, median"}


def speed_line(policy: str, doc: dict[str, Any]) -> str:
    """One line of a bench's notes from a SERVER_SPEED_JSON document."""
    if not doc.get("calls"):
        return f"  {policy}: no call ran alone (nothing to compare)"
    parts = [f"{name} x{doc[key]:.2f}" for name, key in (("prompt", "prefill"),
                                                          ("decode", "decode"))
             if doc.get(key) is not None]
    if doc.get("overhead_ms") is not None:
        parts.append(f"overhead {doc['overhead_ms']:.1f} ms")
    curve, fitted_at = doc.get("wake_curve_ms") or [], doc.get("wake_fitted") or []
    fitted = [p for p, ok in zip(curve, fitted_at, strict=False) if ok]  # an older file: none
    if fitted:  # the longest idle time the run's own calls informed
        idle_ms, server_ms, way_ms = fitted[-1]
        parts.append(f"after {idle_ms / 1e3:g} s idle +{server_ms:.1f} ms server, "
                     f"+{way_ms:.1f} ms way")
    return f"  {policy}: {', '.join(parts)} ({doc['calls']} calls alone)"


def _scaled(points: tuple[tuple[int, float], ...], f: float) -> tuple[tuple[int, float], ...]:
    return tuple((c, r / f) for c, r in points)


def rescaled(cal: Calibration, f: RateFactors) -> Calibration:
    """`cal` with its prompt rates (prefill, append) divided by `f.prefill`, its decode rates
    by `f.decode` and its request overhead (median and distribution) the run's (a missing
    figure leaves the calibration's; the busy server's, `rate_factors`: the wake curve adds the
    way after idle time) and its wake curve the run's own where `f` has one (else the
    calibration's, whole); swap rates and sizes unchanged."""
    p = f.prefill or 1.0
    d = f.decode or 1.0
    return replace(cal, prefill_tok_s=cal.prefill_tok_s / p,
                   prefill_points=_scaled(cal.prefill_points, p),
                   append_points=_scaled(cal.append_points, p),
                   long_append_points=_scaled(cal.long_append_points, p),
                   decode_tok_s=cal.decode_tok_s / d,
                   decode_points=_scaled(cal.decode_points, d),
                   request_overhead_ms=(cal.request_overhead_ms if f.overhead_ms is None
                                        else f.overhead_ms),
                   request_overhead_samples_ms=(f.overhead_samples_ms
                                                  or cal.request_overhead_samples_ms),
                   iteration_noise_samples=f.noise_samples or cal.iteration_noise_samples,
                   wake_curve_ms=f.wake_curve_ms or cal.wake_curve_ms,
                   measured_at=f"{cal.measured_at} (rates rescaled to a run's: prefill x{p:.3f}"
                               f" time, decode x{d:.3f}"
                               f"{', its own wake curve' if f.wake_curve_ms else ''})")


def _in_flight(c: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each call of `c` (`_ended_calls`' columns, each with a first token): how many of the
    others were in flight when it was sent (started before it, strictly, and not yet ended), and
    how many of those were still before their first token. A call's first token comes after its
    start and no later than its end, so counts of starts, first tokens and ends up to the send
    give both."""
    t0 = c["t0"].to_numpy(dtype=np.int64)
    started_before = np.searchsorted(np.sort(t0), t0, side="left")
    ended_by = np.searchsorted(np.sort(c["t1"].to_numpy(dtype=np.int64)), t0, side="right")
    first_by = np.searchsorted(np.sort(c["t_first"].to_numpy(dtype=np.int64)), t0, side="right")
    return started_before - ended_by, started_before - first_by


def waits_by_company(records: pd.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """A call's time to first token less its server-reported prompt time (ms): the way to the
    engine and back plus any wait for the engine, split by whether another call was in flight
    when it was sent (`alone`, `shared`); each {n, p50, p95}, and `queue_p50`, `queue_p95`:
    of that wait, the time in the engine's queue as the server reports it (vLLM; None where it
    does not). In a simulated run it excludes the request overhead (spent before a simulated
    call starts)."""
    calls = _ended_calls(records)
    c = calls[calls["t_first"].notna()]
    busy = _in_flight(c)[0] > 0
    wait = _wait_ms(c)
    queue = c["engine_queue_ms"].to_numpy(dtype=float)
    out: dict[str, dict[str, float | int | None]] = {}
    for name, mask in (("alone", ~busy), ("shared", busy)):
        w = wait[mask & np.isfinite(wait)]
        q = queue[mask & np.isfinite(wait) & np.isfinite(queue)]
        out[name] = {"n": int(w.size), "p50": _pct(w, 50), "p95": _pct(w, 95),
                     "queue_p50": _pct(q, 50), "queue_p95": _pct(q, 95)}
    return out


def _wait_ms(c: pd.DataFrame) -> FloatArray:
    """Each call's time to first token less its server-reported prompt time (ms)."""
    t_first, t0 = c["t_first"].to_numpy(dtype=float), c["t0"].to_numpy(dtype=float)
    wait: FloatArray = (t_first - t0) / 1e6 - c["server_ms"].to_numpy(dtype=float)
    return wait


def _pct(x: FloatArray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def paired_ratios(real: pd.DataFrame, simulated: pd.DataFrame) -> dict[str, float | int | None]:
    """The server's own prompt and decode times of the same calls (trajectory, step) in a
    replay and its simulation: the median of measured over simulated, over the calls that
    completed in both with the same output length. Unlike `rate_factors` it needs no call
    alone (a server that is never idle), but it holds the model's batching too: ~1 where
    the rates held and the batches were modelled alike."""
    key = ["trajectory_id", "step"]
    cols = [*key, "server_ms", "decode_ms", "output_tokens"]

    def ok(records: pd.DataFrame) -> pd.DataFrame:
        calls = _ended_calls(records)
        return calls.loc[calls["status"] == "ok", cols]

    m = ok(real).merge(ok(simulated), on=key, suffixes=("_r", "_s"))
    m = m[m["output_tokens_r"] == m["output_tokens_s"]]
    out: dict[str, float | int | None] = {"calls": int(len(m))}
    for name, col in (("prompt", "server_ms"), ("decode", "decode_ms")):
        r = (m[f"{col}_r"] / m[f"{col}_s"]).to_numpy(dtype=float)
        r = r[np.isfinite(r) & (r > 0)]
        out[name] = float(np.median(r)) if r.size else None
    return out


IN_FLIGHT = ("alone", "decoding", "prompt")  # what was on the server when a call was sent


def waits_in_flight(records: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """A run's calls (ok, with a first token) grouped by what was in flight on the server when
    each was sent (`alone`: nothing; `decoding`: only calls past their first token; `prompt`: a
    call still before its first token): each group's {n, p50, p95} of the time to first token
    less the server's prompt time (ms). Each run by its own company: a simulation's calls meet
    other company than the same calls of the replay it simulates (its timeline drifts from the
    replay's), so pairing them by the replay's company compares different situations. In a
    simulated run the wait excludes the request overhead (spent before a call starts)."""
    c = _ended_calls(records)
    c = c[(c["status"] == "ok") & c["t_first"].notna()]
    on, before_first = _in_flight(c)
    group = np.where(before_first > 0, IN_FLIGHT[2], np.where(on > 0, IN_FLIGHT[1], IN_FLIGHT[0]))
    wait = _wait_ms(c)
    out: dict[str, dict[str, Any]] = {}
    for name in IN_FLIGHT:
        w = wait[(group == name) & np.isfinite(wait)]
        out[name] = {"n": int(w.size), "p50": _pct(w, 50), "p95": _pct(w, 95)}
    return out
