"""A parent that spawns two sub-agents, replayed against a real llama-server under every fixed
policy: the children run at once in slots of their own, the parent waits for both and resumes,
and the server's own cached-token counts (timings.cache_n) confirm each pause's action and a
context cut (keep_tokens)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.adapters.http import connect
from harness.adapters.launchers.llamacpp_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    default_model,
)
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay

pytestmark = pytest.mark.live
REUSE_SLACK = 2  # the last generated token is never evaluated


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLlamaServer]:
    """Three slots: a parent that keeps its slot while both its children hold one each."""
    log = tmp_path_factory.mktemp("llama-sub") / "server.log"
    cfg = LlamaServerConfig(model=default_model(), slots=3, ctx_per_slot=1024)
    with LocalLlamaServer(cfg, log) as server:
        yield server


def _child(tid: str) -> TrajectoryPlan:
    return TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 64, stable_seed(tid, 0), 4),
        ToolStep(1, "grep", "local_read", 0.2, 5.0, "ok", False, True),
        CallStep(2, 8, stable_seed(tid, 2), 4),
    ), parent_id="live-p")


def _plan() -> Plan:
    parent = TrajectoryPlan("live-p", 0.0, "interactive", "live", (
        CallStep(0, 96, stable_seed("live-p", 0), 4),
        ToolStep(1, "Task", "subagent", 0.1, math.inf, "ok", False, True,
                 children=(_child("live-p/a"), _child("live-p/b"))),
        # the trace says this call shares only the first 64 tokens of the context
        CallStep(2, 16, stable_seed("live-p", 2), 4, keep_tokens=64),
    ))
    return Plan((parent,), (), Arrivals(mode="closed", concurrency=1), 0, Injection())


def _replay(server: LocalLlamaServer, policy: str, out: Path
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    run = RunManifest(run_id=f"live-sub-{policy}", policy=policy)

    async def go() -> None:
        async with connect(server.url, 8) as http:
            adapter = LlamaCppAdapter(http, dump_dir=server.dump_dir)
            await replay(adapter, RealClock(), _plan(), make_policy(policy), out, run,
                         FALLBACK_RATES, ReplaySettings(
                             0.1, lambda: server.leftover_dumps(str(run.run_id))))

    asyncio.run(go())
    return read_records(out), run.to_dict()


@pytest.mark.parametrize("policy", ["keep", "swap", "recompute"])
def test_subagents_run_beside_each_other_and_the_parent_resumes(
        llama_server: LocalLlamaServer, tmp_path: Path, policy: str) -> None:
    rec, run = _replay(llama_server, policy, tmp_path / policy)
    assert run["outcome"]["completed"] == 3 and run["outcome"]["failed"] == 0

    def at(event: str, tid: str) -> pd.DataFrame:
        return rec[(rec.event == event) & (rec.trajectory_id == tid)]

    t0 = at("tool_start", "live-p").t_ns.iloc[0]
    kids = ("live-p/a", "live-p/b")
    for k in kids:
        start = at("trajectory_start", k).iloc[0]
        assert start.parent_id == "live-p" and start.spawn_step == 1 and start.t_ns >= t0
    # concurrent: each child's first call began before the other child ended
    firsts = [at("call_start", k).t_ns.iloc[0] for k in kids]
    ends = [at("trajectory_end", k).t_ns.iloc[0] for k in kids]
    assert max(firsts) < min(ends)
    slots = {int(at("call_start", k).slot.iloc[0]) for k in kids}
    assert len(slots) == 2  # a slot each
    assert at("tool_end", "live-p").t_ns.iloc[0] >= max(ends)
    resumed = at("call_end", "live-p").iloc[-1]
    assert resumed.status == "ok"
    if policy == "recompute":
        assert resumed.cached_tokens <= 1
    else:  # the kept part of the context (keep_tokens 64), from the slot or its dump
        assert 64 - REUSE_SLACK <= resumed.cached_tokens <= 64
    summary = read_json(tmp_path / policy / "summary.json")
    assert summary["cache_mismatches"] == 0
    assert summary["trajectories"]["succeeded"] == 1
    assert summary["trajectories"]["subagents"]["succeeded"] == 2
    assert run["cleanup"]["slots_idle"] is True and run["cleanup"]["dump_files_left"] == []
    assert llama_server.leftover_dumps() == []
