"""Pause policies replayed against a real SGLang server (CPU engine, tiny random-weight Llama).

SGLang is installed into its own cached virtualenv on first use (idempotent; pinned releases, with
the harness's `sgl_kernel` CPU stand-in), the model is made locally, and each server is started
here and stopped (its whole process group) at the end. This CPU setup is not supported upstream:
when the pinned install or the server's start-up breaks, these tests fail with the reason rather
than skip. Cache reuse is asserted with the server's own numbers (`meta_info.cached_tokens`):
SGLang reuses at token granularity, everything but the last generated token.

`python -m tests.conformance.record sglang` re-records tests/conformance/transcripts/sglang.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from harness.adapters.base import CompletionRequest
from harness.adapters.http import connect
from harness.adapters.launchers.process import remove_leaked_shm, shm_entries
from harness.adapters.launchers.sglang_server import (
    LEAKED_SHM,
    STAND_IN,
    LocalSglangServer,
    SglangServerConfig,
    sglang_model,
    sglang_python,
)
from harness.adapters.sglang import SglangAdapter
from harness.cli import main
from harness.errors import ServerError
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from tests.conformance.transcript import ACTIONS, recording_proxy, run_plan
from tests.live.traces import write_one_pause_trace

pytestmark = [pytest.mark.live, pytest.mark.sglang]

TRANSCRIPT = Path(__file__).resolve().parents[1] / "conformance" / "transcripts" / "sglang.json"
UNSUPPORTED = ("the pinned CPU SGLang setup (install_sglang.sh: sglang 0.5.23 without its "
               "CUDA-only requirements, torch 2.14.1, the harness's sgl_kernel stand-in) is not "
               "supported upstream and broke")


@pytest.fixture(scope="module")
def sglang_env() -> tuple[Path, Path]:
    """The SGLang virtualenv's python and the tiny model (installed / made once, cached)."""
    try:
        python = sglang_python()
        return python, sglang_model(python)
    except ServerError as exc:
        pytest.fail(f"{UNSUPPORTED}: {exc}")


@contextlib.contextmanager
def _started(cfg: SglangServerConfig, log: Path, python: Path) -> Iterator[LocalSglangServer]:
    """A running server; on exit it is stopped and checked: no process, no files left."""
    server = LocalSglangServer(cfg, log, python=python)
    before = shm_entries()
    try:
        server.__enter__()
    except ServerError as exc:
        pytest.fail(f"{UNSUPPORTED}: {exc}")
    try:
        yield server
    finally:
        server.stop()
    assert not server.group_alive(), "SGLang processes left after stop"
    assert not server.tmp_dir.exists()
    left = remove_leaked_shm(before, LEAKED_SHM)  # what stop() would have missed
    assert left == [], f"shared memory left after stop: {left}"


@pytest.fixture(scope="module")
def sglang_server(sglang_env: tuple[Path, Path],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSglangServer]:
    python, model = sglang_env
    log = tmp_path_factory.mktemp("sglang") / "server.log"
    with _started(SglangServerConfig(model=model), log, python) as server:
        yield server


def _traj(tid: str, latency: float | None, deadline: float = 3.0) -> TrajectoryPlan:
    return TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 100, stable_seed(tid, 0), 4),
        ToolStep(1, "search", "remote_read", latency, deadline,
                 "ok" if latency is not None else "abandoned", False, True),
        CallStep(2, 16, stable_seed(tid, 2), 4),
        ToolStep(3, "cat", "local_read", 0.1, deadline, "ok", False, True),
        CallStep(4, 4, stable_seed(tid, 4), 4),
    ))


def _resumed(rec: pd.DataFrame) -> pd.DataFrame:
    ends = rec[(rec.event == "call_end") & (rec.step > 0)][
        ["trajectory_id", "step", "cached_tokens", "prompt_n", "status"]]
    dec = rec[rec.event == "pause_decision"][["trajectory_id", "step", "action",
                                               "retained_tokens", "status"]].copy()
    dec["step"] = dec["step"] + 1
    return ends.merge(dec, on=["trajectory_id", "step"], suffixes=("", "_decision"))



# The two tests without the module's server run first: a second idle server would share the
# two cores with the one they start.
def test_local_run_starts_and_stops_its_own_server(tmp_path: Path,
                                                   sglang_env: tuple[Path, Path]) -> None:
    """`harness run --runtime sglang` without --url: its own server, swap recorded as
    unsupported (HiCache needs CUDA), and no server process left afterwards."""
    trace = tmp_path / "t.parquet"
    write_one_pause_trace(trace)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--runtime", "sglang", "--trace", str(trace),
                                    "--policy", "swap", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["outcome"]["unsupported_actions"] == 1
    assert "cudaHostRegister" in run["server_policy"] and run["server_start_s"] > 0
    assert "--enable-streaming-session" in run["server_flags"]
    # swap unsupported: the context stayed pinned in its session, closed at the end
    assert run["cleanup"]["held_left"] == []
    assert json.loads((out / "summary.json").read_text())["cache_mismatches"] == 0
    assert run["model"]["geometry"]["kv_bytes_per_token"] == 512
    assert run["model"]["kv_bytes_per_token"] == 512  # memory-time in MiB·s in the summary
    assert json.loads((out / "summary.json").read_text())["kv_bytes_per_token"] == 512
    port = run["server_flags"][run["server_flags"].index("--port") + 1]
    assert not _sglang_on_port(port), f"an SGLang server still runs on port {port}"
    assert "Uvicorn running on http://127.0.0.1" in (out / "server.log").read_text()


def _sglang_on_port(port: str) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if b"sglang.launch_server" in args and port.encode() in args:
                return True
    return False


def test_stand_in_kernel_on_torch_tensors(sglang_env: tuple[Path, Path]) -> None:
    """The stand-in's function inside SGLang's own environment, on the tensors SGLang passes."""
    python, _ = sglang_env
    code = (
        "import torch, sgl_kernel\n"
        "t = torch.zeros((3, 6), dtype=torch.int32)\n"
        "sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), t, torch.tensor([0, 3]),"
        " torch.tensor([2, 5]), torch.tensor([7, 8, 9, 10]), 6)\n"
        "print(t.tolist())\n")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(STAND_IN)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [[0, 0, 0, 9, 10, 0], [0] * 6, [7, 8, 0, 0, 0, 0]]


@pytest.mark.parametrize("policy", ["keep", "keep-evictable", "recompute"])
def test_keep_and_recompute_for_real(sglang_server: LocalSglangServer, tmp_path: Path,
                                     policy: str) -> None:
    plan = Plan((_traj("s-a", 0.3), _traj("s-b", 0.2), _traj("s-gone", None, 0.5)), (),
                Arrivals(mode="closed", concurrency=3), 0, Injection())
    out = tmp_path / policy
    manifest = RunManifest(run_id=f"live-{policy}", policy=policy)

    async def go() -> None:
        async with connect(sglang_server.url, 8) as http:
            adapter = SglangAdapter(http, salt=manifest.run_id)
            await replay(adapter, RealClock(), plan, make_policy(policy), out, manifest,
                         FALLBACK_RATES, ReplaySettings(0.1))

    asyncio.run(go())
    run = manifest.to_dict()
    rec = read_records(out)
    assert run["outcome"] == {"completed": 2, "cancelled": 1, "failed": 0,
                              "unsupported_actions": 0, "server_failed": 0, "interrupted": 0}
    assert run["vocab_size"] == 2048 and run["slots"] is None and run["ctx_per_slot"] == 4096
    assert run["server_version"] == "0.5.23"
    resumed = _resumed(rec)
    assert len(resumed) == 4 and (resumed.status == "ok").all()
    for r in resumed.itertuples():
        if policy != "recompute":  # the whole retained context but its last generated token
            # (pinned in a streaming session, or left to a radix cache with room to spare)
            assert r.cached_tokens == r.retained_tokens - 1, r
        else:  # a fresh extra_key: nothing reused, the whole prompt prefilled
            assert r.cached_tokens == 0 and r.prompt_n >= r.retained_tokens, r
    salts = rec[(rec.event == "erase") & rec.reason.str.contains("fresh cache salt", na=False)]
    n_pauses = int((rec.event == "pause_decision").sum())  # 2 + 2 + 1 (the abandoned tool)
    assert len(salts) == (n_pauses if policy == "recompute" else 0) and n_pauses == 5
    gone = rec[rec.trajectory_id == "s-gone"]
    assert gone[gone.event == "trajectory_end"].status.tolist() == ["cancelled"]
    assert run["cleanup"] == {"slots_idle": True, "dump_files_left": None, "errors": [],
                              "remote_dumps_left": [], "errors_total": 0, "held_left": []}
    summary = read_json(out / "summary.json")
    assert summary["resume_latency_ms"]["n"] == 4 and summary["cache_mismatches"] == 0
    assert "sglang:kv_used_tokens" in (summary["server_occupancy"] or {})


def test_hang_up_aborts_the_request_on_the_server(sglang_server: LocalSglangServer) -> None:
    async def go() -> tuple[str, int, bool | None]:
        async with connect(sglang_server.url, 8) as http:
            ad = SglangAdapter(http, salt="hangup", vocab_size=2048)
            r = await ad.complete(CompletionRequest(list(range(300, 364)), 2000,
                                                    abort_after_first_token=True), lambda: None)
            idle: bool | None = False
            for _ in range(40):  # SGLang notices the closed connection at its next chunk
                await asyncio.sleep(0.25)
                idle = await ad.slots_idle()
                if idle:
                    break
            return r.status, len(r.tokens), idle

    status, n, idle = asyncio.run(go())
    # the first streamed chunk: one token, or a few when SGLang coalesced them under load
    assert status == "aborted" and 1 <= n <= 8 and idle is True


def test_run_command_against_a_running_server(sglang_server: LocalSglangServer,
                                              tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    write_one_pause_trace(trace)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--runtime", "sglang", "--url", sglang_server.url,
                                    "--trace", str(trace), "--policy", "keep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["runtime"] == "sglang" and run["status"] == "finished"
    assert run["outcome"]["completed"] == 1 and "streaming session" in run["server_policy"]
    assert run["server_extra"]["disable_radix_cache"] is False
    assert run["server_extra"]["enable_streaming_session"] is True
    assert run["capabilities"]["pause_actions"] == ["keep", "keep-evictable", "recompute"]
    assert run["cleanup"]["held_left"] == []
    rec = read_records(out)
    assert rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0] == 83
    assert any((out / "server_metrics").glob("part-*.parquet"))


def test_the_server_still_answers_as_recorded(sglang_server: LocalSglangServer,
                                              tmp_path: Path) -> None:
    """The conformance plan against this server gives the recorded events (tokens, reuse)."""
    exchanges: list[dict[str, Any]] = []

    async def go() -> dict[str, Any]:
        proxy = TestServer(recording_proxy(sglang_server.url, exchanges, "sglang"),
                           host="127.0.0.1")
        await proxy.start_server()
        try:
            return await run_plan("sglang", str(proxy.make_url("")).rstrip("/"), tmp_path)
        finally:
            await proxy.close()

    out = asyncio.run(go())
    run = out["run"]
    assert run["status"] == "finished" and run["outcome"]["completed"] == 2, run
    recorded = json.loads(TRANSCRIPT.read_text())
    assert recorded["actions"] == ACTIONS["sglang"] and exchanges
    assert out["events"] == recorded["events"]
    # the server's own timings differ from run to run (its queue time included); each
    # answered call reports its queue time
    timing = ("prompt_ms", "decode_ms", "queue_ms")
    assert all("queue_ms" in r for k, r in out["results"] if k == "complete"
               and r["status"] == "ok")
    assert [[k, {f: v for f, v in r.items() if f not in timing}] for k, r in out["results"]] == \
        [[k, {f: v for f, v in r.items() if f not in timing}] for k, r in recorded["results"]]
