"""The harness at load, against a server whose delays are known.

The stub (harness.selftest.stub: llama-server's protocol, raw asyncio, exact delays) runs on one
core; `harness run` replays on the other, in a process of its own so that its peak RSS and CPU
are its own. Two legs, each figure printed with its target:

- open loop, ~1,000 agents at ~1,000 calls/s (250 arrivals/s, 4 calls and 3 tool waits of
  ~1.3 s each), 50 ms server: TTFT error against the stub's 50 ms <= +2 ms mean / +10 ms P99;
  the achieved arrival rate within 1% of the plan's;
- closed loop, 10,000 agents (each starting at a time drawn over the first 10 s, then calling
  back to back after tool waits of 5-15 s: ~1,000 calls/s offered), ~0 ms server: every
  trajectory completes, peak RSS < 1 GB, client CPU per call within 1.3x of a 100-agent
  run of the same shape, client lag P99 < 10 ms, resume P50 < 5 ms.

    .venv/bin/python benchmarks/bench_scale.py [--agents 10000] [--quick]

Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError
from harness.metrics.frames import build_frames
from harness.records.store import read_records
from harness.selftest import measure
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories

HARNESS = str(Path(sys.executable).with_name("harness"))


def start_stub(ttft_ms: float, slots: int, cpus: str | None) -> measure.Stub:
    try:
        return measure.start_stub(ttft_ms, cpus, slots=slots)
    except HarnessError as exc:
        raise SystemExit(f"the stub did not start: {exc}") from None


def write_trace(path: Path, trajectories: int, calls: int, wait_s: tuple[float, float],
                seed: int = 0, starts_over_s: float = 0.0) -> Path:
    """`trajectories` agents of `calls` calls (64 then 8 tokens in, 4 out) with tool waits
    drawn uniformly from `wait_s`, each starting at a time drawn from [0, starts_over_s)."""
    rng = np.random.default_rng(seed)
    n_tools = calls - 1
    waits = rng.uniform(wait_s[0], wait_s[1], size=(trajectories, max(n_tools, 1)))
    starts = rng.uniform(0.0, starts_over_s, size=trajectories)
    rows: list[dict[str, Any]] = []
    for a in range(trajectories):
        step = 0
        for c in range(calls):
            if c:
                rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "tool",
                             "tool_class": "local_read", "tool_name": "cat",
                             "latency_s": float(waits[a, c - 1]), "deadline_s": 600.0,
                             "outcome": "ok", "mutating": False, "start_s": starts[a]})
                step += 1
            rows.append({"trajectory_id": f"a{a}", "step": step, "kind": "llm",
                         "input_tokens": 64 if c == 0 else 8, "output_tokens": 4,
                         "start_s": starts[a]})
            step += 1
    return write_trajectories(steps_table(rows, SYNTHETIC_DEFAULTS), path,
                              Provenance("bench_scale"))


def harness_run(url: str, trace: Path, out: Path, arrival: list[str], cpus: str | None
                ) -> dict[str, Any]:
    """`harness run` in a process of its own: its run.json, summary.json, peak RSS and CPU."""
    cmd = [HARNESS, "run", "--url", url, "--trace", str(trace), "--policy", "keep",
           "--out", str(out), "--scrape-interval", "0.5", *arrival]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS and CPU
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"harness run failed ({proc.returncode}): "
                             f"{err.read().decode(errors='replace')[-500:]}")
    return {"run": json.loads((out / "run.json").read_text()),
            "summary": json.loads((out / "summary.json").read_text()),
            "peak_rss_mib": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def replay_cpu_per_call_ms(result: dict[str, Any], calls: int) -> float:
    """The client's CPU over the replay itself (run.json's client_cpu_s), per call."""
    cpu = result["run"].get("client_cpu_s") or result["cpu_s"]
    return 1e3 * float(cpu) / max(calls, 1)


class Checks:
    def __init__(self) -> None:
        self.missed: list[str] = []

    def __call__(self, name: str, value: float, target: float, ok: bool,
                 unit: str = "ms") -> None:
        print(f"{name:<52} {value:>10.2f} {unit:<4} target {target:g}  "
              f"{'OK' if ok else 'MISSED'}", flush=True)
        if not ok:
            self.missed.append(name)


def open_loop(work: Path, check: Checks, stub_cpus: str | None, own: str | None,
              rate: float, seconds: float) -> None:
    n = int(rate * seconds)
    trace = write_trace(work / "open.parquet", n, 4, (1.0, 1.6), seed=1)
    stub = start_stub(50.0, 4096, stub_cpus)
    try:
        res = harness_run(stub.url, trace, work / "open", ["--rate", str(rate)], own)
    finally:
        stub.stop()
    rec = read_records(work / "open")
    calls = build_frames(rec).calls
    err = calls["ttft_ms"].dropna().to_numpy() - 50.0
    starts = rec[rec.event == "trajectory_start"].sort_values("planned_ns")
    planned = starts["planned_ns"].to_numpy()
    actual = np.sort(starts["t_ns"].to_numpy())
    target_rate = (len(planned) - 1) / ((planned[-1] - planned[0]) / 1e9)
    achieved = (len(actual) - 1) / ((actual[-1] - actual[0]) / 1e9)
    active = res["summary"]["trajectories"]
    print(f"open loop: {len(calls):,} calls in {res['run']['duration_s']:.1f} s "
          f"({len(calls) / res['run']['duration_s']:,.0f}/s), {len(planned):,} arrivals; "
          f"trajectories {active}; TTFT error mean {err.mean():+.2f} / P99 "
          f"{np.percentile(err, 99):+.2f} ms; client lag {res['summary']['client_lag_ms']}",
          flush=True)
    check("open loop: TTFT error mean vs the stub's 50 ms", float(err.mean()), 2.0,
          err.mean() <= 2.0)
    check("open loop: TTFT error P99 vs the stub's 50 ms", float(np.percentile(err, 99)), 10.0,
          np.percentile(err, 99) <= 10.0)
    dev = abs(achieved / target_rate - 1) * 100
    check("open loop: achieved arrival rate vs the plan's", dev, 1.0, dev <= 1.0, "%")


def closed_loop(work: Path, check: Checks, stub_cpus: str | None, own: str | None,
                agents: int) -> None:
    results = {}
    for n in (100, agents):
        # Each agent's first call at a time drawn over one tool wait, as a fleet of agents
        # already running would be: the offered rate is agents / wait from the start.
        trace = write_trace(work / f"closed{n}.parquet", n, 3, (5.0, 15.0), seed=2,
                            starts_over_s=10.0)
        stub = start_stub(0.0, n + 16, stub_cpus)
        try:
            results[n] = harness_run(stub.url, trace, work / f"closed{n}", ["--trace-timing"],
                                     own)
        finally:
            stub.stop()
    small, big = results[100], results[agents]
    s = big["summary"]
    done = s["trajectories"]
    print(f"closed loop, {agents:,} agents: trajectories {done}; resume "
          f"{s['resume_latency_ms']}; client lag {s['client_lag_ms']}; peak RSS "
          f"{big['peak_rss_mib']:,.0f} MiB; duration {big['run']['duration_s']:.1f} s",
          flush=True)
    completed = int(big["run"]["outcome"]["completed"])
    check(f"closed loop: trajectories completed of {agents:,}", completed, agents,
          completed == agents, "")
    check("closed loop: peak RSS", big["peak_rss_mib"], 1024, big["peak_rss_mib"] < 1024, "MiB")
    cpu_big = replay_cpu_per_call_ms(big, 3 * agents)
    cpu_small = replay_cpu_per_call_ms(small, 300)
    print(f"client CPU per call: 100 agents {cpu_small:.3f} ms, {agents:,} agents "
          f"{cpu_big:.3f} ms", flush=True)
    check("closed loop: CPU per call vs 100 agents", cpu_big / cpu_small, 1.3,
          cpu_big / cpu_small <= 1.3, "x")
    lag = float(s["client_lag_ms"]["p99"])
    check("closed loop: client lag P99", lag, 10.0, lag < 10.0)
    p50 = float(s["resume_latency_ms"]["p50"])
    check("closed loop: resume P50 against a ~0 ms server", p50, 5.0, p50 < 5.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=250.0, help="open-loop arrivals per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="open-loop arrival window")
    ap.add_argument("--only", choices=["open", "closed"])
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    stub_cpus = ",".join(map(str, cpus[1:])) if len(cpus) > 1 else None
    own = str(cpus[0]) if len(cpus) > 1 else None
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    check = Checks()
    if a.only != "closed":
        open_loop(work, check, stub_cpus, own, a.rate, a.seconds)
    if a.only != "open":
        closed_loop(work, check, stub_cpus, own, a.agents)
    if check.missed:
        print(f"targets missed: {', '.join(check.missed)}")
    return 1 if check.missed else 0


if __name__ == "__main__":
    sys.exit(main())
