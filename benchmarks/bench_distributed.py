"""The cost and the gain of distribution: `harness run --workers 2` (two load generators as Ray
actors on a local Ray instance) against one process, on the project's raw-asyncio stub
(harness.selftest.stub: llama-server's protocol, ~0 ms server), open loop, trajectories of 4
calls with tool waits of 1.0-1.6 s.

Runs, each on a fresh stub (not pinned, at the lowest priority: on two CPUs it shares them
with the load generators, and takes what they leave):
- RATE is found first: one process at --rate, then at 1.25x that, and so on (at most
  SEARCH_STEPS more), until one run's client lag P99 passes twice the 10 ms (single runs vary:
  at 1,200 arrivals/s on a Xeon VM one run read 25 ms and three more 6-20 ms); 800 arrivals/s
  saturated one process on an EPYC VM, not on the faster Xeon one (4.2-5.3 ms);
- one process at RATE/2 arrivals per second, on one CPU: the reference CPU per call;
- ROUNDS times, alternating: one process at RATE, on one CPU (a rate that saturates one load
  generator: its client lag P99 over 10 ms), and two load generators at RATE, not pinned (each
  takes half the trajectories: the reference's load per load generator).

Targets: the two load generators' CPU per call (both actors' replay CPU, summed; median of the
rounds) within 1.2x of the reference's, and at RATE the median client lag P99 of the rounds
under 10 ms for two load generators and over it for one process (a shared virtual machine's
CPUs stall now and then: single runs at ~1 core of load vary by 2-5x in their P99).
Also printed: the machine's CPU over each run but the stub's (the driver, Ray's daemons and
actors, start-up and the summary included) and the stub's.

    .venv/bin/python benchmarks/bench_distributed.py [--rate 800] [--seconds 10]

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
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import HARNESS, Checks, start_stub, write_trace  # noqa: E402

CALLS = 4  # per trajectory
# The stub takes the CPU the load generators leave, as a server on machines of its own would
# not compete with them: on two CPUs, three busy processes at one priority made the figures
# about the kernel's time slices (P99 5-45 ms from run to run), not about the load generators.
STUB_NICE = 19


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(url: str, trace: Path, out: Path, rate: float, workers: int,
        cpus: str | None) -> dict[str, Any]:
    cmd = [HARNESS, "run", "--url", url, "--trace", str(trace), "--policy", "keep",
           "--out", str(out), "--scrape-interval", "0.5", "--rate", str(rate),
           "--workers", str(workers)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    busy = machine_busy_s()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, _ = os.wait4(proc.pid, 0)
        busy = machine_busy_s() - busy  # Ray's daemons and actors are not this child's
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"harness run failed: {err.read().decode(errors='replace')[-800:]}")
    run_json = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    calls = int(summary["ttft_ms"]["n"])
    return {"run": run_json, "summary": summary, "calls": calls,
            "cpu_per_call_ms": 1e3 * float(run_json["client_cpu_s"]) / max(calls, 1),
            "machine_cpu_s": busy,
            "lag_p99_ms": float(summary["client_lag_ms"]["p99"])}


def leg(work: Path, name: str, rate: float, seconds: float, workers: int, own: str | None,
        stub_cpus: str | None) -> dict[str, Any]:
    n = int(rate * seconds)
    trace = write_trace(work / f"{name}.parquet", n, CALLS, (1.0, 1.6), seed=3)
    stub = start_stub(0.0, 4096, stub_cpus)
    os.setpriority(os.PRIO_PROCESS, stub.proc.pid, STUB_NICE)
    try:
        before = proc_cpu_s(stub.proc.pid)
        res = run(stub.url, trace, work / name, rate, workers, own)
        res["stub_cpu_s"] = proc_cpu_s(stub.proc.pid) - before
        res["harness_cpu_s"] = res["machine_cpu_s"] - res["stub_cpu_s"]
    finally:
        stub.stop()
    s, r = res["summary"], res["run"]
    print(f"{name}: {workers} load generator(s), {rate:g} arrivals/s ({CALLS * rate:,.0f} "
          f"calls/s offered), {res['calls']:,} calls, trajectories {s['trajectories']}; client "
          f"lag {s['client_lag_ms']}; replay CPU {r['client_cpu_s']:.2f} s "
          f"({res['cpu_per_call_ms']:.3f} ms/call); everything but the stub "
          f"{res['harness_cpu_s']:.1f} CPU s (start-up, Ray, summary included); stub CPU "
          f"{res['stub_cpu_s']:.1f} s", flush=True)
    return res


SEARCH_STEPS = 4  # rate increases by SEARCH_FACTOR tried beyond --rate
SEARCH_FACTOR = 1.25
SATURATED_MS = 10.0  # a load generator's client lag P99 past this: it is saturated
PROBE_MARGIN = 2.0  # a probe must pass SATURATED_MS this many times over (one run is noisy)


def saturating_rate(work: Path, rate: float, seconds: float, own: str | None) -> float:
    """The first of rate, 1.25 rate, ... (SEARCH_STEPS more at most) at which one process's
    client lag P99 passes PROBE_MARGIN x SATURATED_MS; the highest, unprobed, if none before it
    does (the check on the rounds then says whether it saturates)."""
    for _ in range(SEARCH_STEPS):
        probe = leg(work, f"probe-{rate:g}", rate, seconds, 1, own, None)
        if probe["lag_p99_ms"] > PROBE_MARGIN * SATURATED_MS:
            return rate
        rate *= SEARCH_FACTOR
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=800.0,
                    help="arrivals per second to start the search for a rate that saturates "
                         "one load generator from")
    ap.add_argument("--seconds", type=float, default=10.0, help="arrival window")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each at the full rate")
    a = ap.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        print("skipped: Ray is not installed (the [distributed] extra; make setup installs it)")
        return 0
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    own = str(cpus[0]) if len(cpus) > 1 else None
    work = Path(tempfile.mkdtemp(prefix="bench-distributed-"))
    check = Checks()
    rate = saturating_rate(work, a.rate, a.seconds, own)
    print(f"full rate: {rate:g} arrivals/s", flush=True)
    ref = leg(work, "one-half-rate", rate / 2, a.seconds, 1, own, None)
    ones, twos = [], []
    for k in range(a.rounds):
        ones.append(leg(work, f"one-full-rate-{k}", rate, a.seconds, 1, own, None))
        twos.append(leg(work, f"two-full-rate-{k}", rate, a.seconds, 2, None, None))
    lost = sum(t["run"]["outcome"]["failed"] + t["run"]["outcome"]["interrupted"] for t in twos)
    check("two load generators: trajectories not completed", lost, 0, lost == 0, "")
    two_cpu = median(t["cpu_per_call_ms"] for t in twos)
    ratio = two_cpu / ref["cpu_per_call_ms"]
    check("CPU per call, two load generators vs one (same load each)", ratio, 1.2,
          ratio <= 1.2, "x")
    print(f"CPU per call, two load generators vs one at the full rate: "
          f"{two_cpu / median(o['cpu_per_call_ms'] for o in ones):.2f}x", flush=True)
    one_lag, two_lag = (median(r["lag_p99_ms"] for r in rs) for rs in (ones, twos))
    print(f"client lag P99 by round (ms): one process {[round(o['lag_p99_ms'], 1) for o in ones]}"
          f", two load generators {[round(t['lag_p99_ms'], 1) for t in twos]}", flush=True)
    check(f"client lag P99, one process at {rate:g}/s (must saturate; median)", one_lag,
          SATURATED_MS, one_lag > SATURATED_MS)
    check(f"client lag P99, two load generators at {rate:g}/s (median)", two_lag,
          SATURATED_MS, two_lag < SATURATED_MS)
    if check.missed:
        print(f"targets missed: {', '.join(check.missed)}")
    return 1 if check.missed else 0


if __name__ == "__main__":
    sys.exit(main())
