"""The pin-release valve inside a real SGLang server's scheduler (CPU engine, tiny random-weight
Llama, a 1,024-token KV pool): four agents under keep pin their contexts in streaming sessions
through long tool pauses until the pool is nearly full; the first to resume must grow past what
is left. Without the valve nothing runs and nothing is admitted for ever; with it the scheduler
closes the session of the program that arrived last, every call is served, and the released
pause is recorded as a `clipped` hint_outcome with the valve's reason and how long it was held.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.http import connect
from harness.adapters.launchers.sglang_server import (
    LocalSglangServer,
    SglangServerConfig,
    sglang_model,
    sglang_python,
)
from harness.adapters.sglang import SglangAdapter
from harness.errors import ServerError
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from tests.live.test_sglang_live import UNSUPPORTED, _started

pytestmark = [pytest.mark.live, pytest.mark.sglang]

POOL = 1024
VOCAB = 2048
BOUND_S = 40.0  # the whole run; without the valve it never ends
# Each agent pins ~200 tokens; the first to resume appends 260 more.
PAUSES = {"a": 3.0, "b": 7.0, "c": 7.0, "d": 5.0}


@pytest.fixture(scope="module")
def valve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSglangServer]:
    try:
        python = sglang_python()
        model = sglang_model(python)
    except ServerError as exc:
        pytest.fail(f"{UNSUPPORTED}: {exc}")
    log = tmp_path_factory.mktemp("sglang-valve") / "server.log"
    cfg = SglangServerConfig(model=model, max_total_tokens=POOL, pin_release="latest-program")
    with _started(cfg, log, python) as server:
        print(f"SGLang with the pin-release valve started in {server.start_s:.1f} s")
        yield server


def _plan() -> Plan:
    trajectories = []
    for i, (name, pause) in enumerate(PAUSES.items()):
        tid = f"agent-{name}"
        trajectories.append(TrajectoryPlan(tid, 0.3 * i, "interactive", "live", (
            CallStep(0, 196, stable_seed(tid, 0), 4),
            ToolStep(1, "build", "local_exec", pause, 60.0, "ok", False, True),
            CallStep(2, 260 if name == "a" else 16, stable_seed(tid, 2), 4))))
    return Plan(tuple(trajectories), (), Arrivals(mode="trace", concurrency=4), 0, Injection())


def test_the_valve_releases_the_latest_program_and_every_call_is_served(
        valve_server: LocalSglangServer, tmp_path: Path) -> None:
    out = tmp_path / "pressure"
    manifest = RunManifest(run_id="live-valve", policy="keep")

    async def go() -> None:
        async with connect(valve_server.url, 8) as http:
            ad = SglangAdapter(http, salt=manifest.run_id, vocab_size=VOCAB)
            await asyncio.wait_for(replay(
                ad, RealClock(), _plan(), make_policy("keep", {}), out, manifest,
                FALLBACK_RATES, ReplaySettings(0.1)), BOUND_S)

    t0 = time.monotonic()
    asyncio.run(go())
    wall = time.monotonic() - t0
    rec = read_records(out)
    calls = rec[rec.event == "call_end"]
    print(f"pin pressure: the run took {wall:.1f} s; calls {calls.status.tolist()}")
    assert wall < BOUND_S
    assert len(calls) == 8 and (calls.status == "ok").all()
    hints = rec[rec.event == "hint_outcome"].set_index("trajectory_id")
    print(hints[["status", "reason", "held_s"]])
    assert len(hints) == 4
    clipped = hints[hints.status == "clipped"]
    # the program that arrived last is released first, once, and the rest stay held
    assert list(clipped.index) == ["agent-d"]
    assert clipped.reason.iloc[0] == "valve: latest-program"
    assert 0.0 < clipped.held_s.iloc[0] < PAUSES["d"]
    assert (hints.drop(index="agent-d").status == "accepted").all()
    log = valve_server.log_path.read_text(errors="replace")
    assert re.search(r"pin-release valve \(latest-program\): closed session "
                     r"live-valve/agent-d/\d+ \(\d+ tokens\) -- a waiting request", log)
    assert len(re.findall(r"pin-release valve", log)) == 1
    assert manifest.to_dict()["cleanup"]["held_left"] == []
