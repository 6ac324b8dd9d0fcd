"""Benchmark: the simulator's speed, against a reference commit measured in the same run.

    python benchmarks/bench_simulate.py [--trajectories 100000] [--reference HEAD~1]
                                        [--rounds 2] [--tolerance 0.10] [--min-speedup 100000]

The trace comes from the generator (the coding-agent profile with 9-13 turns: ~10 pauses per
trajectory), written once to a temporary directory. Each run is timed in a fresh process: the
simulation and the writing of its records (the event loop, and every records part written and
renamed), loading and validating the trace apart. Two targets, neither an absolute time (the
machine's speed moves by tens of percent within minutes):

- the slot model (--engine llamacpp, a token pool) is no slower than the reference commit's on
  the same trace: the best of --rounds runs of each, the two alternated, within --tolerance;
- the engine model (--engine vllm: a paged prefix cache, keep-evictable and pinned keep) runs
  at least --min-speedup times real time: on the slot model's workload (the same trajectories
  and agents; its simulated seconds per pause), that is at most a cost per pause of
  (the slot model's simulated seconds / pauses) / --min-speedup. A policy's own run simulates
  a span of its own (keep-evictable serves the agents without the waits for memory that pinned
  contexts cause, in a third of the simulated time), so its own ratio is printed beside it but
  the target is judged per pause. Keep-evictable runs again with the server's front end (the
  vLLM preset's turn, compute per request and per streamed token: every call and control
  queued through it, its work taken from the iterations), under the same target.

Every run goes without the client's first-token timeout: the workload is a saturated server
(2,000 agents pinning their contexts), which the model keeps serving by preempting a pinned
context when it stalls; with the client's 600-s timeout most of its agents would time out and
fail instead, a different and much shorter run (this tree: 52% of the trajectories completed,
61,288 s simulated), and references before the timeout cannot run that way. So both trees
simulate the same events, and this tree's timeout costs one check per call.

The reference is the commit's source extracted with `git archive` to a temporary directory and
its event loop compiled there as `make setup` compiles it (mypyc; when the current tree runs
pure Python, so does the reference); `--reference none` skips it. Exits 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.simulate import native
from harness.traces.generator import generate, provenance_for
from harness.traces.profiles import load_profile
from harness.traces.schema import write_trajectories

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = dict(
    runtime="vllm", server_version="bench", model="qwen2.5-3b", kv_bytes_per_token=36864,
    prefill_tok_s=20_000.0, decode_tok_s=60.0, swap_out_bytes_per_s=8 * 2**30,
    swap_in_bytes_per_s=8 * 2**30, measured_at="bench")
# ... with the server's front end as the vLLM preset measured it (this tree's engine model only)
FRONT_END = dict(front_end_ms=1.3743, front_end_cpu_ms=2.202, stream_token_ms=0.1251)

# One timed simulation, run in a fresh interpreter whose `harness` is the tree given (the
# editable install's finder is taken out so that a reference tree is imported, not this one).
# It uses the API the tree has: run_simulation of SimOptions where the tree has them, else of
# its arguments, and check_capacity (and, where the tree has it, no first-token timeout: the
# reference's behaviour, see the module docstring).
CHILD = r"""
import inspect, json, sys, time
tree, trace, out, policy, engine, tokens, conc, cal = sys.argv[1:9]
sys.meta_path[:] = [f for f in sys.meta_path
                    if not type(f).__module__.startswith("__editable__")]
sys.path.insert(0, tree)
from pathlib import Path
from harness.model.calibration import Calibration
from harness.simulate import native
from harness.simulate.run import Arrivals, check_capacity, run_simulation
cap = (check_capacity(int(tokens), None, None) if engine == "llamacpp"
       else check_capacity(int(tokens), None, None, engine))
try:
    from harness.simulate.options import SimOptions
except ImportError:  # a tree before the simulation's options were one value
    SimOptions = None
t0 = time.perf_counter()
if SimOptions is not None:
    run = run_simulation(SimOptions(Path(trace), policy, {}, cap, None,
                                    Arrivals("closed", int(conc)), 0, Path(out),
                                    write_summary=False, first_token_timeout_s=float("inf")),
                         Calibration(**json.loads(cal)))
else:
    kw = ({"first_token_timeout_s": float("inf")}
          if "first_token_timeout_s" in inspect.signature(run_simulation).parameters else {})
    run = run_simulation(Path(trace), policy, {}, cap, Calibration(**json.loads(cal)), None,
                         Arrivals("closed", int(conc)), 0, Path(out), write_summary=False,
                         **kw)
wall = time.perf_counter() - t0
s = run.simulator
print(json.dumps({"timed": wall - s["wall_s"]["load"], "load": s["wall_s"]["load"],
                  "loop": s["wall_s"]["loop"], "pauses": s["pauses"], "records": s["records"],
                  "sim_s": run.duration_s, "engine": native.ENGINE,
                  "completed": run.outcome.completed}))
"""


def timed_run(tree: Path, trace: Path, out: Path, policy: str, engine: str, tokens: int,
              concurrency: int, front_end: bool = False) -> dict[str, Any]:
    """One simulation in a fresh process on `tree`'s harness: its timings (JSON)."""
    cal = {**CALIBRATION, **(FRONT_END if front_end else {})}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(trace), str(out), policy, engine,
         str(tokens), str(concurrency), json.dumps(cal)],
        capture_output=True, text=True, cwd=tree, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"simulation on {tree} failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def reference_tree(ref: str, tmp: Path) -> Path | None:
    """`ref`'s source in `tmp`/reference, its event loop compiled unless this tree runs pure
    Python (then the reference does too); None (said why) when git has no such commit, e.g.
    in a shallow clone."""
    tree = tmp / "reference"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True,
                             check=False)
    if archive.returncode != 0:
        print(f"NOT CHECKED: the slot model against --reference {ref}, which git cannot give "
              f"here ({archive.stderr.decode().strip()[:200]}); a full clone has it",
              file=sys.stderr)
        return None
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    # pyproject maps harness.adapters onto adapters/; a plain path entry needs the link
    (tree / "harness" / "adapters").symlink_to(tree / "adapters")
    if native.ENGINE == native.COMPILED_ENGINE:
        # setup.py alone builds the extensions (the project's metadata is not needed, and
        # this interpreter's setuptools may read pyproject.toml differently than a build's)
        (tree / "pyproject.toml").unlink()
        env = {**os.environ}
        env.pop("HARNESS_SIMULATOR", None)
        build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=tree, capture_output=True, text=True, env=env, check=False)
        if build.returncode != 0:
            raise SystemExit(f"error: compiling the reference's loop failed: "
                             f"{build.stderr.strip()[-500:]}")
    return tree


def describe(r: dict[str, Any]) -> str:
    return (f"{r['timed']:6.2f} s simulation + records (loop {r['loop']:.2f}); load "
            f"{r['load']:.2f} s apart; {r['pauses']} pauses, {r['records']} records, "
            f"{1e6 * r['timed'] / max(r['pauses'], 1):.2f} us/pause, {r['completed']} completed, "
            f"{r['sim_s']:.0f} s simulated: {r['sim_s'] / r['timed']:,.0f}x real time; loop "
            f"{r['engine']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--capacity-tokens", type=int, default=8_000_000)
    ap.add_argument("--engine-capacity-tokens", type=int, default=4_000_000,
                    help="the engine model's pool: smaller, so that its cache evicts")
    ap.add_argument("--reference", default="HEAD~1", help="a commit, or 'none'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--min-speedup", type=float, default=100_000.0)
    args = ap.parse_args(argv)
    profile = dataclasses.replace(load_profile("coding-agent"), turns_min=9, turns_max=13)
    missed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        df = generate(profile, args.trajectories, 0)
        trace = write_trajectories(df, tmp / "trace.parquet",
                                   provenance_for(profile, args.trajectories, 0))
        n_pauses = int((df["kind"] == "tool").sum())
        del df
        print(f"trace: {args.trajectories} trajectories, {n_pauses} pauses (generated in "
              f"{time.perf_counter() - t0:.1f} s); event loop: {native.ENGINE}")
        ref = None if args.reference == "none" else reference_tree(args.reference, tmp)
        k = 0

        def run(tree: Path, policy: str, engine: str, tokens: int,
                front_end: bool = False) -> dict[str, Any]:
            nonlocal k
            k += 1
            return timed_run(tree, trace, tmp / f"run-{k}", policy, engine, tokens,
                             args.concurrency, front_end)

        # the slot model, current and reference alternated
        cur: list[dict[str, Any]] = []
        old: list[dict[str, Any]] = []
        for _ in range(max(args.rounds, 1)):
            if ref is not None:
                old.append(run(ref, "keep", "llamacpp", args.capacity_tokens))
            cur.append(run(ROOT, "keep", "llamacpp", args.capacity_tokens))
        best = min(cur, key=lambda r: r["timed"])
        print(f"slot model, keep, this tree: {describe(best)}")
        if old:
            best_old = min(old, key=lambda r: r["timed"])
            ratio = best["timed"] / best_old["timed"]
            print(f"slot model, keep, {args.reference}: {describe(best_old)}")
            print(f"  this tree / {args.reference}: {ratio:.3f} (target <= "
                  f"{1 + args.tolerance:.2f}; best of {len(cur)} each, alternated)")
            if ratio > 1 + args.tolerance:
                missed.append(f"slot model {ratio:.2f}x the reference's time")
        # the engine model's budget per pause: --min-speedup on the slot model's workload
        budget_us = 1e6 * best["sim_s"] / max(best["pauses"], 1) / args.min_speedup
        for policy, front_end in (("keep-evictable", False), ("keep", False),
                                  ("keep-evictable", True)):
            r = min((run(ROOT, policy, "vllm", args.engine_capacity_tokens, front_end)
                     for _ in range(max(args.rounds, 1))), key=lambda r: r["timed"])
            us = 1e6 * r["timed"] / max(r["pauses"], 1)
            with_fe = " with the server's front end" if front_end else ""
            print(f"engine model (vllm){with_fe}, {policy}: {describe(r)}")
            print(f"  {us:.2f} us/pause: {best['sim_s'] / best['pauses'] / us * 1e6:,.0f}x real "
                  f"time on the slot model's workload (target >= {args.min_speedup:,.0f}x: "
                  f"<= {budget_us:.2f} us/pause)")
            if us > budget_us:
                missed.append(f"engine model{with_fe} {policy} at {us:.2f} us/pause")
    for m in missed:
        print(f"MISSED: {m}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
