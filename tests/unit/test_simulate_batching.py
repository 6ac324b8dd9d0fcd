"""The simulator's server: iteration costs fitted from a calibration, llama.cpp micro-batches,
requests and control tasks waiting for the running iteration, the replay's slot hand-off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.model.calibration import Calibration, read_calibration
from harness.model.iteration import (
    APPEND_TOKENS,
    DECODE_CONTEXT,
    IterationCosts,
    fit_iteration_costs,
)
from harness.records.store import read_records
from harness.simulate.batch import slot_iteration_s
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
    run_simulation(path, "keep", {}, check_capacity(None, 1, 100), CAL, None,
                   Arrivals("closed", 2), 0, out, write_summary=False, slot_handoff=handoff)
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
        run_simulation(path, "keep", {}, check_capacity(None, 1, 100), CAL, None,
                       Arrivals("closed", 1), 0, tmp_path / "o", slot_handoff="lifo")
