"""The harness's own error, against a server whose delays are known.

The stub (harness.selftest.stub: the llama.cpp protocol, raw asyncio) runs on one core with a
fixed time to first token; the harness replays on the other. A plain aiohttp + uvloop loop, the
reference client, measures the same stub in the same run. Figures and targets (ratios and
differences within this one run):

- throughput at 64 agents, 0 ms server, 16 tokens per call: keep >= 0.75x the reference loop;
- TTFT error at 8 agents, 50 ms server: within +0.5 ms mean / +1.5 ms P99 of the reference's;
- resume-latency error at 8 agents (tool end -> first token, against the stub's 50 ms): <= +1 ms
  mean / +3 ms P99.

Prints each figure with its target; exit 1 when one is missed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

from harness.adapters.launchers.process import free_port
from harness.metrics.frames import build_frames
from harness.plan.planner import Arrivals
from harness.records.store import read_records
from harness.replay.cli import RunOptions, execute_run
from harness.replay.loop import run as run_loop
from harness.traces.schema import Provenance, write_trajectories

TTFT_MS = 50.0


def start_stub(ttft_ms: float, cpus: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "harness.selftest.stub", "--port", str(port),
           "--ttft-ms", str(ttft_ms)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the stub did not start")


async def reference(url: str, agents: int, calls: int, n_predict: int) -> tuple[np.ndarray, float]:
    """Each agent sends `calls` streamed completions back to back: (TTFT ms, calls/s)."""
    ttfts: list[float] = []
    connector = aiohttp.TCPConnector(limit=agents + 1, keepalive_timeout=3.0)
    async with aiohttp.ClientSession(connector=connector) as s:
        async def agent(a: int) -> None:
            prompt = list(range(300, 364))
            for _ in range(calls):
                t0 = time.perf_counter()
                first = None
                async with s.post(url + "/completion", json={
                        "prompt": prompt, "n_predict": n_predict, "id_slot": a,
                        "stream": True}) as r:
                    async for line in r.content:
                        if first is None and line.startswith(b"data:"):
                            first = time.perf_counter()
                assert first is not None
                ttfts.append(1e3 * (first - t0))

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(a) for a in range(agents)))
        wall = time.perf_counter() - t0
    return np.array(ttfts), agents * calls / wall


def trace(path: Path, agents: int, calls: int, tool_s: float, out_tokens: int) -> Path:
    rows = []
    for a in range(agents):
        step = 0
        for c in range(calls):
            if c:
                rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "tool",
                             "tool_class": "local_read", "tool_name": "cat",
                             "latency_s": tool_s, "deadline_s": 30.0, "outcome": "ok",
                             "mutating": False})
                step += 1
            rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "llm",
                         "input_tokens": 64 if c == 0 else 8, "output_tokens": out_tokens})
            step += 1
    base = {"start_s": 0.0, "priority": "interactive", "tenant": "t", "prefix_group": None,
            "tool_name": None, "tool_class": None, "latency_s": None, "deadline_s": None,
            "outcome": None, "mutating": None, "input_tokens": None, "output_tokens": None}
    df = pd.DataFrame([{**base, **r} for r in rows])
    for col in ("input_tokens", "output_tokens"):
        df[col] = df[col].astype("Int64")
    df["step"] = df["step"].astype("int32")
    df["mutating"] = df["mutating"].astype("boolean")
    return write_trajectories(df, path, Provenance("bench_instrument"))


def harness_run(url: str, trace_path: Path, agents: int, out: Path, policy: str = "keep"
                ) -> tuple[pd.DataFrame, float]:
    """A harness replay on the stub: (agent calls with ttft_ms / resume_ms, calls/s)."""
    run = execute_run(RunOptions(trace=trace_path, policy=policy, out=out, url=url,
                                 arrivals=Arrivals(concurrency=agents), slots=agents,
                                 scrape_interval_s=0.5, pinning=None), lambda _: None)
    calls = build_frames(read_records(out)).calls
    calls = calls[~calls["bystander"]]
    return calls, len(calls) / float(run.duration_s or 1.0)


def main() -> int:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    stub_cpus = ",".join(map(str, cpus[1:])) if len(cpus) > 1 else None
    if stub_cpus:
        os.sched_setaffinity(0, {cpus[0]})
    missed: list[str] = []

    def check(name: str, value: float, target: float, ok: bool, unit: str = "ms") -> None:
        print(f"{name:<44} {value:>9.2f} {unit:<3} target {target:g}  {'OK' if ok else 'MISSED'}")
        if not ok:
            missed.append(name)

    work = Path(tempfile.mkdtemp(prefix="bench-instrument-"))
    proc, url = start_stub(0.0, stub_cpus)
    try:
        _, ref_rate = run_loop(reference(url, 64, 60, 16))
        calls, h_rate = harness_run(url, trace(work / "t64.parquet", 64, 60, 0.0, 16), 64,
                                    work / "tput")
        print(f"throughput, 64 agents, 0 ms server: reference {ref_rate:,.0f} calls/s, "
              f"harness {h_rate:,.0f} calls/s")
        check("throughput ratio harness / reference (keep)", h_rate / ref_rate, 0.75,
              h_rate / ref_rate >= 0.75, "x")
    finally:
        proc.kill()
        proc.wait()
    proc, url = start_stub(TTFT_MS, stub_cpus)
    try:
        ref_ttft, _ = run_loop(reference(url, 8, 40, 4))
        calls, _ = harness_run(url, trace(work / "t8.parquet", 8, 40, 0.02, 4), 8, work / "err")
    finally:
        proc.kill()
        proc.wait()
    ref_err = ref_ttft - TTFT_MS
    h_err = calls["ttft_ms"].dropna().to_numpy() - TTFT_MS
    r_err = calls["resume_ms"].dropna().to_numpy() - TTFT_MS
    print(f"TTFT error at 8 agents: reference mean {ref_err.mean():+.2f} / P99 "
          f"{np.percentile(ref_err, 99):+.2f} ms; harness mean {h_err.mean():+.2f} / P99 "
          f"{np.percentile(h_err, 99):+.2f} ms; resume error mean {r_err.mean():+.2f} / P99 "
          f"{np.percentile(r_err, 99):+.2f} ms ({len(r_err)} resumes)")
    d_mean = h_err.mean() - ref_err.mean()
    d_p99 = np.percentile(h_err, 99) - np.percentile(ref_err, 99)
    check("TTFT error mean, harness - reference", d_mean, 0.5, d_mean <= 0.5)
    check("TTFT error P99, harness - reference", d_p99, 1.5, d_p99 <= 1.5)
    check("resume error mean vs the stub's 50 ms", r_err.mean(), 1.0, r_err.mean() <= 1.0)
    check("resume error P99 vs the stub's 50 ms", float(np.percentile(r_err, 99)), 3.0,
          float(np.percentile(r_err, 99)) <= 3.0)
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
