"""The parts of measuring the harness against the known-delay stub that a command and a
benchmark share: start and stop the stub, a synthetic closed-loop trace, a plain aiohttp
reference client, a harness replay, and the statistics of an error.

The stub answers every call after exactly `ttft_ms`; whatever a client measures beyond that is
the client's own error. The reference loop measures the same stub in the same run, so the
harness's error can be read against what a minimal client gets on this machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pandas as pd

from harness.adapters.launchers.process import free_port
from harness.errors import InputError, ServerError
from harness.metrics.frames import build_frames
from harness.plan.planner import Arrivals
from harness.records.manifest import CpuPinning, RunManifest
from harness.records.store import read_records
from harness.replay.options import RunOptions
from harness.replay.run import execute_run
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories

HEALTH_TIMEOUT_S = 10.0
# The reference client's prompt: the same 64 tokens on every call, as the first call of the
# synthetic trace sends.
REFERENCE_PROMPT = list(range(300, 364))
_JSON = {"Content-Type": "application/json"}


@dataclass
class Stub:
    """A running stub process: its URL, port and the CPUs it may run on (None: not pinned)."""

    proc: subprocess.Popen[bytes]
    url: str
    port: int
    cpus: list[int] | None
    stderr_file: IO[bytes]  # the stub's stderr, for the line that says why it exited

    def stop(self) -> None:
        """Kill the stub by its PID and reap it (idempotent): it holds no state worth a
        graceful shutdown, and a stub left behind would skew the next measurement."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr_file.close()


def port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` now (so the stub can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stub_command(port: int, ttft_ms: float, cpus: str | None, slots: int | None
                  ) -> list[str]:
    cmd = [sys.executable, "-m", "harness.selftest.stub", "--port", str(port),
           "--ttft-ms", str(ttft_ms)]
    if slots is not None:
        cmd += ["--slots", str(slots)]
    if cpus and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpus, *cmd]  # pinned from its first instruction
    return cmd


def _pin_child(proc: subprocess.Popen[bytes], cpus: str | None) -> list[int] | None:
    """Pin the stub where taskset was not at hand, and read back where it may run."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    wanted = {int(c) for c in cpus.split(",")}
    try:
        if os.sched_getaffinity(proc.pid) != wanted:
            os.sched_setaffinity(proc.pid, wanted)
        return sorted(os.sched_getaffinity(proc.pid))
    except OSError:
        return None  # it exited already; the health wait below says so


def _last_line(f: IO[bytes]) -> str:
    f.flush()
    f.seek(0)
    lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def start_stub(ttft_ms: float, cpus: str | None = None, port: int | None = None,
               timeout_s: float = HEALTH_TIMEOUT_S, slots: int | None = None) -> Stub:
    """Start the stub in a process of its own (on `cpus`, a taskset list, when given; with
    `slots` slots, default the stub's) and wait for its /health. InputError when `port` is
    taken; ServerError when the stub exits or does not answer within `timeout_s` (it is
    killed then)."""
    if port is not None and not port_is_free(port):
        raise InputError(f"port {port} is in use; choose another --port or leave it out")
    port = free_port() if port is None else port
    # A file, not a pipe (a full pipe would stall the stub); it lives as long as the stub,
    # and Stub.stop closes it.
    stderr = tempfile.TemporaryFile()  # noqa: SIM115
    try:
        proc = subprocess.Popen(_stub_command(port, ttft_ms, cpus, slots),
                                stdout=subprocess.DEVNULL, stderr=stderr)
    except OSError as exc:
        stderr.close()
        raise ServerError(f"cannot start the stub: {exc}") from None
    stub = Stub(proc, f"http://127.0.0.1:{port}", port, _pin_child(proc, cpus), stderr)
    try:
        _wait_healthy(stub, timeout_s)
    except BaseException:
        stub.stop()
        raise
    return stub


def _wait_healthy(stub: Stub, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stub.proc.poll() is not None:
            raise ServerError(f"the stub exited at start (exit {stub.proc.returncode}): "
                              f"{_last_line(stub.stderr_file)}")
        try:
            with urllib.request.urlopen(stub.url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerError(f"the stub did not answer {stub.url}/health within {timeout_s:g} s")


def agent_pause_s(pause_s: float, agent: int, agents: int, spread: bool) -> float:
    """Agent `agent`'s wait between calls: `pause_s`, or (`spread`) `pause_s` x (1 + agent /
    agents), so that many agents started together do not all resume at once after the first
    call (their resumes spread over `pause_s` seconds of each round)."""
    return pause_s * (1.0 + agent / agents) if spread else pause_s


async def reference(url: str, agents: int, calls: int, n_predict: int, pause_s: float = 0.0,
                    spread: bool = False) -> tuple[np.ndarray, float]:
    """Each agent sends `calls` streamed completions, `pause_s` apart (as the synthetic trace's
    tool waits; `spread`: agent_pause_s's): (TTFT ms as an agents x calls array, calls/s).
    Column 0 are first calls, the rest follow a pause: the reference's analogue of a resume.
    Its prompts grow as the trace's contexts do (64 tokens, then each call's output and 8
    more), so both clients send the same bytes: the difference is the harness's own work."""
    import aiohttp

    ttfts = np.full((agents, calls), np.nan)
    connector = aiohttp.TCPConnector(limit=agents + 1, keepalive_timeout=3.0)
    async with aiohttp.ClientSession(connector=connector) as s:
        async def agent(a: int) -> None:
            prompt = list(REFERENCE_PROMPT)
            pause = agent_pause_s(pause_s, a, agents, spread)
            for c in range(calls):
                if c:
                    prompt += [300 + (len(prompt) + i) % 1000 for i in range(n_predict + 8)]
                    if pause > 0:
                        await asyncio.sleep(pause)
                t0 = time.perf_counter()
                first = None
                async with s.post(url + "/completion", data=orjson.dumps({
                        "prompt": prompt, "n_predict": n_predict, "id_slot": a,
                        "stream": True}), headers=_JSON) as r:
                    async for line in r.content:
                        if first is None and line.startswith(b"data:"):
                            first = time.perf_counter()
                if first is None:
                    raise ServerError(f"{url}/completion streamed no token")
                ttfts[a, c] = 1e3 * (first - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(a) for a in range(agents)))
        wall = time.perf_counter() - t0
    return ttfts, agents * calls / wall


def synthetic_trace(path: Path, agents: int, calls: int, tool_s: float, out_tokens: int,
                    source: str = "harness selftest", spread: bool = False) -> Path:
    """A trace of `agents` trajectories of `calls` LLM calls each (64 tokens first, 8 after),
    a local tool of `tool_s` seconds between calls (`spread`: agent_pause_s's, as the
    reference's); written to `path`."""
    rows: list[dict[str, Any]] = []
    for a in range(agents):
        wait = agent_pause_s(tool_s, a, agents, spread)
        step = 0
        for c in range(calls):
            if c:
                rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "tool",
                             "tool_class": "local_read", "tool_name": "cat",
                             "latency_s": wait, "deadline_s": 30.0, "outcome": "ok",
                             "mutating": False})
                step += 1
            rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "llm",
                         "input_tokens": 64 if c == 0 else 8, "output_tokens": out_tokens})
            step += 1
    return write_trajectories(steps_table(rows, SYNTHETIC_DEFAULTS), path, Provenance(source))


@dataclass(frozen=True)
class Replay:
    """A harness replay on the stub: agent calls (ttft_ms, resume_ms), pauses (lag_ms), its
    run.json and the agent calls per second over the run."""

    calls: pd.DataFrame
    pauses: pd.DataFrame
    run: RunManifest
    calls_per_s: float


def harness_replay(url: str, trace_path: Path, agents: int, out: Path, policy: str = "keep",
                   pinning: CpuPinning | None = None) -> Replay:
    """Replay `trace_path` closed-loop with `agents` agents on the server at `url` (one slot
    per agent, so no call waits for a slot) and link its records."""
    run = execute_run(RunOptions(trace=trace_path, policy=policy, out=out, url=url,
                                 arrivals=Arrivals(concurrency=agents), slots=agents,
                                 scrape_interval_s=0.5, pinning=pinning), lambda _: None)
    frames = build_frames(read_records(out))
    calls = frames.calls[~frames.calls["bystander"]]
    return Replay(calls, frames.pauses, run, len(calls) / float(run.duration_s or 1.0))


def error_stats(values: np.ndarray | pd.Series) -> dict[str, Any]:
    """{'n', 'mean', 'p50', 'p95', 'p99'} of the finite values (linear-interpolated
    percentiles, as numpy's default); None for each figure of no data."""
    arr = np.asarray(values, dtype="float64")
    arr = arr[np.isfinite(arr)]
    out: dict[str, Any] = {"n": int(arr.size), "mean": float(arr.mean()) if arr.size else None}
    for q in (50, 95, 99):
        out[f"p{q}"] = float(np.percentile(arr, q)) if arr.size else None
    return out


def instrument_error(replay: Replay, reference_ttft_ms: np.ndarray, stub_ttft_ms: float
                     ) -> dict[str, Any]:
    """The error figures of one run against the stub's known TTFT: the harness's TTFT and
    resume latency beyond it, its client lag (how late it woke to tool ends, as summary.json's
    client_lag_ms), the reference loop's TTFT beyond it, and the replay's agent calls per
    second (tool pauses included, so not comparable with the reference loop's rate)."""
    calls = replay.calls
    return {
        "ttft_ms": error_stats(calls["ttft_ms"].dropna().to_numpy() - stub_ttft_ms),
        "resume_ms": error_stats(calls["resume_ms"].dropna().to_numpy() - stub_ttft_ms),
        "client_lag_ms": error_stats(replay.pauses["lag_ms"].dropna().to_numpy()),
        "reference_ttft_ms": error_stats(reference_ttft_ms - stub_ttft_ms),
        "calls_per_s": replay.calls_per_s,
    }
