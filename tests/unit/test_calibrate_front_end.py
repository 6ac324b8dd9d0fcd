"""The front end's figures from its measured times (harness.calibrate.front_end.figures), and
the calibration keys that carry them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.calibrate.front_end import FrontEndTimes, figures
from harness.errors import InputError
from harness.model.calibration import Calibration, read_calibration, write_calibration
from harness.model.iteration import IterationCosts
from tests.unit.test_simulate import CAL

# CAL's fitted costs: alpha = decode alpha = 9 ms, beta = 1 ms per token, no attention term
COSTS: IterationCosts = CAL.iteration_costs(way=False)
TIMES = FrontEndTimes(single_wait_ms=6.0, burst_wait_ms=36.0, burst=16, step_one_ms=10.0,
                      step_streams_ms=14.0, streams=4, stream_context=136, step_busy_ms=20.0,
                      tiny_rate=100.0, tiny_prompt_n=1)


def test_figures_take_the_engines_own_work_out() -> None:
    turn, cpu, stream = figures(TIMES, COSTS)
    # the burst's last answer waited 30 ms more over 15 more requests
    assert turn == 2.0
    # the step rose 4 ms over 3 more calls; the engine's own decode token costs 1 ms
    assert stream == pytest.approx(0.3333)
    # the steps lost 30% of the time to 100 requests a second: 3 ms each, of which the engine's
    # own work is 2 ms (2 tokens at 1 ms, no extra fixed cost for a prompt iteration)
    assert cpu == pytest.approx(1.0)


def test_figures_are_never_negative() -> None:
    quiet = replace(TIMES, burst_wait_ms=5.0, step_streams_ms=10.0, step_busy_ms=10.0)
    assert figures(quiet, COSTS) == (0.0, 0.0, 0.0)
    assert figures(replace(TIMES, tiny_rate=0.0), COSTS)[1] == 0.0


def test_the_calibration_carries_them(tmp_path: Path) -> None:
    cal = replace(CAL, front_end_ms=1.37, front_end_cpu_ms=2.2, stream_token_ms=0.125)
    path = write_calibration(tmp_path / "c.json", cal)
    again = read_calibration(path)
    assert (again.front_end_ms, again.front_end_cpu_ms, again.stream_token_ms) == \
        (1.37, 2.2, 0.125)
    plain = json.loads(write_calibration(tmp_path / "p.json", CAL).read_text())
    assert not {"front_end_ms", "front_end_cpu_ms", "stream_token_ms"} & set(plain)


@pytest.mark.parametrize("key", ["front_end_ms", "front_end_cpu_ms", "stream_token_ms"])
def test_a_bad_front_end_figure_is_named(key: str) -> None:
    data = {**CAL.to_dict(), key: -1.0}
    with pytest.raises(InputError, match=f"c.json: {key} must be a finite number >= 0"):
        Calibration.from_dict(data, "c.json")
