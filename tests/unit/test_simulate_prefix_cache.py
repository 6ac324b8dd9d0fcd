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
from harness.simulate.block_cache import GROUP_KEY0, BlockCache
from harness.simulate.fleet import Fleet
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, check_capacity, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import ALPHA, BETA, CAL, ev, llm, sim, t_s, tool, trace
from tests.unit.test_simulate_fleet import engine_run


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


def test_a_groups_shared_prefix_is_held_once_and_cached_after_its_last_holder() -> None:
    c = BlockCache(16, 0, groups=2)
    assert c.shared_cost(0, 64) == 64  # nothing of it anywhere
    assert c.join(0, 64) == 0 and c.g_span[0] == 64  # the caller takes the 64
    assert (c.shared_cost(0, 64), c.shared_cost(0, 96)) == (0, 32)
    assert c.join(0, 32) == 32  # a shorter prefix of the group's: there, held for both
    assert c.leave(5, 48) == 48  # trajectory 5's own blocks after its prefix
    c.part(0)
    assert (c.tokens, c.g_span[0], c.g_users[0]) == (48, 64, 1)  # still held for the other
    c.part(0)
    assert dict(c.lru) == {5: 48, GROUP_KEY0: 64} and c.tokens == 112
    assert c.shared_cost(0, 32) == 64  # cached: the whole of it leaves the cache
    assert c.evict(60) == 64  # the own blocks go first (older), then the prefix's tail
    assert dict(c.lru) == {GROUP_KEY0: 48}
    assert c.join(0, 64) == 48 and c.g_span[0] == 64 and c.tokens == 0
    assert c.join(1, 16) == 0 and c.g_users == [1, 1]


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
    # pinned: a holds its 110 tokens, b's 900 do not fit beside them: the valve releases a's
    # pin to the cache at once, and its resume finds what b left of it, as keep-evictable's
    assert t_s(df, "call_start", "b") == pytest.approx(1.0)
    assert ev(df, "hint_outcome")["status"].tolist() == ["clipped"]
    assert ev(df, "call_end", "a")["cached_tokens"].iloc[1] == 48


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
        run_simulation(SimOptions(path, "keep-evictable", {}, paged(1000), None,
                                  Arrivals("closed", 1), 0, out, write_summary=False, servers=2,
                                  router=router), CAL)
        ends = ev(read_records(out), "call_end")
        # round-robin: the second call lands on server 1, which has nothing of `a`; the third
        # is back on server 0, whose cache still holds the first call's 110 tokens (96 in
        # whole blocks): reused, the rest of the 135-token context recomputed
        assert ends["cached_tokens"].tolist() == cached, router


def test_whole_block_reuse_is_no_mismatch_and_counts_as_retained(tmp_path: Path) -> None:
    from harness.metrics.summary import summarize_dir
    from harness.records.manifest import read_manifest

    out = tmp_path / "run"
    run_simulation(SimOptions(trace(tmp_path, ONE), "keep-evictable", {}, paged(1000, block=32),
                              None, Arrivals("closed", 1), 0, out, write_summary=False), CAL)
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
        run_simulation(SimOptions(path, "keep", {}, Capacity(tokens=4000), None, poisson, 7,
                                  tmp_path / name, write_summary=False, draws_seed=draws_seed),
                                  spread)
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


# --- shared prefixes -------------------------------------------------------------------------

# a pauses 10 s after a call of 110 tokens; b, of a's prefix group, arrives at 1 s: both
# trajectories' first calls start with the same 64 tokens (prefix_tokens)
SHARED = {"a": [llm(100, 10), tool(10.0), llm(20, 5)], "b": [llm(80, 10)]}
GROUPED = {"a": ("g", 64), "b": ("g", 64)}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_first_call_reuses_the_prefix_its_group_left(tmp_path: Path, engine: str) -> None:
    arrivals = Arrivals("trace", 2)
    cap = Capacity(tokens=1000, engine=engine, block_size=16)
    path = trace(tmp_path, SHARED, starts={"a": 0.0, "b": 1.0}, prefixes=GROUPED)
    df, _ = sim(tmp_path, path, "keep-evictable", cap, arrivals=arrivals)
    # a's first call computes the prefix; b's finds it cached (a left it at its pause, after
    # its own 32 tokens past the prefix) and computes its 16 other tokens; a's resume
    # matches its prefix and its own blocks: 96, as without a group
    assert ev(df, "call_end", "a")["cached_tokens"].tolist() == [0, 96]
    assert ev(df, "call_end", "b")[["prompt_n", "cached_tokens"]].values.tolist() == [[16, 64]]
    assert t_s(df, "first_token", "b") - t_s(df, "call_start", "b") == pytest.approx(
        ALPHA + 16 * BETA)
    alone, _ = sim(tmp_path, trace(tmp_path / "x", SHARED, starts={"a": 0.0, "b": 1.0}),
                   "keep-evictable", cap, arrivals=arrivals, name="alone")
    assert ev(alone, "call_end", "b")["cached_tokens"].tolist() == [0]
    # recompute: a's resume carries a fresh cache salt and matches nothing, not even the
    # prefix it left (b still finds it)
    df, _ = sim(tmp_path, path, "recompute", cap, arrivals=arrivals, name="recompute")
    assert ev(df, "call_end", "a")["cached_tokens"].tolist() == [0, 0]
    assert ev(df, "call_end", "b")["cached_tokens"].tolist() == [64]


def test_the_prefix_a_pinned_context_holds_is_not_held_twice(tmp_path: Path) -> None:
    # a keeps its 110 tokens pinned through its pause; b's 90 need 90 - 64 more beside them:
    # 110 + 26 fit in 160 tokens, 110 + 90 would not
    trajs = {"a": [llm(100, 10), tool(10.0), llm(20, 5)], "b": [llm(80, 10)]}
    arrivals = Arrivals("trace", 2)
    starts = {"a": 0.0, "b": 1.0}
    df, _ = sim(tmp_path, trace(tmp_path, trajs, starts=starts, prefixes=GROUPED), "keep",
                paged(160), arrivals=arrivals)
    assert t_s(df, "call_start", "b") == pytest.approx(1.0)
    assert ev(df, "call_end", "b")["cached_tokens"].tolist() == [64]
    assert ev(df, "slot_wait").empty
    assert ev(df, "hint_outcome")["status"].tolist() == ["accepted"]
    # alone, b's 90 do not fit beside a's pin: the valve releases it (to the cache)
    alone, _ = sim(tmp_path, trace(tmp_path / "x", trajs, starts=starts), "keep", paged(160),
                   arrivals=arrivals, name="alone")
    assert t_s(alone, "call_start", "b") == pytest.approx(1.0)
    assert ev(alone, "hint_outcome")["status"].tolist() == ["clipped"]


def test_pressure_takes_a_contexts_own_blocks_before_its_groups_prefix(tmp_path: Path) -> None:
    # a leaves 32 own tokens, then the group's 64, to the cache at its pause. c, of no group,
    # arrives at 1 s and needs 900 tokens. b, of a's group, arrives at 5 s, after c's end
    # left 896 dead tokens: it takes the prefix out of the cache and evicts a's own blocks
    # (the oldest) for its other 26. With 960 tokens c's 900 had evicted a's own blocks and
    # one block of the prefix already: b reuses the 48 left and computes the rest again.
    trajs = {"a": [llm(100, 10), tool(10.0), llm(20, 5)], "c": [llm(890, 10)],
             "b": [llm(80, 10)]}
    starts = {"a": 0.0, "c": 1.0, "b": 5.0}
    arrivals = Arrivals("trace", 3)
    for pool, b_cached in ((1000, 64), (960, 48)):
        df, _ = sim(tmp_path, trace(tmp_path / str(pool), trajs, starts=starts,
                                    prefixes=GROUPED), "keep-evictable", paged(pool),
                    arrivals=arrivals, name=str(pool))
        assert ev(df, "call_end", "b")["cached_tokens"].tolist() == [b_cached], pool
        # a's resume: its own blocks are gone; the prefix b held is cached again, whole
        assert ev(df, "call_end", "a")["cached_tokens"].tolist() == [0, 64], pool
    # without the group, b's 90 tokens evict all of a's 96
    df, _ = sim(tmp_path, trace(tmp_path / "alone", trajs, starts=starts), "keep-evictable",
                paged(1000), arrivals=arrivals, name="alone")
    assert ev(df, "call_end", "a")["cached_tokens"].tolist() == [0, 0]


@pytest.mark.parametrize("policy, tokens", [("keep-evictable", 2600), ("keep", 3500)])
def test_preempted_calls_give_back_what_they_held_of_shared_prefixes(
        tmp_path: Path, policy: str, tokens: int) -> None:
    # coding-subagents' groups share 1,500 and 500 tokens; on vLLM's engine, short of memory,
    # decoding calls are preempted or pins released (the valve): every token is
    # free or cached at the end and no group holds its prefix
    fleet = Fleet(1, "round-robin")
    df = engine_run(tmp_path, "coding-subagents.parquet", policy, {},
                    Capacity(tokens=tokens, engine="vllm", block_size=16), 8, fleet)
    e = fleet.e
    assert e.growth is not None and e.growth.preempted + e.valve.released > 0
    assert e.cache is not None and e.free_tok + e.cache.tokens == tokens
    assert not any(e.cache.g_users) and not any(e.cache.g_span)
    first = ev(df, "call_end")
    assert first.loc[first["step"] == 0, "cached_tokens"].sum() > 0  # prefixes were shared
