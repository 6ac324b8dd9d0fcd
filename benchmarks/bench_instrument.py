"""The harness's own error, against a server whose delays are known.

The stub (harness.selftest.stub: the llama.cpp protocol, raw asyncio) runs on one core with a
fixed time to first token; the harness replays on the other. A plain aiohttp + uvloop loop, the
reference client, measures the same stub in the same run. Figures and targets (ratios and
differences within this one run):

- throughput at 64 agents, 0 ms server, 16 tokens per call: keep >= 0.75x the reference loop;
- TTFT error at 8 agents, 50 ms server: within +0.5 ms mean / +1.5 ms P99 of the reference's;
- resume-latency error at 8 agents (tool end -> first token, against the stub's 50 ms) beyond
  the reference's own call after the same pause: <= +1 ms mean / +3 ms P99. The error against the
  stub's 50 ms alone is printed beside it: it holds what the machine costs any client after a
  pause (on a 2-core Xeon VM the reference loop itself measured +2.5 ms mean / +4.3 ms P99 after
  20-ms pauses, and a bare client and stub 18 ms after 3 s of idle time), which is no error of
  the harness's.

Prints each figure with its target; exit 1 when one is missed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from harness.errors import HarnessError
from harness.replay.loop import run as run_loop
from harness.selftest import measure
from harness.selftest.measure import reference

TTFT_MS = 50.0
# Throughput targets against the reference loop: swap and recompute send slot actions.
POLICY_TARGETS = {"keep": 0.75, "swap": 0.5, "recompute": 0.5}


def start_stub(ttft_ms: float, cpus: str | None) -> tuple[subprocess.Popen[bytes], str]:
    try:
        stub = measure.start_stub(ttft_ms, cpus)
    except HarnessError:
        raise SystemExit("the stub did not start") from None
    return stub.proc, stub.url


def trace(path: Path, agents: int, calls: int, tool_s: float, out_tokens: int) -> Path:
    return measure.synthetic_trace(path, agents, calls, tool_s, out_tokens, "bench_instrument")


def harness_run(url: str, trace_path: Path, agents: int, out: Path, policy: str = "keep"
                ) -> tuple[pd.DataFrame, float]:
    """A harness replay on the stub: (agent calls with ttft_ms / resume_ms, calls/s)."""
    replay = measure.harness_replay(url, trace_path, agents, out, policy)
    return replay.calls, replay.calls_per_s


ROUNDS = 3  # alternating reference / harness rounds: the VM's speed drifts within a run


def throughput(work: Path, stub_cpus: str | None, check: Callable[..., None]) -> None:
    """Calls/s at 64 agents against a 0 ms stub: each policy's median ratio over ROUNDS
    rounds, each round's ratio against a reference pass measured just before it."""
    proc, url = start_stub(0.0, stub_cpus)
    ratios: dict[str, list[float]] = {p: [] for p in POLICY_TARGETS}
    try:
        t64 = trace(work / "t64.parquet", 64, 60, 0.0, 16)
        for r in range(ROUNDS):
            for policy in POLICY_TARGETS:
                _, ref_rate = run_loop(reference(url, 64, 60, 16))
                _, h_rate = harness_run(url, t64, 64, work / f"tput-{policy}-{r}", policy)
                ratios[policy].append(h_rate / ref_rate)
                print(f"  round {r + 1}, {policy}: reference {ref_rate:,.0f} calls/s, "
                      f"harness {h_rate:,.0f} calls/s ({h_rate / ref_rate:.2f}x)", flush=True)
    finally:
        proc.kill()
        proc.wait()
    for policy, target in POLICY_TARGETS.items():
        ratio = float(np.median(ratios[policy]))
        check(f"throughput ratio harness / reference ({policy})", ratio, target,
              ratio >= target, "x")


def errors(work: Path, stub_cpus: str | None, check: Callable[..., None]) -> None:
    """TTFT and resume error at 8 agents, 50 ms stub, 20 ms tool waits (the reference pauses
    as long between its calls)."""
    proc, url = start_stub(TTFT_MS, stub_cpus)
    ref_all, ref_resume, h_ttft, h_resume = [], [], [], []
    try:
        t8 = trace(work / "t8.parquet", 8, 40, 0.02, 4)
        for r in range(ROUNDS):
            ref, _ = run_loop(reference(url, 8, 40, 4, 0.02))
            calls, _ = harness_run(url, t8, 8, work / f"err-{r}")
            ref_all.append(ref.ravel())
            ref_resume.append(ref[:, 1:].ravel())
            h_ttft.append(calls["ttft_ms"].dropna().to_numpy())
            h_resume.append(calls["resume_ms"].dropna().to_numpy())
    finally:
        proc.kill()
        proc.wait()
    ref_err = np.concatenate(ref_all) - TTFT_MS
    ref_r_err = np.concatenate(ref_resume) - TTFT_MS
    h_err = np.concatenate(h_ttft) - TTFT_MS
    r_err = np.concatenate(h_resume) - TTFT_MS

    def p99(a: np.ndarray) -> float:
        return float(np.percentile(a, 99))

    print(f"TTFT error at 8 agents: reference mean {ref_err.mean():+.2f} / P99 "
          f"{p99(ref_err):+.2f} ms; harness mean {h_err.mean():+.2f} / P99 {p99(h_err):+.2f} ms;"
          f" resume error mean {r_err.mean():+.2f} / P99 {p99(r_err):+.2f} ms ({len(r_err)} "
          f"resumes); the reference's call after a pause: mean {ref_r_err.mean():+.2f} / P99 "
          f"{p99(ref_r_err):+.2f} ms", flush=True)
    d_mean = h_err.mean() - ref_err.mean()
    d_p99 = p99(h_err) - p99(ref_err)
    check("TTFT error mean, harness - reference", d_mean, 0.5, d_mean <= 0.5)
    check("TTFT error P99, harness - reference", d_p99, 1.5, d_p99 <= 1.5)
    # What the machine itself costs a minimal client after a pause (loopback, waking an idle
    # core and its memory), taken off: the part of the resume error that is the harness's.
    own_mean, own_p99 = r_err.mean() - ref_r_err.mean(), p99(r_err) - p99(ref_r_err)
    check("resume error mean beyond the reference's", own_mean, 1.0, own_mean <= 1.0)
    check("resume error P99 beyond the reference's", own_p99, 3.0, own_p99 <= 3.0)


def main() -> int:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    stub_cpus = ",".join(map(str, cpus[1:])) if len(cpus) > 1 else None
    if stub_cpus:
        os.sched_setaffinity(0, {cpus[0]})
    missed: list[str] = []

    def check(name: str, value: float, target: float, ok: bool, unit: str = "ms") -> None:
        print(f"{name:<48} {value:>9.2f} {unit:<3} target {target:g}  {'OK' if ok else 'MISSED'}",
              flush=True)
        if not ok:
            missed.append(name)

    work = Path(tempfile.mkdtemp(prefix="bench-instrument-"))
    throughput(work, stub_cpus, check)
    errors(work, stub_cpus, check)
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
