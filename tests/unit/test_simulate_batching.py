"""The simulator's server: iteration costs fitted from a calibration, llama.cpp micro-batches,
requests and control tasks waiting for the running iteration, the replay's slot hand-off."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import InputError
from harness.model.calibration import Calibration, read_calibration
from harness.model.iteration import (
    APPEND_TOKENS,
    DECODE_CONTEXT,
    LONG_APPEND_TOKENS,
    IterationCosts,
    MeasuredRates,
    fit_costs,
    fit_iteration_costs,
    fit_paged_costs,
)
from harness.records.store import read_records
from harness.simulate.batch import slot_iteration_s
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, check_capacity, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import ALPHA, BETA, CAL, ev, llm, sim, t_s, tool, trace


def test_fit_recovers_the_costs_that_made_the_calibration() -> None:
    true = IterationCosts(alpha=0.02, beta=0.005, a_tiled=3e-6, a_row=25e-6)
    prefill = tuple((n, n / true.prefill_s(n)) for n in (128, 512, 1024, 2048))
    decode = tuple((c, 1 / (true.alpha + true.decode_s(c))) for c in (64, 512, 1024))
    step = true.alpha + true.decode_s(DECODE_CONTEXT)
    fit = fit_iteration_costs(prefill[-1][1], 1 / step, prefill, decode)
    for got, want in ((fit.alpha, 0.02), (fit.beta, 0.005), (fit.a_tiled, 3e-6),
                      (fit.a_row, 25e-6)):
        assert got == pytest.approx(want, rel=1e-6)
    # Without decode points the row path is not told apart: a_row = a_tiled, and the fit still
    # reproduces the measured prefill times and the decode step.
    fit2 = fit_iteration_costs(prefill[-1][1], 1 / step, prefill)
    assert fit2.a_row == fit2.a_tiled
    for n, rate in prefill:
        assert fit2.prefill_s(n) == pytest.approx(n / rate, rel=0.02)
    assert fit2.alpha + fit2.decode_s(DECODE_CONTEXT) == pytest.approx(step)
    # Append points tell the chunk row path (a_row) from the decode row (a_decode).
    both = IterationCosts(alpha=0.02, beta=0.005, a_tiled=3e-6, a_row=25e-6, a_decode=50e-6)
    decode = tuple((c, 1 / (both.alpha + both.decode_s(c))) for c in (64, 512, 1024))
    step = both.alpha + both.decode_s(DECODE_CONTEXT)
    prefill = tuple((n, n / both.prefill_s(n)) for n in (128, 512, 1024, 2048))
    append = tuple((c, APPEND_TOKENS / (both.alpha + both.chunk_s(c, APPEND_TOKENS)))
                   for c in (128, 1024))
    fit3 = fit_iteration_costs(prefill[-1][1], 1 / step, prefill, decode, append)
    for got, want in ((fit3.alpha, 0.02), (fit3.beta, 0.005), (fit3.a_tiled, 3e-6),
                      (fit3.a_row, 25e-6), (fit3.decode_cell, 50e-6)):
        assert got == pytest.approx(want, rel=1e-6)
    assert fit.a_decode is None and fit.decode_cell == fit.a_row
    # No points at all: the headline prefill rate prices every token.
    bare = fit_iteration_costs(1000.0, 100.0)
    assert (bare.alpha, bare.beta, bare.a_tiled) == pytest.approx((ALPHA, BETA, 0.0))


def test_paged_fit_recovers_the_costs_that_made_the_calibration() -> None:
    # vLLM-like: a smooth per-cell cost for every chunk and a read of the cached context,
    # decode steps cheaper than a prompt iteration; and SGLang-like: a term in the squared
    # context, decode steps dearer.
    for true in (IterationCosts(alpha=0.0027, beta=6e-6, a_tiled=15e-9, a_row=15e-9,
                                tiled_rows=1, a_decode=0.26e-6, a_context=0.6e-6,
                                alpha_decode=0.0024),
                 IterationCosts(alpha=0.003, beta=10e-6, a_tiled=12e-9, a_row=12e-9,
                                tiled_rows=1, a_decode=0.18e-6, a_context_sq=7e-9,
                                alpha_decode=0.005)):
        prefill = tuple((n, n / (true.alpha + true.chunk_s(0, n))) for n in (128, 512, 1024))
        append = tuple((c, APPEND_TOKENS / (true.alpha + true.chunk_s(c, APPEND_TOKENS)))
                       for c in (128, 512, 1024))
        long = tuple((c, LONG_APPEND_TOKENS / (true.alpha + true.chunk_s(c, LONG_APPEND_TOKENS)))
                     for c in (128, 512, 1024))
        decode = tuple((c, 1 / (true.decode_alpha + true.decode_s(c))) for c in (128, 512, 1024))
        fit = fit_paged_costs(decode[0][1], prefill, decode, append, long)
        for got, want in ((fit.alpha, true.alpha), (fit.beta, true.beta),
                          (fit.a_tiled, true.a_tiled), (fit.a_context, true.a_context),
                          (fit.a_context_sq, true.a_context_sq),
                          (fit.decode_cell, true.decode_cell),
                          (fit.decode_alpha, true.decode_alpha)):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-12)
        assert fit.tiled_rows == 1  # no row path: a 63-token chunk costs like a 64-token one
        # the calibration's own points come back, and fit_costs takes this fit for them
        assert fit_costs(MeasuredRates(prefill[-1][1], decode[0][1], prefill, decode, append,
                                       long)) == fit
        for c, rate in long:
            assert LONG_APPEND_TOKENS / (fit.alpha + fit.chunk_s(c, LONG_APPEND_TOKENS)) \
                == pytest.approx(rate, rel=1e-6)
    # without the long appends: the row/tiled fit, as before
    assert fit_costs(MeasuredRates(prefill[-1][1], decode[0][1], prefill, decode, append)) == \
        fit_iteration_costs(prefill[-1][1], decode[0][1], prefill, decode, append)


def test_llama_cpp_micro_batches() -> None:
    c = IterationCosts(alpha=1.0, beta=0.01, a_tiled=0.0, a_row=0.001)
    # Decode only: one forward pass per run of consecutive slot ids ({0, 1} and {3}).
    assert slot_iteration_s(c, [(0, 0.5), (1, 0.5), (3, 0.5)], []) == pytest.approx(2 + 1.5)
    # Slots 2, 3 decode; slots 0 and 1 start prompts of 308 and 630 tokens. Passes: {2, 3} one
    # token each; {0, 1} 256 each (tiled); {0, 1} 52 each (fewer than 64 rows: row by row, at
    # positions 256..307); {1} the last 322 (tiled).
    got = slot_iteration_s(c, [(2, 0.5), (3, 0.5)], [(0, 308, 0), (1, 630, 0)])
    row = 2 * 0.001 * (52 * 256 + 52 * 53 / 2)
    assert got == pytest.approx(4 * 1.0 + 2 * 0.5 + 938 * 0.01 + row)


def test_a_request_waits_for_the_running_iteration(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(1000, 2)], "b": [llm(10, 2)]}, starts={"a": 0.0, "b": 0.5})
    df, _ = sim(tmp_path, path, "keep", Capacity(tokens=10_000), arrivals=Arrivals("trace"))
    first_a = ALPHA + 1000 * BETA  # a's prompt alone
    assert t_s(df, "first_token", "a") == pytest.approx(first_a)
    # b arrived at 0.5, during a's prompt: it joins the next iteration, with a's decode token.
    assert t_s(df, "first_token", "b") == pytest.approx(first_a + ALPHA + 11 * BETA)
    assert t_s(df, "call_end", "a") == pytest.approx(first_a + ALPHA + 11 * BETA)
    # Its prompt time counts from that iteration's start, as llama.cpp's timings do.
    end_b = ev(df, "call_end", "b").iloc[0]
    assert end_b["server_ms"] == pytest.approx((ALPHA + 11 * BETA) * 1000)


def test_a_recompute_erase_waits_for_the_running_iteration(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(10, 2), tool(5.0), llm(5, 2)], "c": [llm(10, 40)],
                            "b": [llm(10, 2)]})
    df, _ = sim(tmp_path, path, "recompute", Capacity(slots=2, ctx_per_slot=1000),
                arrivals=Arrivals("closed", 3))
    pause = t_s(df, "pause_decision", "a")
    # c is decoding: the erase is served when the running decode step ends (one token of c).
    erase = ev(df, "erase", "a")
    assert erase["t_ns"].iloc[0] / 1e9 == pytest.approx(pause + ALPHA + BETA)
    assert t_s(df, "call_start", "b") == pytest.approx(pause + ALPHA + BETA)


@pytest.mark.parametrize("handoff, order", [("agent", ["x", "z", "y"]), ("fifo", ["x", "y", "z"])])
def test_slot_handoff_at_a_trajectory_end(tmp_path: Path, handoff: str, order: list[str]) -> None:
    path = trace(tmp_path, {k: [llm(10, 2)] for k in ("x", "y", "z")})
    out = tmp_path / handoff
    run_simulation(SimOptions(path, "keep", {}, check_capacity(None, 1, 100), None,
                              Arrivals("closed", 2), 0, out, write_summary=False,
                              slot_handoff=handoff), CAL)
    starts = ev(read_records(out), "call_start")
    assert starts["trajectory_id"].tolist() == order


def test_calibration_decode_points(tmp_path: Path) -> None:
    cal = Calibration(**{**CAL.__dict__, "decode_points": ((64, 30.0), (1024, 20.0))})
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(cal.to_dict()))
    assert read_calibration(p).decode_points == ((64, 30.0), (1024, 20.0))
    p.write_text(json.dumps(cal.to_dict() | {"decode_points": [[64, 30.0], [32, 20.0]]}))
    with pytest.raises(InputError, match="decode_points"):
        read_calibration(p)
    assert "decode_points" not in CAL.to_dict()


def test_unknown_slot_handoff_is_refused(tmp_path: Path) -> None:
    path = trace(tmp_path, {"x": [llm(10, 2)]})
    with pytest.raises(InputError, match="slot-handoff"):
        run_simulation(SimOptions(path, "keep", {}, check_capacity(None, 1, 100), None,
                                  Arrivals("closed", 1), 0, tmp_path / "o", slot_handoff="lifo"),
                                  CAL)


SGLANG = Capacity(tokens=4096, engine="sglang", block_size=1)


def call_ends(tmp: Path, trajs: dict[str, list[tuple[object, ...]]], cal: Calibration,
              cap: Capacity, seed: int = 0, name: str = "out") -> pd.DataFrame:
    """The call_end records of one closed-loop agent's keep-evictable simulation."""
    out = tmp / name
    run_simulation(SimOptions(trace(tmp, trajs), "keep-evictable", {}, cap, None,
                              Arrivals("closed", 1), seed, out, write_summary=False), cal)
    ends = read_records(out)
    return ends[ends["event"] == "call_end"].reset_index(drop=True)


def test_a_paged_engine_prices_a_resume_by_the_context_it_reads(tmp_path: Path) -> None:
    # A calibration fitted the paged way (a read of the cached context, a term in its square):
    # the engine model's prompt iteration of a resume served from the prefix cache costs
    # exactly alpha + chunk_s(cached, new), the resume with the cached context read included.
    true = IterationCosts(alpha=0.003, beta=1e-4, a_tiled=1e-7, a_row=1e-7, tiled_rows=1,
                          a_decode=1e-6, a_context=2e-5, a_context_sq=1e-7, alpha_decode=0.004)

    def rates(k: int | None, ctxs: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
        return tuple((c, (k or c) / (true.alpha + true.chunk_s(0 if k is None else c,
                                                               k or c))) for c in ctxs)

    decode = tuple((c, 1 / (true.decode_alpha + true.decode_s(c))) for c in (128, 512))
    cal = dataclasses.replace(CAL, prefill_points=rates(None, (128, 512)), decode_points=decode,
                              append_points=rates(APPEND_TOKENS, (128, 512)),
                              long_append_points=rates(LONG_APPEND_TOKENS, (128, 512)),
                              engine="vllm")
    resume = call_ends(tmp_path, {"a": [llm(200, 2), tool(1.0), llm(40, 2)]}, cal,
                       Capacity(tokens=4096, engine="vllm", block_size=16)).iloc[1]
    cached = int(resume["cached_tokens"])
    assert cached > 0  # served from the prefix cache
    new = 200 + 2 + 40 - cached
    assert resume["server_ms"] == pytest.approx((true.alpha + true.chunk_s(cached, new)) * 1e3,
                                                rel=1e-6)
    # the context read is what makes it dearer than the same tokens cold
    assert true.chunk_s(cached, new) > true.chunk_s(0, new) + cached * true.a_context
    # its one decode step after the first token: an iteration of decode tokens only
    decode_ms = (true.decode_alpha + true.decode_s(200 + 2 + 40 + 1)) * 1e3
    assert resume["decode_ms"] == pytest.approx(decode_ms, rel=1e-6)


def test_the_first_iteration_after_idle_time_pays_the_wake(tmp_path: Path) -> None:
    # CAL's costs (ALPHA + BETA per prompt token, no attention term) with a wake of 5 ms, time
    # constant 100 ms, on SGLang's engine (no control requests): the first call meets a server
    # idle since before the run (the whole wake); the resume, 50 ms of tool time after the
    # call's end, 5 (1 - e^-0.5) ms.
    cal = dataclasses.replace(CAL, wake_ms=5.0, wake_tau_ms=100.0, engine="sglang")
    ends = call_ends(tmp_path, {"a": [llm(10, 2), tool(0.05), llm(40, 2)]}, cal, SGLANG)
    first, resume = ends.iloc[0], ends.iloc[1]
    assert first["server_ms"] == pytest.approx((ALPHA + 10 * BETA + 0.005) * 1e3, rel=1e-9)
    wake = 0.005 * (1 - math.exp(-0.05 / 0.1))
    assert resume["server_ms"] == pytest.approx(
        (ALPHA + int(resume["prompt_n"]) * BETA + wake) * 1e3, rel=1e-9)
    # the decode step after the first token follows a prompt iteration: no wake
    assert resume["decode_ms"] == pytest.approx((ALPHA + BETA) * 1e3, rel=1e-9)


def test_a_measured_wake_curve_is_interpolated_in_the_idle_time(tmp_path: Path) -> None:
    # server part 1.5 ms after 10 ms of idle time, 4 ms after 100 ms and more; way part 0.5 and
    # 2 ms. The first call meets a server idle since before the run (past the curve): it
    # reaches the engine 2 ms after it is sent and its prompt takes 4 ms more; the resume, sent
    # 50 ms after the call's end (the server idle since), reaches it w = 0.5 + 1.5 (40 / 90) ms
    # later and its prompt, the server idle 50 + w ms by then, takes 1.5 + 2.5 ((40 + w) / 90)
    # ms more. The curve replaces the (wake, tau) form where both exist.
    cal = dataclasses.replace(CAL, wake_ms=50.0, wake_tau_ms=100.0, engine="sglang",
                              wake_curve_ms=((10.0, 1.5, 0.5), (100.0, 4.0, 2.0)))
    out = tmp_path / "out"
    run_simulation(SimOptions(trace(tmp_path, {"a": [llm(10, 2), tool(0.05), llm(40, 2)]}),
                              "keep-evictable", {}, SGLANG, None, Arrivals("closed", 1), 0, out,
                              write_summary=False), cal)
    df = read_records(out)
    ends = df[df["event"] == "call_end"].reset_index(drop=True)
    first, resume = ends.iloc[0], ends.iloc[1]
    assert t_s(df, "call_start", "a") == pytest.approx(0.002, abs=2e-9)
    assert first["server_ms"] == pytest.approx((ALPHA + 10 * BETA + 0.004) * 1e3, rel=1e-9)
    way = 0.0005 + 0.0015 * 40 / 90
    wake = 0.0015 + 0.0025 * (0.040 + way) / 0.090
    assert t_s(df, "call_start", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        way, abs=2e-9)
    assert resume["server_ms"] == pytest.approx(
        (ALPHA + int(resume["prompt_n"]) * BETA + wake) * 1e3, rel=1e-9)
    assert cal.iteration_costs(way=False).wake_after(0.05 + way) == pytest.approx(wake,
                                                                                 rel=1e-12)
    assert cal.iteration_costs().wake_after(0.05) == pytest.approx(0.002 + 0.004 * 40 / 90,
                                                                   rel=1e-12)
    assert resume["decode_ms"] == pytest.approx((ALPHA + BETA) * 1e3, rel=1e-9)


def test_the_ways_wake_delays_the_requests_on_it_not_the_engine(tmp_path: Path) -> None:
    # a way wake of 30 ms after 100 ms of idle time or more, no server part: a, sent first at 0
    # (the server idle since before the run), reaches the engine at 30; b, sent at 1 while the
    # way still wakes, with it; their prompts run together (30-59). c, sent at 40 while the
    # engine works, reaches it at once and waits only for that iteration (59-78). Had the wake
    # been the iteration's, a's prompt would have run 0-49 and b's and c's after it.
    cal = dataclasses.replace(CAL, engine="sglang", wake_curve_ms=((100.0, 0.0, 30.0),))
    out = tmp_path / "out"
    trajs = {"a": [llm(10, 1)], "b": [llm(10, 1)], "c": [llm(10, 1)]}
    run_simulation(SimOptions(trace(tmp_path, trajs, {"a": 0.0, "b": 0.001, "c": 0.040}),
                              "keep-evictable", {}, SGLANG, None, Arrivals("trace", 8, 1.0), 0,
                              out, write_summary=False), cal)
    df = read_records(out)
    both = 0.030 + ALPHA + 20 * BETA
    for tid in "ab":
        assert t_s(df, "call_start", tid) == pytest.approx(0.030, abs=2e-9)
        assert t_s(df, "first_token", tid) == pytest.approx(both, abs=2e-9)
    assert t_s(df, "call_start", "c") == pytest.approx(0.040, abs=2e-9)
    assert t_s(df, "first_token", "c") == pytest.approx(both + ALPHA + 10 * BETA, abs=2e-9)
    ends = df[df["event"] == "call_end"]
    assert ends["server_ms"].min() == pytest.approx((ALPHA + 10 * BETA) * 1e3, rel=1e-9)


def test_each_iteration_takes_a_drawn_factor_of_the_servers_spread(tmp_path: Path) -> None:
    # noise samples of 1 and 3: every iteration (each prompt, each decode run) takes one of
    # them, drawn by the seed; the same seed draws the same
    cal = dataclasses.replace(CAL, iteration_noise_samples=(1.0, 3.0), engine="sglang")
    trajs = {"a": [llm(10, 2), tool(0.05), llm(40, 2), tool(0.05), llm(20, 2)]}

    def run(seed: int, name: str) -> pd.DataFrame:
        return call_ends(tmp_path, trajs, cal, SGLANG, seed, name)

    ends = run(0, "a")
    factors = {round(float(e["server_ms"]) / ((ALPHA + int(e["prompt_n"]) * BETA) * 1e3), 9)
               for _, e in ends.iterrows()}
    factors |= {round(float(e["decode_ms"]) / ((ALPHA + BETA) * 1e3), 9)
                for _, e in ends.iterrows()}
    assert factors <= {1.0, 3.0}
    assert run(0, "b")[["server_ms", "decode_ms"]].equals(ends[["server_ms", "decode_ms"]])
    draws = [run(seed, f"s{seed}")["server_ms"].tolist() for seed in range(1, 6)]
    assert len({tuple(d) for d in draws}) > 1  # other seeds, other draws
