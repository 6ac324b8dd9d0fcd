"""The server's speed during a run against its calibration (harness.model.run_rates)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.model.iteration import IterationCosts
from harness.model.run_rates import (
    RateFactors,
    paired_ratios,
    rate_factors,
    rescaled,
    server_speed,
    solo_calls,
    speed_doc,
    speed_line,
    waits_by_company,
    waits_in_flight,
)
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import CAL, llm, tool, trace

COSTS = IterationCosts(alpha=0.002, beta=0.0001, a_tiled=0.0, a_row=0.0)


def call(tid: str, t0: float, t1: float, *, prompt: int = 100, computed: int = 100,
         server_ms: float = 12.0, out: int = 11, decode_ms: float = 21.0,
         ttft_ms: float = 20.0, status: str = "ok",
         queue_ms: float | None = None) -> list[dict[str, Any]]:
    """A call's three events, times in ms (`queue_ms`: the server's report of its queue)."""
    base = {"trajectory_id": tid, "step": 0.0}
    return [{**base, "event": "call_start", "t_ns": int(t0 * 1e6), "prompt_tokens": prompt},
            {**base, "event": "first_token", "t_ns": int((t0 + ttft_ms) * 1e6)},
            {**base, "event": "call_end", "t_ns": int(t1 * 1e6), "status": status,
             "prompt_n": computed, "server_ms": server_ms, "output_tokens": out,
             "decode_ms": decode_ms, "prompt_tokens": None,
             "engine_queue_s": None if queue_ms is None else queue_ms / 1e3}]


def frame(*calls: list[dict[str, Any]]) -> pd.DataFrame:
    """A records table of these calls' events, numbered (seq) in time order as a run's are."""
    df = pd.DataFrame([e for c in calls for e in c]).sort_values("t_ns", kind="stable")
    return df.assign(seq=range(len(df))).reset_index(drop=True)


def test_only_calls_nothing_overlapped_are_alone() -> None:
    df = frame(call("a", 0, 50), call("b", 40, 90), call("c", 100, 150), call("d", 200, 400),
               call("e", 210, 220), call("f", 500, 550, status="error"))
    # a and b overlap; e lies inside d; f failed
    assert solo_calls(df)["trajectory_id"].tolist() == ["c"]


def test_factors_are_measured_over_predicted_time_of_calls_alone() -> None:
    # alone: 100 tokens predicted 2 + 10 = 12 ms of prompt; 10 tokens after the first, each
    # alpha + beta = 2.1 ms predicted: 21 ms
    df = frame(call("a", 0, 50, server_ms=24.0, decode_ms=63.0, ttft_ms=31.0),
               call("b", 100, 150, server_ms=24.0, decode_ms=63.0, ttft_ms=29.0),
               call("c", 200, 400), call("d", 210, 390, server_ms=99.0))  # overlapping
    f = rate_factors(df, COSTS, per_pass=512)
    assert (f.prefill, f.decode, f.calls, f.overhead_ms) == pytest.approx((2.0, 3.0, 2, 6.0))
    # the overhead's distribution: the two calls' own, ascending
    assert f.overhead_samples_ms == pytest.approx((5.0, 7.0))
    # the spread of their prompt factors around the median: none here
    assert f.noise_samples == (1.0, 1.0)


def test_a_resume_is_predicted_from_where_its_computed_tokens_start() -> None:
    with_attention = dataclasses.replace(COSTS, a_row=1e-6)
    # 20 tokens computed after 80 cached: alpha + 20 beta + a_row (20 * 80 + 20 * 21 / 2)
    want = 0.002 + 20 * 0.0001 + 1e-6 * (20 * 80 + 210)
    df = frame(call("a", 0, 50, prompt=100, computed=20, server_ms=want * 1e3 * 1.5))
    assert rate_factors(df, with_attention, per_pass=512).prefill == pytest.approx(1.5)


def control_end(tid: str, t: float, event: str = "kv_state",
                status: str | None = "evictable") -> list[dict[str, Any]]:
    """A server-side control's end at `t` ms (its record after the server answered)."""
    return [{"trajectory_id": tid, "event": event, "t_ns": int(t * 1e6), "status": status}]


def test_a_calls_idle_time_counts_from_the_servers_last_call_or_control() -> None:
    df = frame(call("a", 0, 50), control_end("a", 60),  # a's pause: a request to the server
               call("b", 100, 150), control_end("b", 155, "erase", None),
               control_end("b", 160, "kv_state", "active"),  # no request: the client's own
               call("c", 400, 450), control_end("a", 500, "kv_state", "paused"),
               control_end("c", 520, "swap_out", None), call("d", 600, 650))
    got = solo_calls(df)
    assert got["trajectory_id"].tolist() == ["a", "b", "c", "d"]
    # since the run's first call; since a's control (not a's end); since b's erase; since
    # c's swap (the later of two controls)
    assert got["idle_s"].tolist() == pytest.approx([0.0, 0.040, 0.245, 0.080])


def test_the_overhead_leaves_the_way_a_wake_curve_adds_after_idle_time() -> None:
    # a curve: 10 ms of idle time adds 1 ms to the server and 4 ms to the way; 5 ms half
    cal = dataclasses.replace(CAL, wake_curve_ms=((10.0, 1.0, 4.0),))
    server = cal.iteration_costs(way=False)
    # b after 5 ms of idle time: 20 ms to its first token less 12 ms of prompt, less 2 ms of
    # way: 6; a (the first call: no idle time) 8 ms
    df = frame(call("a", 0, 50, ttft_ms=20.0), call("b", 55, 100, ttft_ms=20.0))
    got = rate_factors(df, server, 512, cal.iteration_costs())
    assert got.overhead_samples_ms == pytest.approx((6.0, 8.0))
    assert rate_factors(df, server, 512).overhead_samples_ms == pytest.approx((8.0, 8.0))


def test_no_call_alone_gives_no_factors() -> None:
    df = frame(call("a", 0, 50), call("b", 40, 90))
    assert rate_factors(df, COSTS, per_pass=512) == RateFactors(None, None, 0)


def test_rescaled_divides_the_rates_and_takes_the_runs_overhead() -> None:
    cal = dataclasses.replace(CAL, prefill_points=((128, 1000.0),), append_points=((64, 500.0),),
                              decode_points=((64, 100.0), (512, 80.0)), request_overhead_ms=2.0)
    got = rescaled(cal, RateFactors(prefill=2.0, decode=4.0, calls=10, overhead_ms=7.0))
    assert (got.prefill_tok_s, got.prefill_points, got.append_points) == (
        500.0, ((128, 500.0),), ((64, 250.0),))
    assert (got.decode_tok_s, got.decode_points) == (25.0, ((64, 25.0), (512, 20.0)))
    assert got.request_overhead_ms == 7.0
    with_q = rescaled(cal, RateFactors(2.0, 4.0, 10, 7.0, (5.0, 7.0, 20.0), (0.8, 1.0, 1.5)))
    assert with_q.request_overhead_samples_ms == (5.0, 7.0, 20.0)
    assert with_q.iteration_noise_samples == (0.8, 1.0, 1.5)  # the run's own spread
    assert got.iteration_noise_samples == ()  # none measured: none taken
    assert (got.swap_in_bytes_per_s, got.kv_bytes_per_token) == (cal.swap_in_bytes_per_s,
                                                                  cal.kv_bytes_per_token)
    same = rescaled(cal, RateFactors(None, None, 0))
    assert (same.prefill_tok_s, same.decode_tok_s, same.request_overhead_ms) == (1000.0, 100.0,
                                                                                 2.0)
    # a wake curve stays whole: the run's overheads are the busy server's (rate_factors takes
    # the curve's way part out of them), the curve adds the way after idle time per call
    curved = dataclasses.replace(cal, wake_curve_ms=((30.0, 2.0, 1.0), (3000.0, 20.0, 50.0)))
    assert rescaled(curved, RateFactors(2.0, 4.0, 10, 7.0)).wake_curve_ms == (
        (30.0, 2.0, 1.0), (3000.0, 20.0, 50.0))


def test_the_wake_curves_server_part_alone_is_what_a_servers_prompt_time_holds() -> None:
    # 10 ms of idle time before the call: the server part +1 ms, the way +4 ms; the server's
    # prompt time holds only the first
    cal = dataclasses.replace(CAL, wake_curve_ms=((10.0, 1.0, 4.0),))
    costs = cal.iteration_costs(way=False)
    assert costs.wake_after(0.01) == pytest.approx(0.001)
    assert cal.iteration_costs().wake_after(0.01) == pytest.approx(0.005)
    assert costs.wake_after(0.005) == pytest.approx(0.0005)  # halfway: half of it


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
def test_a_simulated_run_reads_back_at_its_own_calibration(tmp_path: Path, engine: str) -> None:
    # Staggered agents, so that some calls run alone and some share iterations.
    trajs = {f"t{i}": [llm(100 + 30 * i, 8), tool(0.5 + 0.3 * i), llm(40, 6), tool(1.0),
                       llm(25, 9)] for i in range(6)}
    starts = {f"t{i}": 0.7 * i for i in range(6)}
    cap = (Capacity(slots=4, ctx_per_slot=1024) if engine == "llamacpp" else
           Capacity(tokens=4096, engine=engine, block_size=16))
    cal = dataclasses.replace(CAL, prefill_points=((64, 800.0), (512, 1200.0)), engine=engine)
    if engine == "sglang":  # the first iteration after idle time slower: read back too
        cal = dataclasses.replace(cal, wake_ms=20.0, wake_tau_ms=300.0)
    out = tmp_path / "run"
    run_simulation(SimOptions(trace(tmp_path, trajs, starts), "keep", {}, cap, None,
                              Arrivals("closed", 6), 0, out, write_summary=False), cal)
    f = server_speed(read_records(out), cal)
    assert f.calls > 0
    assert f.prefill == pytest.approx(1.0) and f.decode == pytest.approx(1.0)
    # at another calibration's rates the same records read as that much slower
    fast = dataclasses.replace(cal, prefill_tok_s=2 * cal.prefill_tok_s,
                               prefill_points=tuple((c, 2 * r) for c, r in cal.prefill_points),
                               decode_tok_s=3 * cal.decode_tok_s)
    g = server_speed(read_records(out), fast)
    assert g.decode == pytest.approx(3.0)
    assert g.prefill is not None and g.prefill > 1.5


def test_the_speed_line_names_each_factor_and_the_calls() -> None:
    doc = speed_doc(RateFactors(2.26, 2.34, 216, 6.8), "cal.json")
    assert doc["calibration"] == "cal.json" and "meaning" in doc
    assert speed_line("keep", doc) == ("  keep: prompt x2.26, decode x2.34, overhead 6.8 ms "
                                       "(216 calls alone)")
    assert "no call ran alone" in speed_line("keep", speed_doc(RateFactors(None, None, 0), "c"))
    # a run's own wake: the longest idle time its calls informed
    own = RateFactors(1.0, 1.0, 9, 2.0, wake_curve_ms=((10.0, 1.0, 2.0), (1000.0, 8.0, 12.5),
                                                       (3000.0, 9.0, 20.0)),
                      wake_fitted=(True, True, False))
    assert speed_line("keep", speed_doc(own, "c")) == (
        "  keep: prompt x1.00, decode x1.00, overhead 2.0 ms, after 1 s idle +8.0 ms server, "
        "+12.5 ms way (9 calls alone)")


def test_waits_are_split_by_whether_another_call_was_in_flight() -> None:
    df = frame(call("a", 0, 50, ttft_ms=20.0, server_ms=12.0),  # alone when sent: 8 ms
               call("b", 40, 90, ttft_ms=30.0, server_ms=10.0),  # a in flight: 20 ms
               call("c", 100, 150, ttft_ms=15.0, server_ms=12.0))  # a and b ended: 3 ms
    got = waits_by_company(df)
    assert got["alone"] == {"n": 2, "p50": pytest.approx(5.5), "p95": pytest.approx(7.75),
                            "queue_p50": None, "queue_p95": None}
    assert got["shared"] == {"n": 1, "p50": pytest.approx(20.0), "p95": pytest.approx(20.0),
                             "queue_p50": None, "queue_p95": None}


def test_waits_name_the_part_the_server_says_was_its_queue() -> None:
    df = frame(call("a", 0, 50, ttft_ms=20.0, server_ms=12.0, queue_ms=1.0),
               call("b", 40, 90, ttft_ms=30.0, server_ms=10.0, queue_ms=9.0),
               call("c", 100, 150, ttft_ms=15.0, server_ms=12.0, queue_ms=2.0))
    got = waits_by_company(df)
    assert (got["alone"]["queue_p50"], got["alone"]["queue_p95"]) == (
        pytest.approx(1.5), pytest.approx(1.95))
    assert (got["shared"]["queue_p50"], got["shared"]["queue_p95"]) == (9.0, 9.0)


def test_paired_ratios_compare_the_same_calls_server_times() -> None:
    real = frame(call("a", 0, 50, server_ms=20.0, decode_ms=40.0),
                 call("b", 40, 90, server_ms=30.0, decode_ms=30.0, out=5),
                 call("c", 100, 150, server_ms=12.0, decode_ms=21.0, status="error"))
    sim = frame(call("a", 0, 45, server_ms=10.0, decode_ms=20.0),
                call("b", 40, 80, server_ms=10.0, decode_ms=10.0, out=6),  # another length
                call("c", 100, 150, server_ms=6.0, decode_ms=7.0))
    assert paired_ratios(real, sim) == {"calls": 1, "prompt": 2.0, "decode": 2.0}


def test_waits_are_grouped_by_what_was_in_flight_in_each_run() -> None:
    # a alone; b sent while a decodes (a's first token at 20 ms); c sent while d's prompt runs
    real = frame(call("a", 0, 50, ttft_ms=20.0, server_ms=12.0),          # 8 ms
                 call("b", 30, 80, ttft_ms=25.0, server_ms=10.0),         # 15 ms
                 call("d", 100, 160, ttft_ms=30.0, server_ms=20.0),       # 10 ms
                 call("c", 110, 150, ttft_ms=40.0, server_ms=12.0),       # 28 ms
                 call("e", 200, 250, ttft_ms=20.0, server_ms=12.0, status="error"))
    got = waits_in_flight(real)
    assert got["alone"] == {"n": 2, "p50": pytest.approx(9.0),
                            "p95": pytest.approx(9.9)}  # a and d; e failed
    assert got["decoding"] == {"n": 1, "p50": pytest.approx(15.0), "p95": pytest.approx(15.0)}
    assert got["prompt"] == {"n": 1, "p50": pytest.approx(28.0), "p95": pytest.approx(28.0)}
    # a run whose calls all ran alone: the other groups are empty
    apart = waits_in_flight(frame(call("a", 0, 50, ttft_ms=20.0, server_ms=12.0),
                                  call("b", 100, 150, ttft_ms=13.0, server_ms=10.0)))
    assert apart["alone"]["n"] == 2
    assert apart["prompt"] == {"n": 0, "p50": None, "p95": None}

