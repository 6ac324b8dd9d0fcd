"""Pause policies replayed against a real vLLM server (CPU build, tiny random-weight Llama).

vLLM is installed into its own cached virtualenv on first use (idempotent), the model is made
locally, and each server is started here and stopped (its whole process group) at the end.
Cache reuse is asserted with the server's own numbers (`usage.prompt_tokens_details`), at vLLM's
granularity: only full 32-token blocks are reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.adapters.base import CompletionRequest, CompletionResult
from harness.adapters.http import connect
from harness.adapters.launchers.process import remove_leaked_shm, shm_entries
from harness.adapters.launchers.vllm_server import (
    LEAKED_SHM,
    LocalVllmServer,
    VllmServerConfig,
    vllm_model,
    vllm_python,
)
from harness.adapters.models import local_vocab
from harness.adapters.vllm import VllmAdapter
from harness.cli import main
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import replay
from tests.live.traces import write_one_pause_trace

pytestmark = pytest.mark.live

BLOCK = 32  # VllmServerConfig.block_size: reuse is counted in whole blocks


@pytest.fixture(scope="module")
def vllm_env() -> tuple[Path, Path]:
    """The vLLM virtualenv's python and the tiny model (installed / made once, cached)."""
    python = vllm_python()
    return python, vllm_model(python)


@contextlib.contextmanager
def _started(cfg: VllmServerConfig, log: Path, python: Path) -> Iterator[LocalVllmServer]:
    """A running server; on exit it is stopped and checked: no process, no files left."""
    server = LocalVllmServer(cfg, log, python=python)
    before = shm_entries()
    with server:
        yield server
    assert not server.group_alive(), "vLLM processes left after stop"
    assert not server.tmp_dir.exists()
    left = remove_leaked_shm(before, LEAKED_SHM)  # what stop() would have missed
    assert left == [], f"shared memory left after stop: {left}"


@pytest.fixture(scope="module")
def vllm_server(vllm_env: tuple[Path, Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVllmServer]:
    python, model = vllm_env
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with _started(VllmServerConfig(model=model), log, python) as server:
        yield server


def _traj(tid: str, latency: float | None, deadline: float = 3.0) -> TrajectoryPlan:
    # 100-token prompt, then +4 generated +16 appended, then +4 +4: every resume stays within
    # the prompt's last full block, so a disk-stored prompt matches (see the swap test).
    return TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 100, stable_seed(tid, 0), 4),
        ToolStep(1, "search", "remote_read", latency, deadline,
                 "ok" if latency is not None else "abandoned", False, True),
        CallStep(2, 16, stable_seed(tid, 2), 4),
        ToolStep(3, "cat", "local_read", 0.1, deadline, "ok", False, True),
        CallStep(4, 4, stable_seed(tid, 4), 4),
    ))


def _plan(*trajs: TrajectoryPlan, concurrency: int = 3) -> Plan:
    return Plan(trajs, (), Arrivals(mode="closed", concurrency=concurrency), 0, Injection())


def _resumed(rec: pd.DataFrame) -> pd.DataFrame:
    ends = rec[(rec.event == "call_end") & (rec.step > 0)][
        ["trajectory_id", "step", "cached_tokens", "prompt_n", "status"]]
    dec = rec[rec.event == "pause_decision"][["trajectory_id", "step", "action",
                                               "retained_tokens", "status"]].copy()
    dec["step"] = dec["step"] + 1
    return ends.merge(dec, on=["trajectory_id", "step"], suffixes=("", "_decision"))


async def _metric(ad: VllmAdapter, name: str) -> float:
    return sum(v for _, n, _, v in await ad.scrape() if n == name)


def _replay(url: str, plan: Plan, policy: str, out: Path, run_id: str,
            wrap: Callable[[VllmAdapter], Any] = lambda a: a
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    run = RunManifest(run_id=run_id, policy=policy)

    async def go() -> None:
        async with connect(url, 8) as http:
            adapter = VllmAdapter(http, salt=run_id)
            await replay(wrap(adapter), RealClock(), plan, make_policy(policy), out, run,
                         FALLBACK_RATES, 0.1)

    asyncio.run(go())
    return read_records(out), run.to_dict()


@pytest.mark.parametrize("policy", ["keep", "recompute"])
def test_keep_and_recompute_for_real(vllm_server: LocalVllmServer, tmp_path: Path,
                                     policy: str) -> None:
    plan = _plan(_traj("v-a", 0.3), _traj("v-b", 0.2), _traj("v-gone", None, 0.5))
    rec, run = _replay(vllm_server.url, plan, policy, tmp_path / policy, f"live-{policy}")
    assert run["outcome"] == {"completed": 2, "cancelled": 1, "failed": 0,
                              "unsupported_actions": 0, "server_failed": 0, "interrupted": 0}
    assert run["vocab_size"] == 2048 and run["slots"] is None
    resumed = _resumed(rec)
    assert len(resumed) == 4 and (resumed.status == "ok").all()
    for r in resumed.itertuples():
        if policy == "keep":  # every full block of the retained context is reused
            assert r.cached_tokens == (r.retained_tokens - 1) // BLOCK * BLOCK, r
        else:  # a fresh cache salt: nothing reused, the whole prompt prefilled
            assert r.cached_tokens == 0 and r.prompt_n >= r.retained_tokens, r
    salts = rec[(rec.event == "erase") & rec.reason.str.contains("fresh cache salt", na=False)]
    n_pauses = int((rec.event == "pause_decision").sum())  # 2 + 2 + 1 (the abandoned tool)
    assert len(salts) == (n_pauses if policy == "recompute" else 0) and n_pauses == 5
    gone = rec[rec.trajectory_id == "v-gone"]
    assert gone[gone.event == "trajectory_end"].status.tolist() == ["cancelled"]
    assert run["cleanup"] == {"slots_idle": True, "dump_files_left": None, "errors": [],
                              "remote_dumps_left": [], "errors_total": 0}
    assert read_json(tmp_path / policy / "summary.json")["resume_latency_ms"]["n"] == 4


def test_run_command_against_a_running_server(vllm_server: LocalVllmServer,
                                              tmp_path: Path) -> None:
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--runtime", "vllm", "--url", vllm_server.url,
                                    "--trace", str(trace), "--policy", "keep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["runtime"] == "vllm" and run["status"] == "finished"
    assert run["outcome"]["completed"] == 1 and "not pinned" in run["server_policy"]
    rec = read_records(out)
    assert rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0] == 64
    assert any((out / "server_metrics").glob("part-*.parquet"))


class _EvictBeforeEachCall:
    """Drops the server's local prefix cache before every call, as memory pressure would."""

    def __init__(self, inner: VllmAdapter) -> None:
        self.inner = inner
        self.runtime = inner.runtime
        self.capabilities = inner.capabilities

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        assert await self.inner.reset_prefix_cache()
        return await self.inner.complete(req, on_tokens)


def test_swap_via_disk_connector(vllm_env: tuple[Path, Path], vllm_server: LocalVllmServer,
                                 tmp_path: Path) -> None:
    """With ExampleConnector the KV written to disk comes back after the device copy is gone;
    without it (the keep server) nothing does."""
    python, model = vllm_env
    plan = _plan(_traj("s-a", 0.1), concurrency=1)
    control, _ = _replay(vllm_server.url, plan, "keep", tmp_path / "control", "ctl",
                         _EvictBeforeEachCall)
    assert (_resumed(control).cached_tokens == 0).all()
    cfg = VllmServerConfig(model=model, connector="ExampleConnector")
    with _started(cfg, tmp_path / "swap.log", python) as server:
        assert server.store_dir is not None
        rec, run = _replay(server.url, plan, "keep", tmp_path / "swap", "swap",
                           _EvictBeforeEachCall)
        resumed = _resumed(rec)
        assert len(resumed) == 2 and run["outcome"]["completed"] == 1
        # the 100-token prompt's first 3 blocks were stored on disk and loaded back twice
        assert resumed.cached_tokens.tolist() == [96, 96]
        assert any(server.store_dir.iterdir())

        async def hits() -> float:
            async with connect(server.url, 8) as http:
                return await _metric(VllmAdapter(http),
                                     "vllm:external_prefix_cache_hits_total")

        assert asyncio.run(hits()) == 192


def test_memory_pressure_evicts_kept_blocks(vllm_env: tuple[Path, Path],
                                            tmp_path: Path) -> None:
    """A 12-block pool (contexts up to 320 tokens): concurrent requests are preempted, and a
    paused request's kept blocks are evicted (keep is not a pin on vLLM). Each of the four
    requests grows to 7 blocks, so any two that overlap at all (even arriving staggered on a
    loaded machine) preempt."""
    python, model = vllm_env
    cfg = VllmServerConfig(model=model, max_model_len=320, num_gpu_blocks_override=12)
    vocab = local_vocab(model)
    with _started(cfg, tmp_path / "pressure.log", python) as server:
        async def go() -> tuple[CompletionResult, CompletionResult, list[CompletionResult],
                                float]:
            async with connect(server.url, 8) as http:
                ad = VllmAdapter(http, salt="pressure", vocab_size=vocab)
                prompt = list(range(300, 400))
                first = await ad.complete(CompletionRequest(prompt, 4), lambda: None)
                others = await asyncio.gather(*(ad.complete(CompletionRequest(
                    [500 + 10 * i + k % 7 for k in range(96)], 120), lambda: None)
                    for i in range(4)))
                resumed = await ad.complete(CompletionRequest(
                    prompt + first.tokens + list(range(700, 716)), 4), lambda: None)
                return first, resumed, list(others), await _metric(
                    ad, "vllm:num_preemptions_total")

        first, resumed, others, preemptions = asyncio.run(go())
        assert all(o.status == "ok" and len(o.tokens) == 120 for o in others)
        assert preemptions > 0
        assert first.status == resumed.status == "ok"
        assert resumed.cached_tokens is not None and resumed.cached_tokens < 96
