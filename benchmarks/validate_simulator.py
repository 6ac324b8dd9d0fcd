"""Validation (not part of `make perf`: it needs a live server and about 10 minutes per
policy): the simulator against a live server, every policy, with enough resumes to tell
10% from 30% at the tails.

    python benchmarks/validate_simulator.py --runtime vllm --pool-tokens 2560 \\
        [--trace traces/bench-small.parquet] [--min-resumes 400] [--policies P,...] \\
        [--ctx-per-slot 2048] [--concurrency 6] [--token-scale 1] [--scrape-interval 0.2] \\
        [--tool-jitter 0.05] [--inject PROFILE] [--calibration FILE] [--out DIR]

The trace is repeated end to end (harness.traces.tile) until it holds at least --min-resumes
resumed calls (--tool-jitter F: each tool's latency scaled by its own seeded draw from 1 +/- F,
so that copies of one trajectory started together do not stay in step: harness.traces.tile),
written beside the results, and given to `harness bench --calibrate`: the
server is calibrated first (with the replays' settings; --calibration FILE: one measured
before, used as it is), each policy replayed, then simulated
with the same trace, agents, seed and memory (llama.cpp: slots x context; vLLM and SGLang: the
engine model on the KV pool the server reported), and the calibration re-checked at the end.
A local server is started per policy: llama.cpp with --slots/--ctx-per-slot, vLLM with
--pool-tokens as blocks (--num-gpu-blocks-override, one more for its null block), SGLang with
--max-total-tokens.

It writes `validation.md` (a table for docs/results.md) and `validation.json` beside the
bench's results: per policy, the simulated and measured resume latency at P50/P95/P99 with the
measured side's bootstrap 95% interval at each, the simulated side's range over --seeds seeds
of the server model's draws (its iteration noise and request overheads; the replay's seed, then
seed + 1, ...; the workload stays the replay's), whose median per quantile is the simulated
figure, the error, the measured and simulated reuse, and
whether the targets hold: on llama.cpp within 6% at P50 and 10% at P95 and P99; on vLLM and
SGLang within 15% at P95, 5 points of reuse and 5 points of the share of hinted pauses whose
hint was clipped (released early by the pin-release valve or an expiry: under memory pressure,
e.g. a small --pool-tokens with --inject pressure-light's bystanders). Exits 1 when a target
is missed (the table says which), 2 or 3 when the bench could not run.

The first table also gives, per policy, the same calls' server-reported prompt and decode
times measured over simulated (`paired_ratios`): near 1 where the rates held. A second table
tells the two sources of error apart (harness.model.run_rates): how fast the server computed
during each replay against its calibration (the calls that ran alone, their server-reported
prompt and decode times over what the calibration predicts for them, and their request
overhead's distribution; on a server never idle, the paired ratios instead), and the
simulation rerun with the calibration rescaled to those rates (`<policy>-simulated-run-rates`):
what error is left there is the model's (queueing, batching, the cache), the rest was the
rates'. A last table holds each simulation to its replay's own trajectory starts and tool
ends (`<policy>-simulated-pinned`, harness.simulate.pins): a closed loop's small differences
can grow into bursts the replay never had (or miss those it had), and held to the replay's
timeline the error left is the engine model's alone. `--from DIR` redoes the tables from a
finished validation without replaying (`--resimulate`: its simulations too, with this version
of the simulator).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.bench.run import simulate_like
from harness.model.calibration import read_calibration
from harness.model.run_rates import (
    RateFactors,
    paired_ratios,
    rescaled,
    server_speed,
    waits_by_company,
    waits_in_flight,
)
from harness.records.manifest import read_manifest
from harness.records.store import read_records, read_server_metrics
from harness.simulate.run import DEFAULT_DEADLINE_S
from harness.traces.schema import Provenance, write_trajectories
from harness.traces.tile import tile_steps
from harness.traces.validate import load_trajectories

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validation_tables import QUANTILES, pinned_table, rates_table, table, waits_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DRAW_SEEDS = 10  # simulations per replay and calibration: 0.2-1 s each here
DEFAULT_POLICIES = {"llamacpp": "keep,swap,recompute,ttl",
                    "vllm": "keep,keep-evictable,swap,recompute,ttl",
                    "sglang": "keep,keep-evictable,recompute,ttl"}
VLLM_BLOCK = 32  # the CPU engine's block size


def resumes_per_copy(trace: Path) -> int:
    """Resumed calls of one pass over the trace: LLM steps after a trajectory's first."""
    df = load_trajectories(trace)
    llm = df[df["kind"] == "llm"]
    return int(len(llm) - llm["trajectory_id"].nunique())


def server_args(runtime: str, pool: int | None) -> list[str]:
    """The flags that give a local server the KV pool asked for."""
    if pool is None:
        return []
    if runtime == "vllm":
        return [f"--server-arg=--num-gpu-blocks-override={pool // VLLM_BLOCK + 1}"]
    if runtime == "sglang":
        return [f"--server-arg=--max-total-tokens={pool}"]
    raise SystemExit("error: --pool-tokens is for vllm or sglang (llama.cpp: --slots)")


def rel_error(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return sim / real - 1.0


PREEMPTIONS = "vllm:num_preemptions_total"  # running requests vLLM preempted for memory


def preempted_calls(real_dir: Path, sim_dir: Path) -> tuple[int, int] | None:
    """Running calls preempted for memory during the replay (vLLM's counter, its rise over the
    run) and in its simulation; None where the server does not count them."""
    metrics = read_server_metrics(real_dir)
    if metrics.empty or not (metrics["name"] == PREEMPTIONS).any():
        return None
    v = metrics.loc[metrics["name"] == PREEMPTIONS, "value"]
    sim = read_manifest(sim_dir).simulator or {}
    return int(v.max() - v.min()), int(sim.get("preempted_calls", 0))


def resume_quantiles(run_dir: Path) -> dict[str, float | None]:
    """A run's resume latency at QUANTILES (ms), from its summary.json."""
    lat = json.loads((run_dir / "summary.json").read_text()).get("resume_latency_ms") or {}
    return {q: lat.get(q) for q in QUANTILES}


def clipped_share(summary: dict[str, Any]) -> float | None:
    """The share of a run's hinted pauses whose hint was clipped (released early: the
    pin-release valve, an expiry), from its summary.json; None where it sent no hint."""
    outcomes = summary.get("hint_outcomes") or {}
    if not outcomes.get("hinted"):
        return None
    return float((outcomes.get("shares") or {}).get("clipped", 0.0))


def seed_runs(root: Path, policy: str, calibration: Path, name: str, seeds: int,
              pinned: bool = False) -> list[dict[str, float | None]]:
    """Resume latency quantiles of `<policy>-<name>` (simulated with the replay's seed) and of
    the same simulation with `seeds` - 1 other seeds of the server model's draws (the replay's
    seed + 1, + 2, ...; arrivals, trace and memory stay the replay's): the model's own spread on
    the replay's workload (`pinned`: each held to the replay's timeline, as `<policy>-<name>`
    is). Empty where the simulation or the replay is missing."""
    first = root / f"{policy}-{name}"
    found = replay_and_trace(root, policy)
    if found is None or not (first / "summary.json").exists():
        return []
    runs = [resume_quantiles(first)]
    real_dir, trace = found
    real = read_manifest(real_dir)
    scratch = root / f".{policy}-{name}-seeds"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for k in range(1, seeds):
            simulate_like(real_dir, trace, policy, dict(real.policy_args), calibration,
                          scratch / str(k), draws_seed=int(real.seed or 0) + k, pinned=pinned)
            runs.append(resume_quantiles(scratch / str(k)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return runs


def _median(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(statistics.median(v)) if v else None


def row(root: Path, policy: str, runtime: str, sim_dir: str = "simulated",
        runs: list[dict[str, float | None]] | None = None) -> dict[str, Any] | None:
    """One policy's comparison with `<policy>-<sim_dir>`, or None when either side is missing;
    with `runs` (seed_runs), the simulated figures are their medians and their range is kept."""
    real_p, sim_p = root / policy / "summary.json", root / f"{policy}-{sim_dir}" / "summary.json"
    if not (real_p.exists() and sim_p.exists()):
        return None
    real, sim = json.loads(real_p.read_text()), json.loads(sim_p.read_text())
    rl, sl = real.get("resume_latency_ms") or {}, sim.get("resume_latency_ms") or {}
    runs = runs or [{q: sl.get(q) for q in QUANTILES}]
    sl = {**sl, **{q: _median([r[q] for r in runs]) for q in QUANTILES}}
    spread = {q: [min(v), max(v)] if (v := [x for r in runs if (x := r[q]) is not None])
              else None for q in QUANTILES}
    errs = {q: rel_error(sl.get(q), rl.get(q)) for q in QUANTILES}
    reuse = [(s.get("reuse") or {}).get("hit_rate") for s in (real, sim)]
    r0, r1 = reuse
    points = None if r0 is None or r1 is None else abs(r1 - r0) * 100.0
    clipped = [clipped_share(s) for s in (real, sim)]
    c0, c1 = clipped
    clipped_points = None if c0 is None or c1 is None else abs(c1 - c0) * 100.0
    if runtime == "llamacpp":
        limits = {"p50": 0.06, "p95": 0.10, "p99": 0.10}
        met = all((e := errs[q]) is not None and abs(e) <= lim for q, lim in limits.items())
    else:
        e95 = errs["p95"]
        met = (e95 is not None and abs(e95) <= 0.15 and (points is None or points <= 5.0)
               and (clipped_points is None or clipped_points <= 5.0))
    paired = paired_ratios(read_records(root / policy), read_records(root / f"{policy}-{sim_dir}"))
    return {"policy": policy, "resumes": rl.get("n"), "simulated": {q: sl.get(q) for q in errs},
            "measured": {q: rl.get(q) for q in errs},
            "measured_ci95": {q: (rl.get("ci95") or {}).get(q) for q in QUANTILES},
            "simulated_seeds": {"runs": len(runs), **spread}, "error": errs,
            "reuse_measured": reuse[0], "reuse_simulated": reuse[1], "reuse_points": points,
            "clipped_measured": c0, "clipped_simulated": c1, "clipped_points": clipped_points,
            "server_time_measured_over_simulated": paired, "target_met": met,
            "preempted_calls": preempted_calls(root / policy, root / f"{policy}-{sim_dir}")}


def simulate_again(root: Path, policy: str, calibration: Path, name: str,
                   pinned: bool = False) -> Path | None:
    """The replay `<policy>` simulated (again, with this version of the simulator) at
    `calibration`, into `<policy>-<name>` (what an earlier pass left there replaced; `pinned`:
    held to the replay's trajectory starts and tool ends); None when the replay or its trace
    is missing."""
    found = replay_and_trace(root, policy)
    if found is None:
        return None
    real_dir, trace = found
    sim = root / f"{policy}-{name}"
    if sim.exists():
        shutil.rmtree(sim)
    simulate_like(real_dir, trace, policy, dict(read_manifest(real_dir).policy_args),
                  calibration, sim, pinned=pinned)
    return sim


def pinned_row(root: Path, policy: str, runtime: str, seeds: int = DRAW_SEEDS,
               own_rates: bool = False) -> dict[str, Any] | None:
    """The policy's simulation held to its replay's trajectory starts and tool ends
    (harness.simulate.pins), at the calibration (`<policy>-simulated-pinned`) or at the rates
    the server ran at during the replay (`own_rates`: the calibration run_rates_row rescaled,
    `<policy>-simulated-pinned-run-rates`): the engine model's error without the closed
    loop's; with how many of those times the simulation reached late. None where the replay
    or that calibration is missing."""
    cal, name = root / "calibration.json", "simulated-pinned"
    if own_rates:
        cal, name = root / f"calibration-{policy}-run-rates.json", "simulated-pinned-run-rates"
    if not cal.exists() or (sim := simulate_again(root, policy, cal, name, pinned=True)) is None:
        return None
    r = row(root, policy, runtime, name, seed_runs(root, policy, cal, name, seeds, pinned=True))
    if r is None:
        return None
    return {**r, "pinned": (read_manifest(sim).simulator or {})["pinned_to"],
            "at": "the replay's own rates" if own_rates else "the calibration"}


def replay_and_trace(root: Path, policy: str) -> tuple[Path, Path] | None:
    """The policy's replay folder and the trace it replayed; None where either is missing."""
    real_dir = root / policy
    if not (real_dir / "run.json").exists():
        return None
    real = read_manifest(real_dir)
    trace = None if real.trace is None else ROOT / real.trace.path  # relative: the bench's cwd
    if trace is None or not trace.exists():
        return None
    return real_dir, trace


def own_wake(f: RateFactors) -> str:
    """', its own wake: ...' of the run's fitted curve (server / way ms added at each idle time,
    `*` where the calibration's point was kept), or '' where none was fitted."""
    if not f.wake_curve_ms:
        return ""
    points = [f"{g / 1e3:g} s +{srv:.1f} / +{way:.1f}{'' if ok else '*'}"
              for (g, srv, way), ok in zip(f.wake_curve_ms, f.wake_fitted, strict=True)]
    return "; its own wake (server / way ms): " + ", ".join(points)


def run_rates_row(root: Path, policy: str, runtime: str, seeds: int = DRAW_SEEDS
                  ) -> dict[str, Any] | None:
    """The server's speed during the policy's replay against the bench's calibration, and the
    simulation rerun at that speed (written to `<policy>-simulated-run-rates`); None when the
    replay or the calibration is missing. Where no call ran alone (a server never idle), the
    speed is the same calls' server times measured over simulated (`paired_ratios`)."""
    real_dir, cal_path = root / policy, root / "calibration.json"
    if not ((real_dir / "records").exists() and cal_path.exists()):
        return None
    cal = read_calibration(cal_path)
    records = read_records(real_dir)
    factors = server_speed(records, cal)
    source = f"{factors.calls} calls alone{own_wake(factors)}"
    if factors.calls == 0:
        sim_dir = root / f"{policy}-simulated"
        if not (sim_dir / "records").exists():
            return None
        p = paired_ratios(records, read_records(sim_dir))
        factors = RateFactors(*(None if (v := p[k]) is None else float(v)
                                for k in ("prompt", "decode")), 0)
        source = f"paired, {p['calls']} calls"
    scaled = root / f"calibration-{policy}-run-rates.json"
    scaled.write_text(json.dumps(rescaled(cal, factors).to_dict(), indent=2) + "\n")
    sim = simulate_again(root, policy, scaled, "simulated-run-rates")
    if sim is None:
        return None
    again = row(root, policy, runtime, "simulated-run-rates",
                seed_runs(root, policy, scaled, "simulated-run-rates", seeds))
    if again is None:
        return None
    # A simulated call starts at the engine, its request overhead spent before: its wait is
    # the engine's alone (for an iteration to end), the measured one holds both.
    sim_records = read_records(sim)
    return {**again, "rate_factors": {**factors.to_dict(), "source": source},
            "waits_ms": {"measured": waits_by_company(records),
                         "simulated_engine_only": waits_by_company(sim_records)},
            "waits_in_flight_ms": {"measured": waits_in_flight(records),
                                   "simulated_engine_only": waits_in_flight(sim_records)}}


def write_tables(out: Path, doc: dict[str, Any], again: bool = False,
                 seeds: int = DRAW_SEEDS) -> int:
    """The tables from the bench under `out` (`again`: its simulations redone first; each
    simulation with `seeds` seeds of its draws):
    validation.json and validation.md; the exit status (0: every target met with the
    calibration's rates, 1: one missed)."""
    root, runtime = out / "bench", doc["runtime"]
    policies = doc["policies"]
    if again:
        for p in policies:
            simulate_again(root, p, root / "calibration.json", "simulated")
    cal = root / "calibration.json"
    rows = [r for p in policies
            if (r := row(root, p, runtime, "simulated", seed_runs(root, p, cal, "simulated",
                                                                    seeds)))]
    at_run_rates = [r for p in policies if (r := run_rates_row(root, p, runtime, seeds))]
    pinned = [r for p in policies for own in (False, True)
              if (r := pinned_row(root, p, runtime, seeds, own))]
    doc = {**doc, "draw_seeds": seeds}
    doc = {**doc, "rows": rows, "at_run_rates": at_run_rates, "pinned": pinned}
    (out / "validation.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = (table(rows) + "\n\nAt the rates the server ran at during each replay:\n\n"
            + rates_table(at_run_rates) + "\n\nTime to first token less the server's prompt "
            "time, by what was in flight on the server when each call was sent, each run by "
            "its own company (simulated at the replay's rates, without the request "
            "overhead):\n\n"
            + waits_table(at_run_rates) + "\n\nThe engine model alone: each simulation held "
            "to its replay's trajectory starts and tool ends (never earlier than it reaches "
            "them), so that its calls meet the company the replay's met, at the calibration and "
            "at the replay's own rates:\n\n"
            + pinned_table(pinned) + "\n")
    (out / "validation.md").write_text(text)
    print(text)
    if not rows:
        return doc.get("bench_exit") or 3
    return 0 if all(r["target_met"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=sorted(DEFAULT_POLICIES),
                    help="required unless --from")
    ap.add_argument("--trace", type=Path, default=ROOT / "traces" / "bench-small.parquet")
    ap.add_argument("--min-resumes", type=int, default=450,
                    help="planned resumed calls (cancelled trajectories lose some of theirs)")
    ap.add_argument("--policies")
    ap.add_argument("--pool-tokens", type=int, help="vllm/sglang: the KV pool")
    ap.add_argument("--slots", type=int, default=4, help="llama.cpp")
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--token-scale", type=float, default=1.0)
    ap.add_argument("--scrape-interval", type=float, default=0.2,
                    help="seconds between the replays' server-metrics samples")
    ap.add_argument("--tool-jitter", type=float, default=0.0,
                    help="scale each tool's latency by its own draw from 1 +/- this (seeded): "
                         "copies started together part instead of staying in step")
    ap.add_argument("--inject", help="the replays' injection profile (e.g. pressure-light: "
                                     "bystander requests beside the agents)")
    ap.add_argument("--calibration", type=Path,
                    help="a calibration of this server measured before (harness calibrate, "
                         "with the same model): used instead of measuring one first")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--from", dest="again", type=Path,
                    help="a finished validation's folder: redo its tables, replay nothing")
    ap.add_argument("--seeds", type=int, default=DRAW_SEEDS,
                    help="simulations per replay, each with its own seed of the server model's "
                         "draws (noise, overheads); the simulated figure is their median")
    ap.add_argument("--resimulate", action="store_true",
                    help="with --from: simulate each replay again first (this version of the "
                         "simulator against the stored replays)")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    if not 0.0 <= args.tool_jitter < 1.0:
        ap.error("--tool-jitter must be in [0, 1)")
    if args.again is not None:
        prior = args.again / "validation.json"
        if not prior.exists():
            raise SystemExit(f"error: {prior} does not exist")
        doc = json.loads(prior.read_text())
        doc.setdefault("policies", [r["policy"] for r in doc.get("rows", [])])
        return write_tables(args.again, doc, args.resimulate, args.seeds)
    if args.runtime is None:
        ap.error("--runtime is required (or --from DIR)")
    out = args.out or ROOT / "reports" / (
        f"validation-{args.runtime}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    out.mkdir(parents=True, exist_ok=True)
    per_copy = resumes_per_copy(args.trace)
    if per_copy < 1:
        raise SystemExit(f"error: {args.trace} has no resumed calls")
    copies = -(-args.min_resumes // per_copy)
    tiled = out / f"{args.trace.stem}-x{copies}.parquet"
    notes = [f"{copies} copies end to end"]
    if args.tool_jitter:
        notes.append(f"each tool's latency x U(1 - {args.tool_jitter:g}, 1 + "
                     f"{args.tool_jitter:g}), seed 0")
    # the replays' injection profile gives a tool without a deadline its default one
    write_trajectories(tile_steps(load_trajectories(args.trace), copies, args.tool_jitter,
                                  default_deadline_s=DEFAULT_DEADLINE_S),
                       tiled, Provenance("tiled", [str(args.trace)], notes=notes))
    policies = args.policies or DEFAULT_POLICIES[args.runtime]
    cmd = [sys.executable, "-m", "harness", "bench", "--runtime", args.runtime, "--trace",
           str(tiled), "--policies", policies, "--concurrency",
           str(args.concurrency), "--ctx-per-slot", str(args.ctx_per_slot), "--slots",
           str(args.slots), "--token-scale", str(args.token_scale), "--first-token-timeout",
           "120", "--scrape-interval", str(args.scrape_interval), "--out", str(out / "bench"),
           *server_args(args.runtime, args.pool_tokens),
           *(["--inject", args.inject] if args.inject else []),
           *(["--calibrate"] if args.calibration is None else [])]
    if args.calibration is not None:
        cmd += ["--calibration", str(args.calibration.resolve())]
    print(f"{args.trace.name} x {copies} ({per_copy * copies} resumes): {' '.join(cmd[1:])}",
          flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    if args.calibration is not None and (out / "bench").is_dir():  # where --calibrate puts it
        shutil.copyfile(args.calibration, out / "bench" / "calibration.json")
    doc = {"runtime": args.runtime, "trace": str(args.trace), "copies": copies,
           "tool_jitter": args.tool_jitter, "inject": args.inject,
           "pool_tokens": args.pool_tokens, "concurrency": args.concurrency,
           "scrape_interval_s": args.scrape_interval, "bench_exit": rc,
           "policies": policies.split(",")}
    return write_tables(out, doc, seeds=args.seeds)


if __name__ == "__main__":
    sys.exit(main())
