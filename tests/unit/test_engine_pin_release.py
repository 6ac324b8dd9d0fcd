"""The engine model's pin-release valve (harness.simulate.valve), with exact times.

Four agents fill a 390-token pool with their pinned paused contexts (keep): a 110, b 50, c 160,
d 70, arriving in that order, b's call ending first after a's. a's tool returns first and its
resume needs 25 tokens more than its pin: nothing is free, so the valve releases one other pin,
to the evictable cache, under the order asked, and a's call grows at once. Every call is served, the
released pin's hint is recorded clipped (held from its pause to the release), every other
accepted at its resume; with room, nothing is released.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from harness.policies.pin_release import PIN_RELEASE_ORDERS, PinView, release_order
from harness.records.store import read_records
from harness.simulate.block_cache import BlockCache
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from harness.simulate.trajectory import DROPPED, KEPT, Trajectory
from tests.unit.test_simulate import CAL, ev, llm, t_s, tool, trace

TRAJS = {"a": [llm(100, 10), tool(0.5), llm(20, 5)], "b": [llm(40, 10), tool(5.0), llm(20, 5)],
         "c": [llm(150, 10), tool(5.0), llm(20, 5)], "d": [llm(60, 10), tool(5.0), llm(20, 5)]}
STARTS = {"a": 0.0, "b": 0.05, "c": 0.1, "d": 0.2}
FULL = 110 + 50 + 160 + 70
# the pin each order releases for a's resume: d arrived last, b's pin is the oldest, c's the
# largest (a's own is never a candidate)
RELEASED = {"latest-program": "d", "lru": "b", "largest": "c"}


def simulate(tmp: Path, order: str, tokens: int, engine: str = "sglang"
             ) -> tuple[pd.DataFrame, dict[str, object]]:
    out = tmp / f"{engine}-{order}-{tokens}"
    m = run_simulation(SimOptions(trace(tmp, TRAJS, STARTS), "keep", {}, Capacity(
        tokens=tokens, engine=engine, block_size=1), None, Arrivals("trace", 8, 1.0), 0, out,
        write_summary=False, pin_release=order), CAL)
    assert m.simulator is not None and m.outcome is not None
    assert m.outcome.completed == len(TRAJS)  # every call served
    return read_records(out), m.simulator


@pytest.mark.parametrize("order", PIN_RELEASE_ORDERS)
def test_a_full_pool_of_pins_releases_one_in_the_declared_order(tmp_path: Path,
                                                                order: str) -> None:
    df, sim = simulate(tmp_path, order, FULL)
    assert sim["pins_released"] == 1 and sim["preemptions"] == 0
    # the pins, as they were made: b's first but a's
    pins = ev(df, "pause_decision").sort_values("t_ns")["trajectory_id"].tolist()
    assert [p for p in pins if p != "a"][0] == "b" and sorted(pins) == ["a", "b", "c", "d"]
    victim = RELEASED[order]
    resumed = t_s(df, "tool_end", "a")
    assert t_s(df, "call_start", "a", 1) == resumed  # it grew at once
    hints = ev(df, "hint_outcome").set_index("trajectory_id")
    assert len(hints) == 4
    clipped = hints.loc[victim]
    assert (clipped["status"], clipped["reason"], clipped["action"], clipped["step"]) == (
        "clipped", f"valve: {order}", "keep", 1)
    assert float(clipped["t_ns"]) / 1e9 == resumed
    assert clipped["held_s"] == pytest.approx(resumed - t_s(df, "pause_decision", victim),
                                              abs=1e-9)
    for tid in set(TRAJS) - {victim}:
        row = hints.loc[tid]
        assert (row["status"], row["reason"]) == ("accepted", "resumed")
        assert pd.isna(row["held_s"])
        assert float(row["t_ns"]) / 1e9 == t_s(df, "call_start", tid, 1)
    # the released context went to the evictable cache, all of it
    states = ev(df, "kv_state", victim)
    assert states["status"].tolist() == ["active", "paused", "evictable", "active", "released"]
    assert states["kv_tokens"].iloc[2] == {"b": 50, "c": 160, "d": 70}[victim]


def test_the_exact_times_of_a_release(tmp_path: Path) -> None:
    df, _ = simulate(tmp_path, "latest-program", FULL)
    clipped = ev(df, "hint_outcome", "d").iloc[0]
    assert float(clipped["t_ns"]) / 1e9 == pytest.approx(t_s(df, "call_end", "a") + 0.5)
    assert clipped["held_s"] == pytest.approx(
        t_s(df, "call_end", "a") + 0.5 - t_s(df, "call_end", "d"), abs=1e-9)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_with_room_nothing_is_released(tmp_path: Path, engine: str) -> None:
    df, sim = simulate(tmp_path, "latest-program", FULL + 4 * 25 + 16, engine)
    assert sim["pins_released"] == 0 and sim["preemptions"] == 0
    hints = ev(df, "hint_outcome")
    assert hints["status"].tolist() == ["accepted"] * 4
    assert hints["held_s"].isna().all()


def test_on_vllm_a_running_call_that_cannot_grow_releases_a_pin(tmp_path: Path) -> None:
    # vLLM's calls grow as they decode: a's resume is admitted with its prompt's blocks and
    # finds none for its next tokens: the valve releases a pin before any call is preempted
    df, sim = simulate(tmp_path, "largest", FULL, "vllm")
    assert sim["pins_released"] >= 1 and sim["preempted_calls"] == 0
    assert ev(df, "hint_outcome", "c")["status"].tolist() == ["clipped"]


def test_what_the_valve_may_release_is_counted_as_pinned_and_never_drifts() -> None:
    # A pin counts what its context held when pinned; unpinned, exactly that comes off, even
    # when the context grew meanwhile (a call admitted onto it grows it before its pin ends: a
    # count taken again at the unpin went below 0 on vLLM's replays and kept the valve shut).
    cache = BlockCache(16, 1 << 30)
    a, b, c = (Trajectory(k, 0, 2) for k in range(3))
    for tr, held, arrived in ((a, 160, 1.0), (b, 64, 2.0), (c, 32, 3.0)):
        tr.held, tr.state, tr.arrived = held, KEPT, arrived
        cache.pin(tr, 1.0)
    assert cache.pinned == 256
    assert cache.releasable(None, -1.0, 10**9) == 256 and cache.releasable(a, -1.0, 10**9) == 96
    assert cache.releasable(None, 1.5, 10**9) == 96  # only those that arrived after 1.5
    assert cache.releasable(None, -1.0, 100) >= 100  # the scan stops once it has enough
    a.held = 400  # its context grew while pinned
    cache.unpin(a)
    assert cache.pinned == 96
    c.state = DROPPED  # no longer held for a pause: not the valve's to release
    assert cache.releasable(None, -1.0, 10**9) == 64
    cache.unpin(b)
    cache.unpin(c)
    assert cache.pinned == 0 and cache.pin_tokens == {}


def deferred_run(tmp: Path, with_prefill: bool) -> pd.DataFrame:
    # b's call ends at once; its pause asks for an offload, which the engine applies between
    # iterations: behind a's 1,000-token prefill (about 1 s at CAL's 1 ms a token), or at once
    trajs = {"b": [llm(10, 1), tool(2.0), llm(10, 1)]}
    starts = {"b": 0.0}
    if with_prefill:
        trajs["a"], starts["a"] = [llm(1000, 1)], 0.005
    out = tmp / f"deferred-{with_prefill}"
    run_simulation(SimOptions(trace(tmp, trajs, starts), "swap", {}, Capacity(
        tokens=4096, engine="vllm", block_size=16), None, Arrivals("trace", 8, 1.0), 0, out,
        write_summary=False), CAL)
    return read_records(out)


def test_an_offload_applied_behind_a_long_iteration_is_deferred_with_its_delay(
        tmp_path: Path) -> None:
    df = deferred_run(tmp_path, True)
    hint = ev(df, "hint_outcome", "b").iloc[0]
    # applied at the end of the iteration it waited for (a's prefill; its copy ends later)
    asked, applied = t_s(df, "pause_decision", "b"), t_s(df, "first_token", "a")
    assert asked < 0.1 and applied < t_s(df, "swap_out", "b")
    assert (hint["status"], hint["reason"], hint["action"]) == ("deferred", "applied late",
                                                                "swap")
    assert hint["hint_delay_s"] == pytest.approx(applied - asked, abs=1e-9)
    assert hint["hint_delay_s"] >= 0.1 and pd.isna(hint["held_s"])


def test_an_offload_applied_at_once_is_accepted(tmp_path: Path) -> None:
    hint = ev(deferred_run(tmp_path, False), "hint_outcome", "b").iloc[0]
    assert (hint["status"], hint["reason"]) == ("accepted", "resumed")
    assert pd.isna(hint["hint_delay_s"]) and pd.isna(hint["held_s"])


@pytest.mark.parametrize("order", PIN_RELEASE_ORDERS)
def test_the_models_victim_is_the_first_of_the_declared_order(order: str) -> None:
    # the model's one pass over its pins picks what harness.policies.pin_release ranks first
    rnd = random.Random(11)
    for _ in range(200):
        cache = BlockCache(16, 1 << 30)
        pins = [Trajectory(k, 0, 2) for k in range(6)]
        for p in pins:
            p.held, p.state = rnd.choice([16, 40, 64]), KEPT
            p.arrived = rnd.choice([0.0, 1.0, 2.0])
            cache.pin(p, rnd.choice([0.5, 1.5]))
        ids = [f"t{rnd.randrange(1000):03d}-{k}" for k in range(6)]
        first = release_order([PinView(ids[p.ti], p.arrived, p.pin_at, -(-p.held // 16))
                               for p in pins], order)[0]
        victim = cache.victim(None, order, ids)
        assert victim is not None and ids[victim.ti] == first


@pytest.mark.parametrize("order", PIN_RELEASE_ORDERS)
def test_the_victim_stays_the_orders_first_as_pins_come_and_go(order: str) -> None:
    # the heap the model keeps of its pins, with entries of ended pins left in it, against
    # harness.policies.pin_release's order of the pins held at each release: pins end and
    # begin again, calls run on pinned contexts (passed over), one call is being admitted;
    # and what the valve counts as releasable, from its list of the pins by arrival
    rnd = random.Random(5)
    for _ in range(40):
        cache = BlockCache(16, 1 << 30)
        trajs = [Trajectory(k, 0, 2) for k in range(12)]
        ids = [f"t{rnd.randrange(100):02d}-{k}" for k in range(12)]
        for p in trajs:
            p.held, p.state = rnd.choice([16, 40, 64]), KEPT
            p.arrived = rnd.choice([0.0, 1.0, 2.0, 3.0])
        t = 0.0
        for _ in range(60):
            t += rnd.choice([0.0, 0.5])
            p = rnd.choice(trajs)
            move = rnd.random()
            if move < 0.4:
                cache.pin(p, t)
            elif move < 0.6:
                cache.unpin(p)
            elif move < 0.7:
                p.state = DROPPED if p.state == KEPT else KEPT
            else:
                keep = rnd.choice([None, p])
                after = rnd.choice([-1.0, 1.0]) if order == PIN_RELEASE_ORDERS[0] else -1.0
                held = [q for q in cache.pins.values()
                        if q.state == KEPT and q is not keep and q.arrived > after]
                ranked = release_order([PinView(ids[q.ti], q.arrived, q.pin_at,
                                                -(-q.held // 16)) for q in held], order)
                victim = cache.victim(keep, order, ids, after)
                assert (None if victim is None else ids[victim.ti]) == (
                    ranked[0] if ranked else None)
                # what releasing them all gives back: all of it, or at least `cap` of it
                everything = sum(cache.pin_tokens[q.ti] for q in held)
                cap = rnd.choice([16, 64, 1 << 20])
                got = cache.releasable(keep, after, cap)
                assert got == everything if everything < cap else cap <= got <= everything
                if victim is not None and rnd.random() < 0.5:
                    cache.unpin(victim)  # released
