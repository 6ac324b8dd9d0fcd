"""The continuum policy (Continuum's TTL per tool call), a TTL that leaves the context to the
engine's cache at expiry, and the queueing delay the policies see: exact decisions, and the
pause seam on the in-memory server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.policies import PauseContext, ServerRates, make_policy
from harness.policies.base import KEEP, KEEP_EVICTABLE, SWAP, Decision
from harness.policies.history import History, RecentMean
from harness.simulate.run import Arrivals
from harness.simulate.server import Capacity
from tests.unit.test_pause_seam import resumed_cached, run_unslotted
from tests.unit.test_simulate import ev, llm, sim, t_s, tool, trace
from tests.unit.test_simulate_prefix_cache import ONE, PRESSED, paged

RATES = ServerRates(prefill_tok_s=100.0, swap_bytes_per_s=1e6, kv_bytes_per_token=1000.0)


def ctx(history: tuple[float, ...] = (), retained: int = 500, queue: float | None = None
        ) -> PauseContext:
    return PauseContext("r", "t", "bash", None, retained, True, "interactive",
                        history_s=history, rates=RATES, queue_delay_s=queue)


def test_cold_start_takes_the_tool_as_exp1_and_pins_for_ln_of_the_benefit() -> None:
    p = make_policy("continuum")
    d = p.decide(ctx())  # reload 500 tokens at 100 tok/s = 5 s, no queueing measured yet
    assert (d.action, d.after) == (KEEP, KEEP_EVICTABLE)
    assert d.ttl_s == pytest.approx(math.log(5.0))
    d = make_policy("continuum", {"eta": "0.5"}).decide(ctx(queue=2.0))
    assert d.ttl_s == pytest.approx(math.log(6.0))  # 2 s x 0.5 + 5 s


def test_a_benefit_under_a_second_leaves_the_context_at_once() -> None:
    d = make_policy("continuum").decide(ctx(retained=50))  # reload 0.5 s
    assert d.action == KEEP_EVICTABLE and d.ttl_s is None
    assert "tau*=0" in d.reason


def test_with_history_tau_maximises_cdf_times_benefit_less_tau() -> None:
    # benefit 5 s: tau 0 -> 0, 1 -> 0.25, 2 -> 0.5, 3 -> 0.75, 10 -> -5
    p = make_policy("continuum", {"min_history": "4"})
    d = p.decide(ctx(history=(10.0, 2.0, 1.0, 3.0)))
    assert d.ttl_s == 3.0 and "P(T<=3s)=0.75" in d.reason
    h = History(0)
    for x in (10.0, 2.0, 1.0, 3.0):
        h.add(x)
    assert p.decide(ctx(history=h)).ttl_s == 3.0  # the sorted window gives the same
    # every tool far longer than the benefit: pinning never pays
    assert p.decide(ctx(history=(60.0, 70.0, 80.0, 90.0))).action == KEEP_EVICTABLE


def test_reload_is_the_restore_when_the_expiry_swaps() -> None:
    d = make_policy("continuum", {"after": "swap"}).decide(ctx())
    # 500 tokens x 1000 B at 1 MB/s = 0.5 s: below a second, so no pin
    assert d.action == SWAP and d.ttl_s is None


def test_policy_arguments_are_checked() -> None:
    with pytest.raises(InputError, match="after='keep'"):
        make_policy("continuum", {"after": "keep"})
    with pytest.raises(InputError, match="min_history"):
        make_policy("continuum", {"min_history": "2.5"})
    assert make_policy("ttl", {"after": "keep-evictable"}).decide(ctx()).after == KEEP_EVICTABLE


def test_recent_mean_is_the_mean_of_the_last_window() -> None:
    m = RecentMean(3)
    assert m.mean() is None
    for x in (1.0, 2.0, float("nan"), 3.0, 4.0):
        m.add(x)
    assert m.mean() == pytest.approx(3.0)  # 2, 3, 4; the NaN was no measurement
    with pytest.raises(ValueError):
        RecentMean(0)


def test_ttl_leaving_the_context_to_the_cache_unpins_it_at_tau(tmp_path: Path) -> None:
    rec, run, adapter = run_unslotted(tmp_path, "ttl", {"tau": "1", "after": "keep-evictable"})
    assert adapter.pause_log == [("hold", "a"), ("unpin", "a"), ("release", "a")]
    assert resumed_cached(rec) == 105  # nothing pressed on the cache
    kv = rec[(rec.event == "kv_state") & (rec.status == "evictable")]
    assert kv.kv_tokens.tolist() == [105]
    assert run["cleanup"]["held_left"] == []


def test_ttl_leaving_the_context_to_the_cache_loses_it_to_pressure(tmp_path: Path) -> None:
    rec, _, _ = run_unslotted(tmp_path / "late", "ttl", {"tau": "1", "after": "keep-evictable"},
                              pressure_at_s=1.5)
    assert resumed_cached(rec) == 0
    rec, _, _ = run_unslotted(tmp_path / "early", "ttl",
                              {"tau": "1", "after": "keep-evictable"}, pressure_at_s=0.5)
    assert resumed_cached(rec) == 105  # still pinned when the pressure came


def test_simulated_ttl_leaves_the_context_to_the_cache_at_tau(tmp_path: Path) -> None:
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "ttl", paged(1000),
                {"tau": "0.5", "after": "keep-evictable"})
    assert ev(df, "kv_state")["status"].tolist() == ["active", "paused", "evictable", "active",
                                                     "released"]
    left = ev(df, "kv_state").iloc[2]
    assert left["kv_tokens"] == 110
    assert float(left["t_ns"]) / 1e9 == pytest.approx(t_s(df, "tool_start", "a") + 0.5)
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (34, 96)  # as keep-evictable's


def test_simulated_pin_that_stops_admission_of_an_idle_engine_is_released(
        tmp_path: Path) -> None:
    path = trace(tmp_path, PRESSED, starts={"a": 0.0, "b": 1.0})
    df, _ = sim(tmp_path, path, "ttl", paged(960), {"tau": "5", "after": "keep-evictable"},
                arrivals=Arrivals("trace", 2))
    # b (900 tokens) fits only without a's pin; nothing runs, so the valve releases it to the
    # cache at once rather than let b wait 5 s for the expiry, and a's hint is clipped
    assert t_s(df, "call_start", "b") == 1.0
    hint = ev(df, "hint_outcome", "a").iloc[0]
    assert (hint["status"], hint["reason"]) == ("clipped", "valve: latest-program")
    assert hint["held_s"] == pytest.approx(1.0 - t_s(df, "tool_start", "a"))
    end = ev(df, "call_end", "a").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (82, 48)  # then lost as evictable


def test_simulated_continuum_needs_an_engine_with_a_cache(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="keep-evictable"):
        sim(tmp_path, trace(tmp_path, ONE), "continuum", Capacity(slots=2, ctx_per_slot=512))
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "continuum", Capacity(slots=2, ctx_per_slot=512),
                {"after": "recompute"}, name="slots")
    assert ev(df, "pause_decision")["reason"].str.startswith("continuum").all()


def test_simulator_feeds_the_queueing_delay_of_contexts_it_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recompute loses every context: the second pause of a trajectory sees the first
    resume's wait for admission (0 on an idle engine), where the first saw none yet."""
    two = {"a": [llm(100, 10), tool(1.0), llm(20, 5), tool(1.0), llm(20, 5)]}
    seen: list[float | None] = []

    class Spy:
        name, sees_true_latency, holds = "spy", False, False

        def decide(self, c: PauseContext) -> Decision:
            seen.append(c.queue_delay_s)
            return Decision("recompute", "spy")

    monkeypatch.setattr("harness.simulate.run.make_policy", lambda name, args=None: Spy())
    sim(tmp_path, trace(tmp_path, two), "recompute", paged(1000))
    assert seen == [None, 0.0]


@pytest.mark.parametrize("slotted", [True, False])
def test_replay_feeds_the_queueing_delay_of_contexts_it_lost(tmp_path: Path, slotted: bool
                                                             ) -> None:
    """The second pause sees the first resumed call's time to first token less the server's
    prompt time (the in-memory server's first decode step, 10 ms), the first pause none; a
    context kept through its pause adds nothing."""
    import asyncio

    from harness.plan.planner import CallStep, ToolStep, TrajectoryPlan
    from harness.plan.tokens import stable_seed
    from harness.records.manifest import RunManifest
    from harness.replay.clock import VirtualClock
    from harness.replay.runner import ReplaySettings, replay
    from tests.fakes.memory_adapter import MemoryAdapter
    from tests.unit.test_executor import RATES as EXEC_RATES
    from tests.unit.test_executor import plan_of

    def tool_step(i: int) -> ToolStep:
        return ToolStep(i, "search", "remote_read", 1.0, 10.0, "ok", False, True)

    t = TrajectoryPlan("a", 0.0, "interactive", "t", (
        CallStep(0, 100, stable_seed("a", 0), 5), tool_step(1),
        CallStep(2, 10, stable_seed("a", 2), 5), tool_step(3),
        CallStep(4, 10, stable_seed("a", 4), 5), tool_step(5),
        CallStep(6, 10, stable_seed("a", 6), 5)))

    def seen_by(actions: list[str]) -> list[float | None]:
        seen: list[float | None] = []

        class Spy:
            name, sees_true_latency = "spy", False

            def decide(self, c: PauseContext) -> Decision:
                seen.append(c.queue_delay_s)
                return Decision(actions[len(seen) - 1], "spy")

        async def go() -> None:
            clock = VirtualClock()
            await replay(MemoryAdapter(clock, slotted=slotted), clock, plan_of(t), Spy(),
                         tmp_path / f"{slotted}-{'-'.join(actions)}",
                         RunManifest(run_id="r", policy="spy"), EXEC_RATES, ReplaySettings(0.5))

        asyncio.run(go())
        return seen

    assert seen_by(["recompute", "recompute", "recompute"]) == [None, pytest.approx(0.01),
                                                                pytest.approx(0.01)]
    assert seen_by(["keep", "recompute", "keep"]) == [None, None, pytest.approx(0.01)]


def test_program_order_priorities_put_pinned_calls_and_earlier_tasks_first(tmp_path: Path
                                                                           ) -> None:
    """continuum on a server that schedules by priority: each call carries its task's arrival
    rank, offset unless its context was still pinned; the tasks' sub-agents share the rank.
    On a server that cannot, no priority is sent and the summary says it did not run."""
    import asyncio

    from harness.records.manifest import RunManifest
    from harness.records.store import read_json
    from harness.replay.clock import VirtualClock
    from harness.replay.runner import ReplaySettings, replay
    from tests.fakes.memory_adapter import MemoryAdapter
    from tests.unit.test_executor import RATES as EXEC_RATES
    from tests.unit.test_executor import plan_of, traj

    def run(priority: bool, out: str) -> MemoryAdapter:
        async def go() -> MemoryAdapter:
            clock = VirtualClock()
            adapter = MemoryAdapter(clock, slotted=False, call_priority=priority)
            # a 2 s tool against Exp(1) and a 0.105-s reload: no pin (tau* = 0), so every
            # resumed call lost its context
            await replay(adapter, clock, plan_of(traj("a"), traj("b", arrival=0.5),
                                                 concurrency=1),
                         make_policy("continuum"), tmp_path / out,
                         RunManifest(run_id="r", policy="continuum"), EXEC_RATES,
                         ReplaySettings(0.5))
            return adapter
        return asyncio.run(go())

    adapter = run(True, "ordered")
    assert [(c.session, c.priority) for c in adapter.calls] == [
        ("a", 1_000_000), ("a", 1_000_000), ("b", 1_000_001), ("b", 1_000_001)]
    assert "program order" not in " ".join(read_json(tmp_path / "ordered" /
                                                     "summary.json")["warnings"])
    adapter = run(False, "plain")
    assert {c.priority for c in adapter.calls} == {None}
    assert any("program order" in w for w in read_json(tmp_path / "plain" /
                                                       "summary.json")["warnings"])


def test_call_priority_orders_pinned_first_then_by_task() -> None:
    from harness.policies.base import call_priority, program_order

    assert call_priority(3, True) < call_priority(0, False) < call_priority(1, False)
    assert program_order(make_policy("continuum")) and not program_order(make_policy("ttl"))


def test_simulated_program_order_admits_earlier_tasks_first(tmp_path: Path) -> None:
    """b fills the pool while a (resuming after its tool) and c (a later task's first call)
    wait: first come first served admits c first, program order a (the earlier task)."""
    three = {"a": [llm(20, 4), tool(0.1), llm(4, 4)], "b": [llm(880, 60)],
             "c": [llm(20, 4)]}
    path = trace(tmp_path, three, starts={"a": 0.0, "b": 0.01, "c": 0.05})

    def order(policy: str, args: dict[str, str]) -> list[str]:
        df, _ = sim(tmp_path, path, policy, paged(960), args, arrivals=Arrivals("trace", 3),
                    name=policy)
        return ev(df, "call_start").sort_values("seq")["trajectory_id"].tolist()

    assert order("continuum", {"after": "recompute"}) == ["a", "b", "a", "c"]
    assert order("recompute", {}) == ["a", "b", "c", "a"]


def test_program_order_can_be_turned_off() -> None:
    from harness.policies.base import program_order

    assert not program_order(make_policy("continuum", {"program_order": "0"}))
    assert program_order(make_policy("continuum", {"program_order": "true"}))
    with pytest.raises(InputError, match="must be 0, 1, true or false"):
        make_policy("continuum", {"program_order": "maybe"})


def test_the_warning_follows_the_run_s_own_policy_arguments() -> None:
    from harness.policies.builtin import wants_program_order

    assert wants_program_order("continuum", {})
    assert not wants_program_order("continuum", {"program_order": "0"})
    assert not wants_program_order("ttl", {}) and not wants_program_order(None)
    assert not wants_program_order("continuum", {"eta": "nan"})  # a run it could not have been
