"""Benchmark: simulate 100,000 generated trajectories (~1M pauses) and check the 10 s target.

    python benchmarks/bench_simulate.py [--trajectories 100000] [--policy keep] [--target-s 10]

The trace comes from the generator (the coding-agent profile with 9-13 turns: ~10 pauses per
trajectory) and is written once to a temporary directory. Timed against the target: the
simulation and the writing of its records (the event loop, and every records part written and
renamed). Reported apart: generating the trace, and loading + validating it (what
`harness simulate` also does before simulating). summary.json is not written (--summary times it).
Exits 1 when any policy is over the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from harness.model.calibration import Calibration
from harness.records.manifest import Outcome
from harness.simulate import native
from harness.simulate.run import Arrivals, check_capacity, run_simulation
from harness.traces.generator import generate, provenance_for
from harness.traces.profiles import load_profile
from harness.traces.schema import write_trajectories

CALIBRATION = Calibration(
    runtime="vllm", server_version="bench", model="qwen2.5-3b", kv_bytes_per_token=36864,
    prefill_tok_s=20_000.0, decode_tok_s=60.0, swap_out_bytes_per_s=8 * 2**30,
    swap_in_bytes_per_s=8 * 2**30, measured_at="bench")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--policy", action="append", help="repeatable (default keep)")
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--capacity-tokens", type=int, default=8_000_000)
    ap.add_argument("--target-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--summary", action="store_true", help="also time summary.json")
    args = ap.parse_args(argv)
    profile = dataclasses.replace(load_profile("coding-agent"), turns_min=9, turns_max=13)
    over = False
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        df = generate(profile, args.trajectories, args.seed)
        trace = write_trajectories(df, Path(tmp) / "trace.parquet",
                                   provenance_for(profile, args.trajectories, args.seed))
        n_pauses = int((df["kind"] == "tool").sum())
        del df
        print(f"trace: {args.trajectories} trajectories, {n_pauses} pauses "
              f"(generated in {time.perf_counter() - t0:.1f} s); event loop: {native.ENGINE}")
        for policy in args.policy or ["keep"]:
            out = Path(tmp) / f"run-{policy}"
            t1 = time.perf_counter()
            run = run_simulation(trace, policy, {}, check_capacity(args.capacity_tokens, None,
                                                                   None),
                                 CALIBRATION, None, Arrivals("closed", args.concurrency), args.seed,
                                 out, write_summary=False)
            wall = time.perf_counter() - t1
            s, o = run.simulator or {}, (run.outcome or Outcome()).__dict__
            timed = wall - s["wall_s"]["load"]  # simulation + records written
            line = (f"{policy:>10}: {timed:6.2f} s simulation + records (loop "
                    f"{s['wall_s']['loop']:.2f}, then the writer's last parts "
                    f"{timed - s['wall_s']['loop']:.2f}); load + validate "
                    f"{s['wall_s']['load']:.2f} s apart; {s['pauses']} pauses, {s['records']} "
                    f"records, {s['events']} loop events, "
                    f"{1e6 * timed / max(s['pauses'], 1):.2f} us/pause; {o['completed']} "
                    f"completed, {o['cancelled']} cancelled, {s['preemptions']} preemptions, "
                    f"{run.duration_s or 0:.0f} s simulated")
            print(line)
            if args.summary:
                from harness.simulate.run import summarize_into

                t2 = time.perf_counter()
                summarize_into(out, run)
                print(f"{'':>10}  summary.json in {time.perf_counter() - t2:.1f} s")
            if timed > args.target_s:
                over = True
                print(f"{'':>10}  OVER the {args.target_s:g} s target", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
