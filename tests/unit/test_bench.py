"""`harness bench` as data: every input checked before the first replay, policy arguments
scoped to their policy, one CPU pinning for every policy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.bench.plan import plan_bench
from harness.bench.run import check_same_pinning, run_bench
from harness.cli import main
from harness.errors import InputError
from harness.metrics.summary_types import read_summary
from harness.records.manifest import CpuPinning, RunManifest, read_manifest
from harness.records.store import read_json
from harness.replay import pinning
from harness.replay.named_policies import scoped_policy_args
from harness.specs.bench import BenchSpec
from tests.fakes.runtime import MemoryRuntime
from tests.live.traces import write_one_pause_trace


@pytest.fixture(autouse=True)
def _restore_affinity() -> Iterator[None]:
    """A bench pins this process to one CPU: give the test process all of them back."""
    before = pinning.available_cpus()
    yield
    if before and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(before))


def _spec(trace: Path, policies: str, out: Path, **inputs: Any) -> BenchSpec:
    """A bench on the stand-in runtime (not one `--runtime` names: the spec is built as is)."""
    return BenchSpec(runtime="memory", trace=trace, policies=policies, out=out, concurrency=2,
                     scrape_interval=0.05, **inputs)


def test_policy_arguments_go_to_the_policies_that_take_them() -> None:
    got = scoped_policy_args(["keep", "ttl", "threshold"],
                             ("ttl.tau=2", "quantile=0.9", "threshold.keep_max_s=3"))
    assert got == {"keep": {}, "ttl": {"tau": "2", "quantile": "0.9"},
                   "threshold": {"quantile": "0.9", "keep_max_s": "3"}}


@pytest.mark.parametrize(("policies", "args", "message"), [
    ("keep,swap", ("ttl.tau=2",), "the bench does not run 'ttl'"),
    ("keep,ttl", ("bogus=1",), "no policy of the bench takes 'bogus'"),
    ("keep,ttl", ("ttl.bogus=1",), "policy 'ttl' takes no argument 'bogus'"),
    ("keep,ttl", ("ttl.tau=-1",), "must be a finite number > 0"),
    ("keep,nope", (), "unknown policy nope"),
    ("keep,keep", (), "a policy is named twice"),
])
def test_bad_policies_and_arguments_are_refused_before_anything_starts(
        tmp_path: Path, policies: str, args: tuple[str, ...], message: str) -> None:
    runtime = MemoryRuntime()
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    with pytest.raises(InputError, match=message):
        plan_bench(_spec(trace, policies, tmp_path / "b", policy_args=args), lambda _: runtime)
    assert runtime.started == []


def test_a_bad_trace_or_injection_is_refused_before_anything_starts(tmp_path: Path) -> None:
    runtime = MemoryRuntime()
    with pytest.raises(InputError):
        plan_bench(_spec(tmp_path / "missing.parquet", "keep", tmp_path / "b"),
                   lambda _: runtime)
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    with pytest.raises(InputError):
        plan_bench(_spec(trace, "keep", tmp_path / "b", inject="no-such-profile"),
                   lambda _: runtime)
    assert runtime.started == []


def test_every_policy_of_a_bench_runs_under_one_pinning(tmp_path: Path) -> None:
    cpus = pinning.available_cpus()
    runtime = MemoryRuntime()
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    plan = plan_bench(_spec(trace, "keep,swap,recompute", tmp_path / "b"), lambda _: runtime)
    expected = pinning.decide(cpus, True, True)
    assert plan.pinning == expected
    result = run_bench(plan, lambda _: None)
    assert [p for p, _ in result.rows()] == ["keep", "swap", "recompute"]
    manifests = [read_manifest(tmp_path / "b" / p) for p in ("keep", "swap", "recompute")]
    assert [m.status for m in manifests] == ["finished"] * 3
    assert [m.cpu_pinning for m in manifests] == [expected] * 3
    assert [o.server_cpus for o in runtime.started] == [
        expected.server if expected else None] * 3
    assert runtime.stopped == 3 and (tmp_path / "b" / "report.html").is_file()
    if expected is not None:  # a 2+ CPU machine: the harness holds its CPU, the server the rest
        assert pinning.available_cpus() == expected.harness


def test_runs_under_different_pinning_are_not_comparable() -> None:
    same = [RunManifest(cpu_pinning=CpuPinning([0], "1")) for _ in range(2)]
    check_same_pinning(same)
    with pytest.raises(RuntimeError, match="different CPU pinning"):
        check_same_pinning([*same, RunManifest(cpu_pinning=None)])


def test_pinning_is_decided_from_the_cpus_alone() -> None:
    assert pinning.decide([0, 1, 2], True, True) == CpuPinning([0], "1,2")
    assert pinning.decide([0], True, True) is None
    assert pinning.decide([0, 1], False, True) is None  # a remote server: nothing to pin
    assert pinning.decide([0, 1], True, False) is None  # the runtime pins itself


def test_the_bench_command_refuses_a_misplaced_argument_in_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "--policies", "keep,swap", "--policy-arg",
                                    "ttl.tau=2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: --policy-arg ttl.tau=2: the bench does not run 'ttl' (--policies keep,swap)"]


def test_the_replay_runs_on_the_loop_run_json_names(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop where installed (it is a dependency), asyncio's own loop when asked for."""
    from harness.replay import loop

    trace = write_one_pause_trace(tmp_path / "t.parquet")
    for forced, expect in (("", "uvloop"), ("asyncio", "asyncio")):
        monkeypatch.setenv("HARNESS_EVENT_LOOP", forced)
        runtime = MemoryRuntime()
        plan = plan_bench(_spec(trace, "keep", tmp_path / f"b-{expect}"),
                          lambda _, rt=runtime: rt)
        run_bench(plan, lambda _: None)
        assert [m.split(".")[0] for m in runtime.loops] == [expect]
        assert str(read_manifest(tmp_path / f"b-{expect}" / "keep").event_loop).startswith(
            expect)
        assert loop.loop_name().startswith(expect)


def test_repeats_run_round_by_round_and_record_each_policys_spread(tmp_path: Path) -> None:
    runtime = MemoryRuntime()
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    plan = plan_bench(_spec(trace, "keep,recompute", tmp_path / "b", repeats=2),
                      lambda _: runtime)
    result = run_bench(plan, lambda _: None)
    assert [p for p, _ in result.rows()] == ["keep#1", "recompute#1", "keep#2", "recompute#2"]
    assert [r.summary for r in result.replays] == [
        read_summary(r.out) for r in result.replays]  # what each replay wrote
    for policy in ("keep", "recompute"):
        doc = read_json(tmp_path / "b" / policy / "repeats.json")
        assert result.spreads[policy] == doc
        assert doc["summaries_read"] == 2
        assert doc["repeats"] == [str(tmp_path / "b" / policy / f"repeat-{k}") for k in (1, 2)]
        resume = doc["metrics"]["resume_latency_ms.p50"]
        lo, hi = sorted(resume["values"])
        assert (resume["min"], resume["max"]) == (lo, hi)
        assert resume["spread"] == pytest.approx((hi - lo) / resume["median"])
    report = (tmp_path / "b" / "report.html").read_text()
    diffs = report[report.index("id='differences'"):report.index("id='instrument'")]
    assert diffs.count("<h3>") == 3  # the other three replays against keep's first
    assert runtime.stopped == 4


def test_an_engine_replay_is_simulated_on_the_pool_its_server_reported() -> None:
    from harness.bench.run import engine_pool, simulable_policy
    from harness.model.calibration import resolve_calibration
    from harness.simulate.server import Capacity

    def run(runtime: str, extra: dict[str, object]) -> RunManifest:
        return RunManifest(run_id="r", runtime=runtime, server_version="0", model={},
                           policy="keep", server_extra=extra)

    vllm = run("vllm", {"cache_config": {"block_size": "32", "num_gpu_blocks": "81"}})
    assert engine_pool(vllm) == Capacity(tokens=2560, engine="vllm", block_size=32)  # null block
    sglang = run("sglang", {"page_size": 1, "max_total_num_tokens": 2560})
    assert engine_pool(sglang) == Capacity(tokens=2560, engine="sglang", block_size=1)
    assert engine_pool(run("vllm", {})) is None
    assert engine_pool(run("llamacpp", {})) is None
    v, s = resolve_calibration("vllm-tiny-cpu"), resolve_calibration("sglang-tiny-cpu")
    assert simulable_policy("keep-evictable", {}, v, "vllm")
    assert not simulable_policy("keep-evictable", {}, v, "llamacpp")
    assert simulable_policy("swap", {}, v, "vllm")
    assert not simulable_policy("swap", {}, s, "sglang")  # no swap there
    assert simulable_policy("ttl", {"after": "recompute"}, s, "sglang")
    assert not simulable_policy("keep-preferred", {}, s, "sglang")  # the server's own


def test_too_few_slots_for_sub_agents_is_refused_before_a_calibration(tmp_path: Path) -> None:
    runtime = MemoryRuntime()
    # 6 agents of the shipped sub-agent sample, each parent beside its children, on 2 slots
    spec = _spec(Path("traces/coding-subagents.parquet"), "keep", tmp_path / "b", slots=2)
    with pytest.raises(InputError, match="sub-agents need up to"):
        plan_bench(spec, lambda _: runtime)
    assert runtime.started == []
