"""A run's own wake curve, fitted from its calls alone (harness.model.wake_fit)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.model.iteration import curve_at
from harness.model.run_rates import rate_factors, rescaled, server_speed
from harness.model.wake_fit import MAX_FIT_CALLS, curve_weights, fit_wake, l1_fit
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_run_rates import COSTS, call, frame
from tests.unit.test_simulate import CAL, llm, tool, trace

GAPS = np.array([0.01, 0.03, 0.3, 1.0, 3.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30),
       st.lists(st.floats(0.0, 100.0), min_size=5, max_size=5))
def test_the_weights_give_the_curve_the_simulator_interpolates(idle: list[float],
                                                                ys: list[float]) -> None:
    w = curve_weights(np.array(idle), GAPS)
    curve = tuple(zip(GAPS.tolist(), ys, strict=True))
    assert (w @ np.array(ys)) == pytest.approx([curve_at(curve, x) for x in idle], abs=1e-9)


def test_weights_by_hand() -> None:
    w = curve_weights(np.array([0.0, 0.005, 0.02, 0.3, 5.0]), GAPS)
    want = [[0, 0, 0, 0, 0], [0.5, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0], [0, 0, 1, 0, 0],
            [0, 0, 0, 0, 1]]
    assert np.allclose(w, np.array(want, dtype=float))


def test_the_l1_fit_is_the_medians() -> None:
    # a constant alone: the median of the values (any point between the middle two)
    x = np.ones((5, 1))
    got = l1_fit(x, np.array([1.0, 2.0, 3.0, 50.0, 90.0]), [(0.0, None)])
    assert got is not None and got[0] == pytest.approx(3.0)


def synthetic(p: float, curve: list[float], n_per: int = 8) -> tuple[np.ndarray, ...]:
    """Calls at idle times spread over every point's neighbourhood, prompt times varied."""
    idle = np.repeat([0.0, 0.005, 0.01, 0.02, 0.03, 0.1, 0.3, 0.6, 1.0, 2.0, 3.0, 6.0], n_per)
    x = 0.001 + 0.0005 * (np.arange(len(idle)) % 7)
    y = p * x + curve_weights(idle, GAPS) @ np.array(curve)
    return x, idle, y


def test_the_fit_recovers_a_prompt_factor_and_a_curve_exactly() -> None:
    curve = [0.001, 0.003, 0.008, 0.012, 0.020]
    x, idle, y = synthetic(1.7, curve)
    got = fit_wake(x, idle, y, GAPS, np.zeros(5), scaled=True)
    assert got is not None
    assert got.factor == pytest.approx(1.7, abs=1e-9)
    assert got.curve == pytest.approx(tuple(curve), abs=1e-9)
    assert got.fitted == (True,) * 5
    # the busy way: a constant and its curve
    way = fit_wake(x, idle, 0.004 + curve_weights(idle, GAPS) @ np.array(curve), GAPS,
                   np.zeros(5), scaled=False)
    assert way is not None and way.factor == pytest.approx(0.004, abs=1e-9)
    assert way.curve == pytest.approx(tuple(curve), abs=1e-9)


def test_a_long_run_is_thinned_and_still_fitted() -> None:
    curve = [0.001, 0.003, 0.008, 0.012, 0.020]
    x, idle, y = synthetic(1.3, curve, n_per=500)  # 6,000 calls
    assert len(y) > MAX_FIT_CALLS
    got = fit_wake(x, idle, y, GAPS, np.zeros(5), scaled=True)
    assert got is not None and got.factor == pytest.approx(1.3, abs=1e-9)
    assert got.curve == pytest.approx(tuple(curve), abs=1e-9)


def test_a_few_slow_calls_do_not_move_the_fit() -> None:
    curve = [0.001, 0.003, 0.008, 0.012, 0.020]
    x, idle, y = synthetic(1.0, curve, n_per=10)
    y = y.copy()
    y[::25] += 0.5  # one call in 25 half a second slower (the machine's hiccups)
    got = fit_wake(x, idle, y, GAPS, np.zeros(5), scaled=True)
    assert got is not None and got.factor == pytest.approx(1.0, abs=1e-6)
    assert got.curve == pytest.approx(tuple(curve), abs=1e-6)


def test_a_point_few_calls_inform_keeps_the_calibrations_value() -> None:
    # no call past 0.3 s of idle time: the 1-s and 3-s points have no support
    idle = np.repeat([0.0, 0.01, 0.02, 0.03, 0.3], 8)
    x = 0.001 + 0.0005 * (np.arange(len(idle)) % 7)
    known = np.array([0.5, 0.5, 0.5, 0.04, 0.07])
    true = np.array([0.001, 0.003, 0.008, 0.04, 0.07])
    got = fit_wake(x, idle, 2.0 * x + curve_weights(idle, GAPS) @ true, GAPS, known,
                   scaled=True)
    assert got is not None and got.fitted == (True, True, True, False, False)
    assert got.curve[3:] == (0.04, 0.07)
    assert got.factor == pytest.approx(2.0, abs=1e-9)
    assert got.curve[:3] == pytest.approx((0.001, 0.003, 0.008), abs=1e-9)


def test_the_fitted_curve_never_falls() -> None:
    # calls whose wake after 1 s was less than after 0.3 s: the fit holds the two points level
    # (a calibration's curve is non-decreasing), at a value between the two
    x, idle, _ = synthetic(1.0, [0.0] * 5)
    dip = curve_weights(idle, GAPS) @ np.array([0.001, 0.003, 0.010, 0.006, 0.020])
    got = fit_wake(x, idle, x + dip, GAPS, np.zeros(5), scaled=True)
    assert got is not None
    assert list(got.curve) == sorted(got.curve)
    assert got.curve[2] == pytest.approx(got.curve[3])
    assert 0.006 - 1e-9 <= got.curve[2] <= 0.010 + 1e-9


def test_no_call_fits_nothing() -> None:
    empty = np.zeros(0)
    assert fit_wake(empty, empty, empty, GAPS, np.zeros(5), scaled=True) is None


def test_a_runs_factors_carry_its_own_curve_and_the_rescaled_calibration_takes_it() -> None:
    # 40 calls alone, 100 tokens each (12 ms of prompt at COSTS), prompt x1.5, the server's
    # wake 2 ms after 10 ms of idle time and 6 after 30 or more; the way 5 ms busy, +3 / +9
    curve_ms = ((10.0, 9.0, 9.0), (30.0, 9.0, 9.0))  # the calibration's: another machine's
    calls = []
    t = 0.0
    for i in range(40):
        gap = (0.0, 5.0, 10.0, 20.0, 40.0)[i % 5] if i else 0.0
        t += gap
        wake_s = float(np.interp(gap, [0, 10, 30], [0, 2, 6]))
        way = 5.0 + float(np.interp(gap, [0, 10, 30], [0, 3, 9]))
        server = 1.5 * 12.0 + wake_s
        calls.append(call(f"t{i}", t, t + server + way + 10, server_ms=server,
                          ttft_ms=server + way))
        t += server + way + 10
    f = rate_factors(frame(*calls), COSTS, 512, None, curve_ms)
    assert f.prefill == pytest.approx(1.5, abs=1e-6)
    assert f.overhead_ms == pytest.approx(5.0, abs=1e-6)
    assert [list(p) for p in f.wake_curve_ms] == [pytest.approx([10.0, 2.0, 3.0], abs=1e-3),
                                                  pytest.approx([30.0, 6.0, 9.0], abs=1e-3)]
    assert f.wake_fitted == (True, True)
    assert f.noise_samples == pytest.approx((1.0,) * 40, abs=1e-6)
    cal = dataclasses.replace(CAL, wake_curve_ms=curve_ms)
    assert rescaled(cal, f).wake_curve_ms == f.wake_curve_ms
    assert "its own wake curve" in rescaled(cal, f).measured_at


def test_a_simulated_run_reads_back_its_calibrations_curve(tmp_path: Path) -> None:
    trajs = {f"t{i}": [llm(100 + 30 * i, 8), tool(0.05 + 0.4 * i), llm(40, 6), tool(1.0 + i),
                       llm(25, 9), tool(0.02 * i), llm(30, 4)] for i in range(8)}
    starts = {f"t{i}": 0.9 * i for i in range(8)}
    # llama.cpp's keep sends no request at a pause; on the engines the pause's control runs
    # after the call's end, which the simulated records stamp at the call's end (the idle time
    # the estimator reads there is longer by the control's time than the engine's)
    cal = dataclasses.replace(CAL, prefill_points=((64, 800.0), (512, 1200.0)),
                              engine="llamacpp", wake_curve_ms=((10.0, 1.0, 2.0),
                                                                (300.0, 4.0, 6.0),
                                                                (3000.0, 9.0, 20.0)))
    out = tmp_path / "run"
    run_simulation(SimOptions(trace(tmp_path, trajs, starts), "keep", {}, Capacity(slots=8,
                              ctx_per_slot=1024), None, Arrivals("closed", 8), 0, out,
                              write_summary=False), cal)
    f = server_speed(read_records(out), cal)
    assert f.calls > 0 and f.prefill == pytest.approx(1.0, abs=1e-6)
    for (_, server, _), (_, want, _), fitted in zip(f.wake_curve_ms, cal.wake_curve_ms,
                                                    f.wake_fitted, strict=True):
        if fitted:
            assert server == pytest.approx(want, abs=1e-3)
