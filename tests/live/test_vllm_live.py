"""Pause actions against a real vLLM server (CPU build, tiny random-weight Llama) running the
harness's KV connector.

vLLM is installed into its own cached virtualenv on first use (idempotent), the model is made
locally, and each server is started here and stopped (its whole process group) at the end.
Cache reuse is asserted with the server's own numbers (`usage.prompt_tokens_details`), at vLLM's
granularity of whole 32-token blocks. What the server holds is asked of the connector itself
(`status`). On the tiny random model the generated token ids match even with corrupt KV, so the
restored KV is checked by the resumed call's logprobs against a full recompute's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.adapters.base import CompletionRequest, PausedKv
from harness.adapters.http import HttpClient, connect
from harness.adapters.launchers.process import remove_leaked_shm, shm_entries
from harness.adapters.launchers.vllm_server import (
    LEAKED_SHM,
    LocalVllmServer,
    VllmServerConfig,
    vllm_model,
    vllm_python,
)
from harness.adapters.models import hf_geometry, kv_bytes_per_token
from harness.adapters.vllm import VllmAdapter, control_body
from harness.cli import main
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories
from tests.live.traces import write_one_pause_trace

pytestmark = pytest.mark.live

BLOCK = 32  # VllmServerConfig.block_size: reuse is counted in whole blocks


@pytest.fixture(scope="module")
def vllm_env() -> tuple[Path, Path]:
    """The vLLM virtualenv's python and the tiny model (installed / made once, cached)."""
    python = vllm_python()
    return python, vllm_model(python)


@pytest.fixture(scope="module")
def kv_bytes(vllm_env: tuple[Path, Path]) -> int:
    """The model's KV bytes per token, from its geometry (what a host copy must hold)."""
    value = kv_bytes_per_token(hf_geometry(vllm_env[1]))
    assert value is not None
    return int(value)


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


def _run(url: str, body: Any, salt: str | None = None) -> Any:
    """Run `body(adapter, http)` against the server at `url` on a fresh loop, the adapter's
    salt (and session prefix) `salt` or one of its own."""
    async def go() -> Any:
        async with connect(url, 8) as http:
            adapter = VllmAdapter(http, salt=salt or f"live-{time.monotonic_ns()}",
                                  vocab_size=2048)
            await adapter.server_info()
            return await body(adapter, http)

    return asyncio.run(go())


async def _everything_released(ad: VllmAdapter) -> None:
    """The connector holds nothing for anyone, and the server's KV cache is empty."""
    status = await ad.status("")
    assert (status["pins"], status["host"], status["host_bytes"]) == ([], [], 0), status
    assert status["worker_host_bytes"] in (0, None), status
    usage = [v for _, n, _, v in await ad.scrape() if n == "vllm:kv_cache_usage_perc"]
    assert usage == [0.0]


def _traj(tid: str, latency: float | None, deadline: float = 3.0) -> TrajectoryPlan:
    # 100-token prompt, then +4 generated +16 appended, then +4 +4.
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


@pytest.mark.parametrize(("policy", "args"), [
    ("keep", {}), ("keep-evictable", {}), ("swap", {}), ("recompute", {}),
    ("ttl", {"tau": "0.05", "after": "swap"})])
def test_each_pause_action_for_real(vllm_server: LocalVllmServer, kv_bytes: int,
                                    tmp_path: Path, policy: str, args: dict[str, str]) -> None:
    plan = _plan(_traj("v-a", 0.3), _traj("v-b", 0.2), _traj("v-gone", None, 0.5))
    run = RunManifest(run_id=f"live-{policy}", policy=policy)

    async def go(ad: VllmAdapter, _: HttpClient) -> None:
        await replay(ad, RealClock(), plan, make_policy(policy, args), tmp_path, run,
                     FALLBACK_RATES, ReplaySettings(0.1))
        await _everything_released(ad)

    _run(vllm_server.url, go)
    rec, manifest = read_records(tmp_path), run.to_dict()
    assert manifest["outcome"] == {"completed": 2, "cancelled": 1, "failed": 0,
                                   "unsupported_actions": 0, "server_failed": 0,
                                   "interrupted": 0}
    assert manifest["cleanup"]["held_left"] == [] and manifest["cleanup"]["errors"] == []
    resumed = _resumed(rec)
    assert len(resumed) == 4 and (resumed.status == "ok").all()
    for r in resumed.itertuples():
        if policy == "recompute":  # dropped and salted: nothing reused
            assert r.cached_tokens == 0 and r.prompt_n >= r.retained_tokens, r
        else:  # the whole context but its last, partly filled block
            assert r.cached_tokens == (r.retained_tokens - 1) // BLOCK * BLOCK, r
            assert r.cached_tokens >= r.retained_tokens - BLOCK, r
    outs = rec[rec.event == "swap_out"]
    n_pauses = int((rec.event == "pause_decision").sum())  # 2 + 2 + 1 (the abandoned tool)
    assert n_pauses == 5
    if policy in ("swap", "ttl"):  # every pause offloaded, with the server's own figures
        assert len(outs) == n_pauses and (outs.bytes > 0).all() and (outs.server_ms > 0).all()
        assert (outs.bytes == outs.retained_tokens * kv_bytes).all()
    else:
        assert outs.empty
    assert read_json(tmp_path / "summary.json")["resume_latency_ms"]["n"] == 4
    actions = manifest["server_extra"]["pause_actions"]["ops"]
    assert ("hold" in actions) == (policy in ("keep", "ttl"))
    assert ("offload" in actions) == (policy in ("swap", "ttl"))
    assert actions["release"] == 3


def _logprob_body(prompt: list[int], salt: str, session: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 8,
                            "temperature": 0.0, "logprobs": 1, "ignore_eos": True,
                            "cache_salt": salt}
    if session is not None:
        body["kv_transfer_params"] = {"harness_pause": {"session": session, "hold": False}}
    return body


async def _post(http: HttpClient, body: dict[str, Any]) -> dict[str, Any]:
    status, data = await http.post_json("/v1/completions", body)
    assert status == 200, data
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("action", ["keep", "swap"])
def test_the_resumed_call_computes_what_a_full_recompute_does(
        vllm_server: LocalVllmServer, kv_bytes: int, action: str) -> None:
    """Temperature 0: the resumed call's logprobs on the kept or restored KV equal, bit for
    bit, those of the same prompt prefilled from scratch (a fresh salt); a prompt one token
    apart gives other logprobs, so the comparison can tell contexts apart."""
    async def go(ad: VllmAdapter, http: HttpClient) -> None:
        prompt = [300 + (i * 7) % 1500 for i in range(200)]
        first = await ad.complete(CompletionRequest(prompt, 8, session="lp", hold=True),
                                  lambda: None)
        kv = PausedKv("lp", None, len(prompt) + 8)
        if action == "keep":
            await ad.hold(kv, None)
        else:
            io = await ad.offload(kv, "lp")
            assert (io.tokens, io.bytes) == (192, 192 * kv_bytes) and io.ms > 0
            # nothing of the context is left on the device to reuse: only the host copy
            assert await ad.reset_prefix_cache()
        resumed = prompt + first.tokens + list(range(600, 652))
        ours = await _post(http, _logprob_body(resumed, salt, ad.session_name("lp")))
        full = await _post(http, _logprob_body(resumed, f"{salt}-fresh", None))
        apart = [*resumed[:5], resumed[5] + 1, *resumed[6:]]
        other = await _post(http, _logprob_body(apart, f"{salt}-apart", None))
        assert ours["usage"]["prompt_tokens_details"]["cached_tokens"] == 192
        assert full["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        restored = ours["kv_transfer_params"]["harness_pause"]["restored_tokens"]
        assert restored == (192 if action == "swap" else 0)
        logprobs = [r["choices"][0]["logprobs"]["token_logprobs"] for r in (ours, full, other)]
        assert logprobs[0] == logprobs[1]
        assert logprobs[2] != logprobs[1]
        await _everything_released(ad)

    salt = f"logprobs-{action}-{time.monotonic_ns()}"
    _run(vllm_server.url, go, salt)


def test_a_pin_expires_on_its_own(vllm_server: LocalVllmServer) -> None:
    """The safety net: a pin whose hold ran out is released at the server's next step."""
    async def go(ad: VllmAdapter, http: HttpClient) -> None:
        await ad.complete(CompletionRequest(list(range(300, 400)), 4, session="x", hold=True),
                          lambda: None)
        held = await _post(http, control_body("tiny", {"op": "hold", "ttl_s": 0.5,
                                                       "session": ad.session_name("x")}))
        assert held["kv_transfer_params"]["harness_pause"]["tokens"] == 96
        assert await ad.held() == [f"pinned {ad.session_name('x')} (96 tokens)"]
        await asyncio.sleep(1.0)
        assert await ad.held() == []
        assert ad.pause_report["expired"]["pins"] >= 1
        await _everything_released(ad)

    _run(vllm_server.url, go)


def test_run_command_against_a_running_server(vllm_server: LocalVllmServer,
                                              tmp_path: Path) -> None:
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--runtime", "vllm", "--url", vllm_server.url,
                                    "--trace", str(trace), "--policy", "keep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["runtime"] == "vllm" and run["status"] == "finished"
    assert run["outcome"]["completed"] == 1 and "pinned" in run["server_policy"]
    assert run["server_extra"]["pause_connector"]["connector"] == "HarnessPauseConnector"
    assert run["cleanup"]["held_left"] == []
    rec = read_records(out)
    assert rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0] == 64
    assert any((out / "server_metrics").glob("part-*.parquet"))


def _long_pause_trace(path: Path) -> Path:
    rows = [{"step": 0, "kind": "llm", "input_tokens": 200, "output_tokens": 4},
            {"step": 1, "kind": "tool", "tool_class": "remote_read", "tool_name": "wait",
             "latency_s": 120.0, "deadline_s": 300.0, "outcome": "ok", "mutating": False},
            {"step": 2, "kind": "llm", "input_tokens": 8, "output_tokens": 4}]
    table = steps_table(rows, {**SYNTHETIC_DEFAULTS, "trajectory_id": "long"})
    return write_trajectories(table, path, Provenance("test"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_leaves_no_pin(vllm_server: LocalVllmServer, tmp_path: Path,
                                     signum: int) -> None:
    """SIGTERM or Ctrl-C during a kept pause: the run releases what it pinned on its way out."""
    trace = _long_pause_trace(tmp_path / "t.parquet")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "--runtime", "vllm", "--url", vllm_server.url,
         "--trace", str(trace), "--policy", "keep", "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    async def pins(ad: VllmAdapter, _: HttpClient) -> list[dict[str, Any]]:
        status = await ad.status("")
        return list(status["pins"])

    try:
        deadline = time.monotonic() + 120
        while not _run(vllm_server.url, pins):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never pinned its context"
            time.sleep(0.3)
        os.killpg(proc.pid, signum)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode in (130, 143)

    async def released(ad: VllmAdapter, _: HttpClient) -> None:
        await _everything_released(ad)

    _run(vllm_server.url, released)


def test_a_pin_survives_pressure_that_evicts_an_evictable_context(
        vllm_env: tuple[Path, Path], tmp_path: Path) -> None:
    """A 16-block pool: filler traffic evicts a context left to vLLM's cache (keep-evictable)
    but not a pinned one (keep), which the resumed call reuses whole."""
    python, model = vllm_env
    cfg = VllmServerConfig(model=model, max_model_len=320, num_gpu_blocks_override=17)
    with _started(cfg, tmp_path / "pressure.log", python) as server:
        async def go(ad: VllmAdapter, _: HttpClient) -> tuple[int | None, int | None, float]:
            contexts = {}
            for tid in ("pinned", "evictable"):
                prompt = [300 + (i * 11 + len(tid)) % 1500 for i in range(200)]
                first = await ad.complete(CompletionRequest(prompt, 4, session=tid,
                                                            hold=True), lambda: None)
                contexts[tid] = prompt + first.tokens
            await ad.hold(PausedKv("pinned", None, 204), None)
            await ad.unpin(PausedKv("evictable", None, 204))
            usage = [v for _, n, _, v in await ad.scrape() if n == "vllm:kv_cache_usage_perc"]
            for i in range(4):  # one at a time: pressure on the cache, no preemption
                filler = [500 + (k * 13 + i * 101) % 1400 for k in range(200)]
                assert (await ad.complete(CompletionRequest(filler, 8), lambda: None)
                        ).status == "ok"
            got = {}
            for tid, ctx in contexts.items():
                res = await ad.complete(CompletionRequest(ctx + list(range(700, 716)), 4,
                                                          session=tid), lambda: None)
                got[tid] = res.cached_tokens
            for tid in contexts:
                await ad.release(PausedKv(tid, None, 224))
            await _everything_released(ad)
            return got["pinned"], got["evictable"], usage[0]

        pinned, evictable, usage = _run(server.url, go)
        assert usage == pytest.approx(6 / 16)  # the pinned context's 6 blocks stay in use
        assert pinned == 192  # its every full block
        assert evictable is not None and evictable < 192

        async def blocked(ad: VllmAdapter, http: HttpClient) -> tuple[float, str, list[Any]]:
            """Pins that leave too few blocks for a request stall no one: the valve releases
            the latest program's pin inside the scheduler step and reports it."""
            for n, tid in enumerate(("p1", "p2")):
                prompt = [300 + (i * 5 + n * 7) % 1500 for i in range(200)]
                await ad.complete(CompletionRequest(prompt, 4, session=tid, hold=True),
                                  lambda: None)
                await ad.hold(PausedKv(tid, None, 204, step=1), None)
            t0 = time.monotonic()  # 12 of 16 blocks pinned; this needs 10
            res = await ad.complete(CompletionRequest([400 + k % 900 for k in range(300)], 4),
                                    lambda: None)
            waited = time.monotonic() - t0
            valve = (await ad.status(""))["valve"]
            for tid in ("p2", "p1"):
                await ad.release(PausedKv(tid, None, 204, step=1))
            await _everything_released(ad)
            return waited, res.status, [valve, ad.hint_reports()]

        waited, res_status, (valve, reports) = _run(server.url, blocked)
        assert res_status == "ok" and waited < 5.0
        assert valve == {"released": 1, "blocks": 6}
        # the later program's pin went; the earlier one was held until its release
        assert [(r.session, r.step, r.outcome, r.reason) for r in reports] == [
            ("p2", 1, "clipped", "valve: latest-program"), ("p1", 1, "accepted", "released")]


def _growing(tid: str, latency: float) -> TrajectoryPlan:
    """A 150-token prompt (4 full blocks pinned over the pause), then a resume that appends
    150 more: it must grow to 10 blocks."""
    return TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 150, stable_seed(tid, 0), 4),
        ToolStep(1, "search", "remote_read", latency, 30.0, "ok", False, True),
        CallStep(2, 150, stable_seed(tid, 2), 4),
    ))


def test_pinned_paused_contexts_that_fill_the_pool_do_not_stall_a_resume(
        vllm_env: tuple[Path, Path], tmp_path: Path) -> None:
    """Deadlock test: three agents' pinned contexts (12 of 16 blocks) and a resume that must
    grow by 6: the valve releases a pin, every call is served within the bound, and the
    release is recorded as that pause's clipped hint."""
    python, model = vllm_env
    cfg = VllmServerConfig(model=model, max_model_len=320, num_gpu_blocks_override=17)
    plan = _plan(_growing("g-a", 1.0), _growing("g-b", 1.6), _growing("g-c", 2.2))
    run = RunManifest(run_id="live-valve", policy="keep")
    with _started(cfg, tmp_path / "valve.log", python) as server:
        async def go(ad: VllmAdapter, _: HttpClient) -> float:
            t0 = time.monotonic()
            await asyncio.wait_for(replay(ad, RealClock(), plan, make_policy("keep"),
                                          tmp_path / "out", run, FALLBACK_RATES,
                                          ReplaySettings(0.1)), timeout=60.0)
            took = time.monotonic() - t0
            await _everything_released(ad)
            return took

        took = _run(server.url, go)
    rec, manifest = read_records(tmp_path / "out"), run.to_dict()
    assert took < 60.0 and manifest["outcome"]["completed"] == 3
    assert manifest["cleanup"]["held_left"] == []
    ends = rec[rec.event == "call_end"]
    assert len(ends) == 6 and (ends.status == "ok").all()
    hints = rec[rec.event == "hint_outcome"]
    assert len(hints) == 3 and set(hints.action) == {"keep"}
    clipped = hints[hints.status == "clipped"]
    assert len(clipped) >= 1 and set(clipped.reason) == {"valve: latest-program"}
    assert (clipped.held_s > 0).all()
    assert set(hints.status) <= {"clipped", "accepted"}
    assert manifest["server_extra"]["pause_actions"]["valve"]["released"] == len(clipped)


def test_continuum_runs_its_program_order_on_a_server_that_schedules_by_priority(
        vllm_env: tuple[Path, Path], tmp_path: Path) -> None:
    """continuum on a local server the harness starts: the server schedules by priority, the
    calls carry theirs, and nothing says the order did not run; keep-evictable's server does
    not (its calls carry none)."""
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    for policy, ordered in (("continuum", True), ("keep-evictable", False)):
        out = tmp_path / policy
        res = CliRunner().invoke(main, ["run", "--runtime", "vllm", "--trace", str(trace),
                                        "--policy", policy, "--ctx-per-slot", "1024",
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        run = json.loads((out / "run.json").read_text())
        assert run["capabilities"]["call_priority"] is ordered
        assert run["server_extra"]["scheduler_policy"] == ("priority" if ordered else "fcfs")
        assert ("--scheduling-policy" in run["server_flags"]) is ordered
        summary = json.loads((out / "summary.json").read_text())
        assert not any("program order" in w for w in summary["warnings"])
        assert run["outcome"]["completed"] == 1 and run["cleanup"]["held_left"] == []
