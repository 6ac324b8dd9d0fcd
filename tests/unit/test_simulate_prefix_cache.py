"""The engine model of vLLM and SGLang: a paged prefix cache that evicts (least recently freed
first, a context's tail first), pinned contexts outside it, a bounded host tier, on tiny traces
whose every figure is computed by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import write_calibration
from harness.records.store import read_records
from harness.simulate.block_cache import BlockCache
from harness.simulate.run import Arrivals, check_capacity, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import ALPHA, BETA, CAL, ev, llm, sim, t_s, tool, trace


def paged(tokens: int, block: int = 16, host: int | None = None) -> Capacity:
    """A paged prefix cache whose calls reserve their whole context at admission (SGLang's
    engine model; vLLM's also grows its calls block by block: test_simulate_growth)."""
    return Capacity(tokens=tokens, engine="sglang", block_size=block, host_tokens=host)


# --- the cache alone ---------------------------------------------------------------------

def test_cache_keeps_whole_blocks_and_evicts_oldest_tail_first() -> None:
    c = BlockCache(16, 1000)
    assert c.leave(0, 110) == 96  # 6 whole blocks; the partial one is freed
    assert c.leave(-1, 40) == 32  # a dead context: its own key
    assert c.leave(1, 64) == 64
    assert c.tokens == 192
    assert c.evict(20) == 32  # two blocks off the tail of the oldest entry
    assert dict(c.lru) == {0: 64, -1: 32, 1: 64}
    assert c.evict(70) == 80  # the rest of entry 0, then one block of the dead one
    assert dict(c.lru) == {-1: 16, 1: 64}
    assert (c.tokens, c.evicted) == (80, 112)
    assert c.take(1) == 64 and c.take(1) == 0
    assert c.evict(1000) == 16 and c.tokens == 0


def test_reusable_is_whole_blocks_leaving_one_prompt_token() -> None:
    c = BlockCache(16, 0)
    assert c.reusable(110, 20) == 96
    assert c.reusable(128, 20) == 128
    assert c.reusable(128, 0) == 112  # a prompt of exactly the kept blocks: one is computed
    assert BlockCache(1, 0).reusable(110, 20) == 110
    assert BlockCache(1, 0).reusable(110, 0) == 109


def test_host_tier_capacity() -> None:
    c = BlockCache(16, 100)
    assert c.host_fits(100) and not c.host_fits(101)
    with pytest.raises(ValueError):
        BlockCache(0, 0)


# --- the engine ----------------------------------------------------------------------------

ONE = {"a": [llm(100, 10), tool(1.0), llm(20, 5)]}


def test_keep_evictable_reuses_whole_blocks_when_nothing_evicts(tmp_path: Path) -> None:
    df, run = sim(tmp_path, trace(tmp_path, ONE), "keep-evictable",
                  Capacity(tokens=1000, engine="vllm", block_size=16))
    end = ev(df, "call_end").iloc[1]
    # 110 tokens of context: 96 cached in 6 blocks, 14 recomputed with the 20 new ones
    assert (end["prompt_n"], end["cached_tokens"]) == (34, 96)
    assert ev(df, "pause_decision")["action"].tolist() == ["keep-evictable"]
    assert ev(df, "kv_state")["status"].tolist() == ["active", "evictable", "active",
                                                     "released"]
    assert ev(df, "erase")["reason"].tolist() == ["trajectory-end"]  # nothing at the pause
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        ALPHA + 34 * BETA)
    assert run["capacity"] == {"mode": "tokens", "tokens": 1000, "slots": None,
                               "ctx_per_slot": None, "engine": "vllm", "block_size": 16,
                               "host_tokens": None}
    assert run["simulator"]["engine_semantics"] == "vllm"
    assert run["simulator"]["evicted_tokens"] == 0


def test_keep_pinned_resumes_its_whole_blocks_too(tmp_path: Path) -> None:
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "keep", paged(1000))
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (34, 96)
    # SGLang's pages are single tokens: the whole context is reused
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "keep",
                Capacity(tokens=1000, engine="sglang", block_size=1), name="sgl")
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (20, 110)


# a pauses 10 s with 110 tokens; b arrives at 1 s and needs 900 of a 1,000-token pool
PRESSED = {"a": [llm(100, 10), tool(10.0), llm(20, 5)], "b": [llm(890, 10)]}


def test_pressure_evicts_the_paused_context_but_not_a_pinned_one(tmp_path: Path) -> None:
    path = trace(tmp_path, PRESSED, starts={"a": 0.0, "b": 1.0})
    arrivals = Arrivals("trace", 2)
    df, run = sim(tmp_path, path, "keep-evictable", paged(1000), arrivals=arrivals)
    # b needs 900 of the 904 tokens neither held nor cached (a left 96 to the cache): a's
    # blocks survive; b's end leaves 896 dead tokens, of which a's resume (34 more than its
    # 96) evicts two blocks, 32, the 8 free not being enough
    assert ev(df, "call_end", "a")["cached_tokens"].iloc[1] == 96
    assert run["simulator"]["evicted_tokens"] == 32
    df, run = sim(tmp_path, path, "keep-evictable", paged(960), arrivals=arrivals, name="small")
    # 960 - 96 = 864 free < 900: b evicts 36, in whole blocks (48) from a's tail; a's resume
    # then needs 82 with 16 free: 80 more of b's dead blocks
    end = ev(df, "call_end", "a").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (82, 48)
    assert run["simulator"]["evicted_tokens"] == 48 + 80
    df, run = sim(tmp_path, path, "keep", paged(960), arrivals=arrivals, name="pinned")
    # pinned: a holds its 110 tokens, b's 900 do not fit beside them until a ends
    assert t_s(df, "call_start", "b") == pytest.approx(t_s(df, "trajectory_end", "a"))
    assert ev(df, "call_end", "a")["cached_tokens"].iloc[1] == 96


def test_recompute_leaves_dead_blocks_that_are_never_matched(tmp_path: Path) -> None:
    df, run = sim(tmp_path, trace(tmp_path, ONE), "recompute", paged(1000))
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (130, 0)
    assert ev(df, "recompute")["recomputed_tokens"].tolist() == [110]


def test_swap_refused_when_the_host_tier_is_full(tmp_path: Path) -> None:
    df, run = sim(tmp_path, trace(tmp_path, ONE), "swap", paged(1000, host=95))
    assert run["simulator"]["swaps_refused"] == 1
    assert ev(df, "swap_out").empty
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (34, 96)  # stayed pinned
    df, run = sim(tmp_path, trace(tmp_path, ONE), "swap", paged(1000, host=96), name="fits")
    assert run["simulator"]["swaps_refused"] == 0
    assert ev(df, "swap_in")["retained_tokens"].tolist() == [110]
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (34, 96)  # whole blocks restored


def test_keep_evictable_needs_an_engine_with_a_prefix_cache(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--engine vllm or sglang"):
        sim(tmp_path, trace(tmp_path, ONE), "keep-evictable", Capacity(tokens=1000))


def test_capacity_checks() -> None:
    assert check_capacity(2560, None, None, "vllm") == Capacity(tokens=2560, engine="vllm",
                                                                  block_size=16)
    assert check_capacity(2560, None, None, "sglang", host_tokens=0).block_size == 1
    with pytest.raises(InputError, match="token pool"):
        check_capacity(None, 4, 1024, "vllm")
    with pytest.raises(InputError, match="--engine must be one of"):
        check_capacity(2560, None, None, "trt")
    with pytest.raises(InputError, match="vllm or sglang only"):
        check_capacity(2560, None, None, "llamacpp", block_size=16)


def test_cli_engine_takes_the_pool_and_block_from_the_calibration(tmp_path: Path) -> None:
    cal = write_calibration(tmp_path / "cal.json", dataclasses.replace(
        CAL, runtime="vllm", block_size=16, kv_capacity_tokens=1000))
    path = trace(tmp_path, ONE)
    res = CliRunner().invoke(main, ["simulate", "--trace", str(path), "--policy",
                                    "keep-evictable", "--calibration", str(cal), "--out",
                                    str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (run["capacity"]["engine"], run["capacity"]["tokens"],
            run["capacity"]["block_size"]) == ("vllm", 1000, 16)
    res = CliRunner().invoke(main, ["simulate", "--trace", str(path), "--policy", "keep",
                                    "--calibration", str(cal), "--engine", "sglang",
                                    "--out", str(tmp_path / "sgl")])
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "sgl" / "run.json").read_text())
    # another engine than the calibrated one: its own default block size
    assert (run["capacity"]["engine"], run["capacity"]["block_size"]) == ("sglang", 1)
    res = CliRunner().invoke(main, ["simulate", "--trace", str(path), "--policy",
                                    "keep-evictable", "--calibration", str(cal), "--engine",
                                    "llamacpp", "--capacity-tokens", "1000", "--out",
                                    str(tmp_path / "bad")])
    assert res.exit_code == 2
    assert "--engine vllm or sglang" in res.output


def test_a_fleet_has_one_cache_per_server(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(20, 5), tool(1.0), llm(20, 5)]})
    for router, cached in (("prefix-affinity", [0, 96, 128]), ("round-robin", [0, 0, 96])):
        out = tmp_path / router
        run_simulation(path, "keep-evictable", {}, paged(1000), CAL, None,
                       Arrivals("closed", 1), 0, out, write_summary=False, servers=2,
                       router=router)
        ends = ev(read_records(out), "call_end")
        # round-robin: the second call lands on server 1, which has nothing of `a`; the third
        # is back on server 0, whose cache still holds the first call's 110 tokens (96 in
        # whole blocks): reused, the rest of the 135-token context recomputed
        assert ends["cached_tokens"].tolist() == cached, router


def test_whole_block_reuse_is_no_mismatch_and_counts_as_retained(tmp_path: Path) -> None:
    from harness.metrics.summary import summarize_dir
    from harness.records.manifest import read_manifest

    out = tmp_path / "run"
    run_simulation(trace(tmp_path, ONE), "keep-evictable", {}, paged(1000, block=32), CAL, None,
                   Arrivals("closed", 1), 0, out, write_summary=False)
    assert read_manifest(out).cache_block_tokens == 32
    s = summarize_dir(out)
    # 110 tokens kept, 96 reused (3 blocks): within a block, so the context survived whole
    assert s["effective_retention"]["rate"] == 1.0


def test_a_call_reaches_the_engine_its_request_overhead_after_it_was_sent(
        tmp_path: Path) -> None:
    slow = dataclasses.replace(CAL, request_overhead_ms=5.0)
    df, run = sim(tmp_path, trace(tmp_path, ONE), "keep", Capacity(tokens=1000), cal=slow)
    # the resume: 5 ms on the way, then one iteration of the 20 new tokens
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        0.005 + ALPHA + 20 * BETA)
    assert t_s(df, "call_start", "a") == pytest.approx(0.005)  # when the engine admits it
    assert "request_overhead_ms" in run["simulator"]["server_model"]


def test_request_overhead_in_the_calibration_file(tmp_path: Path) -> None:
    from harness.model.calibration import Calibration, read_calibration

    cal = dataclasses.replace(CAL, request_overhead_ms=12.5)
    assert read_calibration(write_calibration(tmp_path / "c.json", cal)) == cal
    bad = {**cal.to_dict(), "request_overhead_ms": -1}
    with pytest.raises(InputError, match="request_overhead_ms must be a finite number >= 0"):
        Calibration.from_dict(bad)


def test_a_calls_overhead_is_drawn_from_its_distribution_the_same_for_a_seed(
        tmp_path: Path) -> None:
    from harness.simulate.run import server_model

    spread = dataclasses.replace(CAL, request_overhead_ms=5.0,
                                 request_overhead_samples_ms=(1.0, 4.0, 20.0))
    draws = server_model(spread).overhead_draws(300, seed=7)
    assert draws == server_model(spread).overhead_draws(300, seed=7)
    assert draws != server_model(spread).overhead_draws(300, seed=8)
    assert set(draws) == {0.001, 0.004, 0.020}  # each sample, in seconds
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "keep", Capacity(tokens=1000), cal=spread,
                seed=7)
    # the resume is step 2 (llm, tool, llm): its own draw, then one iteration of 20 tokens
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        draws[2] + ALPHA + 20 * BETA)


def test_a_draws_seed_redraws_the_server_and_keeps_the_arrivals(tmp_path: Path) -> None:
    from harness.simulate.run import server_model

    spread = dataclasses.replace(CAL, request_overhead_ms=5.0,
                                 request_overhead_samples_ms=(1.0, 4.0, 20.0))
    trajs = {f"t{i}": [llm(100, 10), tool(1.0), llm(20, 5)] for i in range(4)}
    path = trace(tmp_path, trajs)
    poisson = Arrivals("poisson", rate=2.0)

    def run(name: str, draws_seed: int | None) -> pd.DataFrame:
        run_simulation(path, "keep", {}, Capacity(tokens=4000), spread, None, poisson, 7,
                       tmp_path / name, write_summary=False, draws_seed=draws_seed)
        return read_records(tmp_path / name)

    base, same, other = run("base", None), run("same", 7), run("other", 8)
    cols = ["event", "trajectory_id", "t_ns"]
    assert base[cols].equals(same[cols])  # the replay's seed is the default
    starts = [ev(df, "trajectory_start")["t_ns"].tolist() for df in (base, other)]
    assert starts[0] == starts[1]  # arrivals are the seed's, whatever the draws
    # the resumes' waits (a drawn overhead, then the engine's iterations) are other draws
    def waits(df: pd.DataFrame) -> list[float]:
        return [t_s(df, "first_token", t, 1) - t_s(df, "tool_end", t) for t in trajs]

    assert waits(base) != waits(other)
    assert server_model(spread).overhead_draws(64, 7) != server_model(spread).overhead_draws(
        64, 8)
