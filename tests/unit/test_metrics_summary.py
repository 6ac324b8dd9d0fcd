"""summarize(): exact values on hand-built record tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from records_factory import KV_BPT, Records, default_run

from harness.errors import InputError
from harness.metrics.summary import SUMMARY_KEYS, summarize_dir
from harness.metrics.summary import summarize as summarize_manifest
from harness.metrics.summary_types import Summary
from harness.records.manifest import RunManifest


def summarize(records: pd.DataFrame, run: dict[str, Any], *args: Any, **kw: Any
              ) -> Summary:
    """summarize() with the run given as run.json's content."""
    return summarize_manifest(records, RunManifest.from_dict(run), *args, **kw)

approx = pytest.approx


def keep_run() -> Records:
    """One trajectory: call, 5 s keep of 4096 tokens, resumed call 50 ms TTFT."""
    b = Records()
    t = b.agent("a")
    t.call(ttft=0.1, decode=0.4, appended=100, out=10, decode_ms=360.0)
    t.tool(wait=5.0, action="keep", retained=4096, cls="sandbox")
    t.call(ttft=0.05, decode=0.2, appended=20, out=5, cached=4096)
    t.end()
    return b


def test_keep_run_exact_values() -> None:
    s = summarize(keep_run().frame(), default_run(), None)
    assert s["runtime"] == "llama.cpp" and s["policy"] == "keep"
    assert s["trajectories"] == {"total": 1, "succeeded": 1, "cancelled": 0, "failed": 0,
                                 "interrupted": 0, "slo_violating": 0, "incomplete": 0}
    r = s["resume_latency_ms"]
    assert r["n"] == 1 and r["p50"] == approx(50.0) and r["p99"] == approx(50.0)
    assert r["ci95"] == {"p50": None, "p95": None, "p99": None}
    assert s["resume_parts_ms"]["restore"]["p50"] == approx(0.0)
    assert s["resume_parts_ms"]["queue"]["p50"] == approx(0.0)
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(50.0)
    assert s["ttft_ms"]["n"] == 2 and s["ttft_ms"]["p50"] == approx(75.0)
    assert s["e2e_ms"]["p50"] == approx(375.0)
    # tpot: (400 ms / 9) and (200 ms / 4); itl from decode_ms 360/9 = 40 and fallback 50
    assert s["tpot_ms"]["p50"] == approx((400 / 9 + 50) / 2)
    assert s["itl_ms"]["p50"] == approx(45.0)
    assert s["duration_s"] == approx(5.75)
    assert s["request_throughput_per_s"] == approx(2 / 5.75)
    assert s["output_token_throughput_per_s"] == approx(15 / 5.75)
    # 4096 tokens x 36864 B/token paused 5 s = 144 MiB x 5 s
    assert s["memory_time_mib_s"] == approx(720.0)
    assert s["memory_time_token_s"] == approx(4096 * 5.0)
    assert s["kv_paused_peak_tokens"] == 4096
    assert s["kv_paused_mean_tokens"] == approx(4096 * 5 / 5.75)
    assert s["kv_active_peak_tokens"] == 130
    assert s["kv_active_mean_tokens"] == approx((100 * 0.5 + 130 * 0.25) / 5.75)
    assert s["goodput_per_min"] == approx(60 / 5.75)
    assert s["tokens_recomputed"] == 0 and s["bytes_moved"] == 0
    assert s["cache_mismatches"] == 0 and s["cache_mismatch_list"] == []
    assert s["bystander_ttft_ms"]["n"] == 0 and s["bystander_ttft_ms"]["p50"] is None
    assert s["by_tool_class"]["sandbox"]["pauses"] == 1
    assert s["by_tool_class"]["sandbox"]["memory_time_mib_s"] == approx(720.0)
    assert s["by_tool_class"]["sandbox"]["resume_latency_ms"]["p50"] == approx(50.0)
    assert s["by_pause_bucket"]["1-10s"]["pauses"] == 1
    assert s["by_pause_bucket"]["<0.1s"]["pauses"] == 0
    assert s["server_occupancy"] is None
    assert s["pause_actions"] == {"keep": 1}
    assert tuple(s) == SUMMARY_KEYS
    json.dumps(s.to_json(), allow_nan=False)  # JSON-ready, no NaN


def test_swap_resume_parts_and_bytes() -> None:
    b = Records()
    t = b.agent("a")
    t.call(appended=4086, out=10)
    nbytes = 4096 * KV_BPT
    t.tool(wait=2.0, action="swap", retained=4096, swap_bytes=nbytes, swap_out_ms=17.6,
           swap_in_ms=17.6)
    t.call(ttft=0.03, appended=20, cached=4096).end()
    s = summarize(b.frame(), default_run(policy="swap"), None)
    assert s["resume_latency_ms"]["p50"] == approx(47.6)
    assert s["resume_parts_ms"]["restore"]["p50"] == approx(17.6)
    assert s["resume_parts_ms"]["queue"]["p50"] == approx(0.0, abs=1e-6)
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(30.0)
    assert s["bytes_moved"] == 2 * nbytes == 288 * 2**20
    assert s["memory_time_mib_s"] == 0.0
    assert s["cache_mismatches"] == 0


def test_recompute_restore_share_and_tokens() -> None:
    b = Records()
    t = b.agent("a")
    t.call(appended=4086, out=10)
    t.tool(wait=1.0, action="recompute", retained=4096)
    # 4116 tokens prefilled in 205.8 ms (20,000 tok/s): 4096 of them are the recomputed context
    t.call(ttft=0.21, appended=20, cached=0, server_ms=205.8).end()
    s = summarize(b.frame(), default_run(policy="recompute"), None)
    assert s["tokens_recomputed"] == 4096
    assert s["resume_latency_ms"]["p50"] == approx(210.0)
    assert s["resume_parts_ms"]["restore"]["p50"] == approx(204.8)
    # the server's own prompt time for the 20 new tokens: 205.8 - 204.8 = 1.0 ms; the other
    # 4.2 ms up to the first token are the server's wait (its queue) and delivery
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(1.0)
    assert s["resume_parts_ms"]["server_wait"]["p50"] == approx(4.2)
    assert s["cache_mismatches"] == 0


def test_without_a_reported_prompt_time_prefill_is_the_remainder() -> None:
    b = Records()
    t = b.agent("a")
    t.call(appended=100, out=10)
    t.tool(wait=1.0, action="keep")
    t.call(ttft=0.03, appended=20, cached=110, server_ms=None).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(30.0)
    assert s["resume_parts_ms"]["server_wait"]["n"] == 0
    assert s["resume_parts_ms"]["engine_queue"]["n"] == 0


def test_the_engines_reported_queue_time_is_a_part_of_the_server_wait() -> None:
    # 30 ms to the first token: 12 ms of reported prompt time; of the 18 ms before it, the
    # server says 5.5 were spent in its engine's queue (the rest: the way there and back)
    b = Records()
    t = b.agent("a")
    t.call(appended=100, out=10, queue_ms=0.5)
    t.tool(wait=1.0, action="keep")
    t.call(ttft=0.03, appended=20, cached=110, server_ms=12.0, queue_ms=5.5).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["resume_parts_ms"]["server_wait"]["p50"] == approx(18.0)
    assert s["resume_parts_ms"]["engine_queue"]["p50"] == approx(5.5)
    assert s["resume_parts_ms"]["engine_queue"]["n"] == 1  # resumed calls only


def test_queue_part_from_slot_wait() -> None:
    b = Records()
    t = b.agent("a")
    t.call().tool(wait=0.5, action="keep", queue=0.25).call(ttft=0.1).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["resume_latency_ms"]["p50"] == approx(350.0)
    assert s["resume_parts_ms"]["queue"]["p50"] == approx(250.0)
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(100.0)


def test_client_lag_is_reported_apart_from_resume_latency() -> None:
    """tool_end is stamped when the harness woke (t_ns), planned_ns when the tool was due:
    resume latency runs from the wake, the difference is client lag, warned about over 1 ms."""
    b = Records()
    b.agent("a").call().tool(wait=0.5, lag=0.004).call(ttft=0.1).end()
    b.agent("b").call().tool(wait=0.5, lag=0.0002).call(ttft=0.1).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["resume_latency_ms"]["p50"] == approx(100.0)
    assert s["client_lag_ms"]["n"] == 2
    assert s["client_lag_ms"]["p50"] == approx(2.1)
    assert s["client_lag_ms"]["p99"] == approx(0.2 + 0.99 * 3.8)
    assert len(s["warnings"]) == 1 and s["warnings"][0].startswith("client lag P99 4.0 ms")
    quiet = Records()
    quiet.agent("a").call().tool(wait=0.5, lag=0.0005).call(ttft=0.1).end()
    assert summarize(quiet.frame(), default_run(), None)["warnings"] == []


def test_records_without_planned_tool_ends_have_no_client_lag() -> None:
    s = summarize(keep_run().frame(), default_run(), None)
    assert s["client_lag_ms"] == {"n": 0, "p50": None, "p95": None, "p99": None}
    assert s["warnings"] == []


@pytest.mark.parametrize(
    ("action", "cached", "kw", "mismatch"),
    [
        ("keep", 4000, {}, True),         # below 4096 - max(16, 2% = 81.92)
        ("keep", 4020, {}, False),
        ("swap", 0, {"swap_bytes": 1}, True),
        ("recompute", 100, {}, True),     # above 16
        ("recompute", 10, {}, False),
        ("ttl", 4096, {"ttl_expire_after": 0.5}, True),   # erased: should reuse nothing
        ("ttl", 4096, {"ttl_expire_after": 0.5, "ttl_after": "swap", "swap_bytes": 1},
         False),                                           # swapped out, restored: reuse
        ("ttl", 0, {"ttl_expire_after": 0.5, "ttl_after": "swap", "swap_bytes": 1}, True),
        ("ttl", 0, {}, True),                              # still held: should reuse
        ("ttl", 4096, {}, False),
    ],
)
def test_cache_mismatches(action: str, cached: int, kw: dict[str, Any], mismatch: bool) -> None:
    b = Records()
    t = b.agent("a")
    t.call(appended=4086, out=10).tool(wait=1.0, action=action, retained=4096, **kw)
    t.call(cached=cached).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["cache_mismatches"] == int(mismatch)
    if mismatch:
        (m,) = s["cache_mismatch_list"]
        assert m["trajectory_id"] == "a" and m["step"] == 1 and m["action"] == action
        assert m["retained_tokens"] == 4096 and m["cached_tokens"] == cached


def test_mismatch_tolerance_is_a_parameter() -> None:
    b = Records()
    t = b.agent("a")
    t.call(appended=4086, out=10).tool(action="recompute", retained=4096).call(cached=100).end()
    assert summarize(b.frame(), {}, None, mismatch_abs_tokens=128)["cache_mismatches"] == 0


def test_mismatch_list_is_capped() -> None:
    b = Records()
    for i in range(60):
        b.agent(f"a{i}").call().tool(action="keep", retained=500).call(cached=0).end()
    s = summarize(b.frame(), {}, None)
    assert s["cache_mismatches"] == 60 and len(s["cache_mismatch_list"]) == 50


def test_zero_pauses() -> None:
    b = Records()
    b.agent("a").call(ttft=0.2, decode=0.8, out=1).end()
    s = summarize(b.frame(), default_run(), None)
    assert s["resume_latency_ms"]["n"] == 0 and s["resume_latency_ms"]["p50"] is None
    assert s["resume_parts_ms"]["restore"]["n"] == 0
    assert s["tpot_ms"]["n"] == 0  # one output token: no inter-token gap
    assert s["ttft_ms"]["p50"] == approx(200.0)
    assert s["memory_time_mib_s"] == 0.0 and s["pauses"] == 0
    assert s["by_tool_class"] == {}
    assert all(v["pauses"] == 0 for v in s["by_pause_bucket"].values())
    assert s["goodput_per_min"] == approx(60.0)


def test_all_cancelled() -> None:
    b = Records()
    for i in range(3):
        t = b.agent(f"a{i}", at=float(i))
        t.call().tool(wait=10.0, action="keep", status="abandoned").cancel()
    s = summarize(b.frame(), default_run(), None)
    assert s["trajectories"]["total"] == 3 and s["trajectories"]["cancelled"] == 3
    assert s["trajectories"]["succeeded"] == 0 and s["goodput_per_min"] == 0.0
    assert s["resume_latency_ms"]["n"] == 0
    assert s["by_pause_bucket"]["10-60s"]["pauses"] == 3
    assert s["by_tool_class"]["remote_read"]["resume_latency_ms"]["n"] == 0


def test_failed_and_incomplete() -> None:
    b = Records()
    b.agent("f").call(status="error", ttft=None).end("failed")
    b.agent("i").call()
    s = summarize(b.frame(), {}, None)
    assert s["trajectories"]["failed"] == 1 and s["trajectories"]["incomplete"] == 1
    assert s["e2e_ms"]["n"] == 1  # only the ok call


def test_bystander_only() -> None:
    b = Records()
    b.bystander("bystander-0", at=0.0, ttft=0.1, decode=0.5)
    b.bystander("bystander-1", at=1.0, ttft=0.3, decode=0.5)
    s = summarize(b.frame(), {}, None)
    assert s["trajectories"]["total"] == 0
    assert s["bystander_ttft_ms"]["n"] == 2 and s["bystander_ttft_ms"]["p50"] == approx(200.0)
    assert s["ttft_ms"]["n"] == 0
    assert s["request_throughput_per_s"] == approx(2 / 1.8)
    assert s["goodput_per_min"] == 0.0


def test_empty_records_and_missing_run_keys() -> None:
    s = summarize(Records().frame(), {}, None)
    assert s["trajectories"]["total"] == 0 and s["duration_s"] == 0.0
    assert s["goodput_per_min"] is None and s["request_throughput_per_s"] is None
    assert s["runtime"] is None and s["memory_time_mib_s"] is None
    assert s["memory_time_token_s"] == 0.0


def test_unknown_bytes_per_token_gives_token_seconds_only() -> None:
    s = summarize(keep_run().frame(), {"model": {"name": "m"}}, None)
    assert s["memory_time_mib_s"] is None and s["memory_time_token_s"] == approx(20480.0)
    assert s["by_tool_class"]["sandbox"]["memory_time_mib_s"] is None


def test_missing_columns_are_tolerated() -> None:
    df = keep_run().frame().drop(columns=["decode_ms", "detail", "deadline_s"])
    s = summarize(df, default_run(), None)
    assert s["itl_ms"]["n"] == 2 and s["memory_time_mib_s"] == approx(720.0)


def test_shuffled_rows_are_ordered_by_seq() -> None:
    df = keep_run().frame().sample(frac=1.0, random_state=3)
    assert summarize(df, default_run(), None)["resume_latency_ms"]["p50"] == approx(50.0)


def test_slo_violations_and_goodput() -> None:
    s = summarize(keep_run().frame(), default_run(), None, slo={"resume_ms": 40})
    assert s["trajectories"]["slo_violating"] == 1 and s["trajectories"]["succeeded"] == 0
    assert s["goodput_per_min"] == 0.0
    ok = summarize(keep_run().frame(), default_run(), None, slo={"ttft_ms": 100, "e2e_ms": 500,
                                                                "trajectory_s": 6})
    assert ok["trajectories"]["succeeded"] == 1
    assert summarize(keep_run().frame(), {}, None, slo={"trajectory_s": 5})[
        "trajectories"]["slo_violating"] == 1
    with pytest.raises(InputError, match="unknown SLO"):
        summarize(keep_run().frame(), {}, None, slo={"bogus": 1})


def test_pause_buckets_by_actual_wait() -> None:
    b = Records()
    t = b.agent("a")
    t.call()
    for w in (0.05, 0.5, 5.0, 20.0, 90.0):
        t.tool(wait=w, action="keep", planned=1.0).call(ttft=0.01)
    t.end()
    s = summarize(b.frame(), default_run(), None)
    assert [v["pauses"] for v in s["by_pause_bucket"].values()] == [1, 1, 1, 1, 1]
    assert list(s["by_pause_bucket"]) == ["<0.1s", "0.1-1s", "1-10s", "10-60s", ">=60s"]
    assert s["by_pause_bucket"]["10-60s"]["wait_s"]["p50"] == approx(20.0)
    assert s["resume_latency_ms"]["n"] == 5 and s["resume_latency_ms"]["p50"] == approx(10.0)
    ci = s["resume_latency_ms"]["ci95"]["p50"]
    assert ci == [approx(10.0), approx(10.0)]


def test_two_agents_peaks_and_means() -> None:
    b = Records()
    b.agent("a", at=0.0).call(appended=100, out=0, ttft=0.1, decode=0.4).tool(
        wait=5.0, action="keep", retained=1000).call(appended=20, ttft=0.05, decode=0.2).end()
    b.agent("b", at=1.0).call(appended=200, out=0).tool(wait=2.0, action="keep",
                                                        retained=300).call(appended=10).end()
    df = b.frame().sort_values("t_ns", kind="stable")
    df["seq"] = np.arange(len(df))
    s = summarize(df, default_run(), None)
    assert s["kv_paused_peak_tokens"] == 1300
    assert s["kv_active_peak_tokens"] == 210
    assert s["kv_paused_mean_tokens"] == approx((1000 * 5 + 300 * 2) / 5.75)
    assert s["resume_latency_ms"]["n"] == 2


def test_server_occupancy_from_kv_gauge() -> None:
    sm = pd.DataFrame({
        "t_ns": [1, 2, 3, 1],
        "source": ["metrics"] * 4,
        "name": ["vllm:kv_cache_usage_perc"] * 3 + ["vllm:num_requests_running"],
        "labels": [""] * 4,
        "value": [0.1, 0.3, 0.2, 5.0],
    })
    s = summarize(keep_run().frame(), default_run(), sm)
    occ = s["server_occupancy"]
    assert list(occ) == ["vllm:kv_cache_usage_perc"]
    assert occ["vllm:kv_cache_usage_perc"] == {"n": 3, "mean": approx(0.2), "max": 0.3,
                                               "last": 0.2}
    assert summarize(keep_run().frame(), {}, sm.iloc[0:0])["server_occupancy"] is None


def test_summarize_dir(tmp_path: Path) -> None:
    d = keep_run().write(tmp_path / "r")
    assert summarize_dir(d)["memory_time_mib_s"] == approx(720.0)
    with pytest.raises(InputError, match="not a results directory"):
        summarize_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no records"):
        summarize_dir(tmp_path / "empty")


def test_edge_summaries_are_strict_json() -> None:
    cancelled = Records()
    cancelled.agent("a").call().tool(wait=3.0, status="abandoned").cancel()
    bystanders = Records()
    bystanders.bystander("bystander-0", at=0.0, ttft=0.1, decode=0.5)
    for recs in (Records(), cancelled, bystanders, keep_run()):
        json.dumps(summarize(recs.frame(), {}, None).to_json(), allow_nan=False)


def test_engine_order_pause_ends_at_resumed_call_start() -> None:
    """kv_state only after call_end (as the replay engine writes it): the pause still ends at
    the resumed call_start, and the final erase (no step) belongs to no pause."""
    b = Records()
    add = b.add
    add(0.0, "trajectory_start", "a", planned_ns=0)
    add(0.0, "call_start", "a", step=0, prompt_tokens=100, appended_tokens=100, is_resume=False)
    add(0.11, "first_token", "a", step=0)
    add(0.15, "call_end", "a", step=0, status="ok", output_tokens=5, cached_tokens=0,
        prompt_n=100, server_ms=100.0)
    add(0.15, "kv_state", "a", kv_tokens=105, status="active")
    add(0.15, "pause_decision", "a", step=1, action="keep", retained_tokens=105,
        predicted_wait_s=2.0)
    add(0.15, "tool_start", "a", step=1, tool_class="remote_read", planned_latency_s=2.0)
    add(0.15, "kv_state", "a", kv_tokens=105, status="paused")
    add(2.15, "tool_end", "a", step=1, status="ok")
    add(2.15, "call_start", "a", step=2, prompt_tokens=115, appended_tokens=10, is_resume=True)
    add(2.17, "first_token", "a", step=2)
    add(2.21, "call_end", "a", step=2, status="ok", output_tokens=5, cached_tokens=105,
        prompt_n=10, server_ms=10.0)
    add(2.21, "kv_state", "a", kv_tokens=120, status="active")
    add(2.21, "erase", "a")
    add(2.21, "kv_state", "a", kv_tokens=0, status="released")
    add(2.21, "trajectory_end", "a", status="completed")
    s = summarize(b.frame(), {"model": {"kv_bytes_per_token": 100}}, None)
    assert s["memory_time_token_s"] == approx(210.0)
    assert s["memory_time_mib_s"] == approx(210.0 * 100 / 2**20)
    assert s["resume_latency_ms"]["p50"] == approx(20.0)
    # the server reported 10 ms of prompt time: the other 10 ms are its wait and delivery
    assert s["resume_parts_ms"]["prefill"]["p50"] == approx(10.0)
    assert s["resume_parts_ms"]["server_wait"]["p50"] == approx(10.0)
    assert s["cache_mismatches"] == 0 and s["kv_paused_peak_tokens"] == 105
    # active: the first call's 100-token prompt from its start (it held nothing before), then
    # the resumed call's 115-token prompt from its call_start
    assert s["kv_active_mean_tokens"] == approx((100 * 0.15 + 115 * 0.06) / 2.21)


def test_mismatch_tolerance_covers_one_cache_block() -> None:
    """A runtime that reuses whole 32-token blocks leaves up to a block uncached on keep."""
    b = Records()
    t = b.agent("a")
    t.call(appended=94, out=10).tool(action="keep", retained=104).call(cached=80).end()
    frame = b.frame()
    assert summarize(frame, default_run(), None)["cache_mismatches"] == 1
    assert summarize(frame, {**default_run(), "cache_block_tokens": 32},
                     None)["cache_mismatches"] == 0


def test_itl_is_over_every_streamed_gap_where_the_client_recorded_them() -> None:
    """Two calls' chunk gaps (3 + 1 of them) are one distribution of 4 per-token gaps, not two
    per-call means; a call without recorded gaps is not mixed into it."""
    b = Records()
    t = b.agent("a")
    t.call(out=4, decode_ms=90.0, token_gaps_us=[10_000, 20_000, 30_000])
    t.tool(wait=1.0, action="keep", retained=104)
    t.call(out=2, decode_ms=9.0, token_gaps_us=[100_000])
    t.tool(wait=1.0, action="keep", retained=200)
    t.call(out=3, decode_ms=8.0)
    t.end()
    s = summarize(b.frame(), default_run(), None)
    assert s["itl_source"] == "client chunk times"
    assert s["itl_ms"]["n"] == 4
    assert s["itl_ms"]["p50"] == approx(25.0)  # the median of 10, 20, 30, 100 ms


def test_itl_without_chunk_times_is_the_servers_decode_per_token() -> None:
    s = summarize(keep_run().frame(), default_run(), None)
    assert s["itl_source"] == "server decode per token" and s["itl_ms"]["n"] == 2


def test_a_server_that_caches_prompt_blocks_only_owes_the_prompt() -> None:
    """Dynamo's mocker keeps the KV of prompts, not of generated tokens: a kept context's
    reuse is judged against the context less what the call before the pause generated."""
    b = Records()
    t = b.agent("a")
    t.call(appended=2000, out=100).tool(action="keep", retained=2100).call(cached=2000).end()
    frame = b.frame()
    assert summarize(frame, default_run(), None)["cache_mismatches"] == 1
    prompt_only = {**default_run(), "cache_reuses_output": False}
    assert summarize(frame, prompt_only, None)["cache_mismatches"] == 0
    b2 = Records()
    b2.agent("b").call(appended=2000, out=100).tool(action="keep", retained=2100).call(
        cached=1500).end()
    assert summarize(b2.frame(), prompt_only, None)["cache_mismatches"] == 1


def test_an_unsupported_decision_is_judged_as_keep() -> None:
    """A recompute the runtime could not do left the context cached: reuse is what is owed."""
    b = Records()
    b.agent("a").call(appended=500, out=10).tool(action="keep", retained=510).call(
        cached=500).end()
    frame = b.frame()
    frame.loc[frame["event"] == "pause_decision", "action"] = "recompute"
    assert summarize(frame, default_run(), None)["cache_mismatches"] == 1
    frame.loc[frame["event"] == "pause_decision", "status"] = "unsupported"
    assert summarize(frame, default_run(), None)["cache_mismatches"] == 0
