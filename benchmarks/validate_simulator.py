"""Validation (not part of `make perf`: it needs a live server and about 10 minutes per
policy): the simulator against a live server, every policy, with enough resumes to tell
10% from 30% at the tails.

    python benchmarks/validate_simulator.py --runtime vllm --pool-tokens 2560 \\
        [--trace traces/bench-small.parquet] [--min-resumes 400] [--policies P,...] \\
        [--ctx-per-slot 2048] [--concurrency 6] [--token-scale 1] [--out DIR]

The trace is repeated end to end (harness.traces.tile) until it holds at least --min-resumes
resumed calls, written beside the results, and given to `harness bench --calibrate`: the
server is calibrated first (with the replays' settings), each policy replayed, then simulated
with the same trace, agents, seed and memory (llama.cpp: slots x context; vLLM and SGLang: the
engine model on the KV pool the server reported), and the calibration re-checked at the end.
A local server is started per policy: llama.cpp with --slots/--ctx-per-slot, vLLM with
--pool-tokens as blocks (--num-gpu-blocks-override, one more for its null block), SGLang with
--max-total-tokens.

It writes `validation.md` (a table for docs/results.md) and `validation.json` beside the
bench's results: per policy, the simulated and measured resume latency at P50/P95/P99 with the
measured side's bootstrap 95% interval, the error, the measured and simulated reuse, and
whether the targets hold: on llama.cpp within 6% at P50 and 10% at P95 and P99; on vLLM and
SGLang within 15% at P95 and 5 points of reuse. Exits 1 when a target is missed (the table
says which), 2 or 3 when the bench could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.traces.schema import Provenance, write_trajectories
from harness.traces.tile import tile_steps
from harness.traces.validate import load_trajectories

ROOT = Path(__file__).resolve().parent.parent
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


def row(root: Path, policy: str, runtime: str) -> dict[str, Any] | None:
    """One policy's comparison, or None when either side is missing."""
    real_p, sim_p = root / policy / "summary.json", root / f"{policy}-simulated" / "summary.json"
    if not (real_p.exists() and sim_p.exists()):
        return None
    real, sim = json.loads(real_p.read_text()), json.loads(sim_p.read_text())
    rl, sl = real.get("resume_latency_ms") or {}, sim.get("resume_latency_ms") or {}
    errs = {q: rel_error(sl.get(q), rl.get(q)) for q in ("p50", "p95", "p99")}
    reuse = [(s.get("reuse") or {}).get("hit_rate") for s in (real, sim)]
    r0, r1 = reuse
    points = None if r0 is None or r1 is None else abs(r1 - r0) * 100.0
    if runtime == "llamacpp":
        limits = {"p50": 0.06, "p95": 0.10, "p99": 0.10}
        met = all((e := errs[q]) is not None and abs(e) <= lim for q, lim in limits.items())
    else:
        e95 = errs["p95"]
        met = e95 is not None and abs(e95) <= 0.15 and (points is None or points <= 5.0)
    return {"policy": policy, "resumes": rl.get("n"), "simulated": {q: sl.get(q) for q in errs},
            "measured": {q: rl.get(q) for q in errs},
            "measured_p95_ci95": (rl.get("ci95") or {}).get("p95"), "error": errs,
            "reuse_measured": reuse[0], "reuse_simulated": reuse[1], "reuse_points": points,
            "target_met": met}


def _ms(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:,.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.0f}%"


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | resumes | simulated P50 / P95 / P99 ms | measured P50 / P95 / P99 ms | "
           "measured P95 95% CI | error P50 / P95 / P99 | reuse measured / simulated | "
           "target |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, m, e, ci = r["simulated"], r["measured"], r["error"], r["measured_p95_ci95"]
        reuse = ("-" if r["reuse_measured"] is None else
                 f"{r['reuse_measured'] * 100:.1f}% / {r['reuse_simulated'] * 100:.1f}%")
        out.append(f"| {r['policy']} | {r['resumes']} | {_ms(s['p50'])} / {_ms(s['p95'])} / "
                   f"{_ms(s['p99'])} | {_ms(m['p50'])} / {_ms(m['p95'])} / {_ms(m['p99'])} | "
                   f"{'-' if not ci else _ms(ci[0]) + '-' + _ms(ci[1])} | {_pct(e['p50'])} / "
                   f"{_pct(e['p95'])} / {_pct(e['p99'])} | {reuse} | "
                   f"{'met' if r['target_met'] else 'MISSED'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=sorted(DEFAULT_POLICIES), required=True)
    ap.add_argument("--trace", type=Path, default=ROOT / "traces" / "bench-small.parquet")
    ap.add_argument("--min-resumes", type=int, default=450,
                    help="planned resumed calls (cancelled trajectories lose some of theirs)")
    ap.add_argument("--policies")
    ap.add_argument("--pool-tokens", type=int, help="vllm/sglang: the KV pool")
    ap.add_argument("--slots", type=int, default=4, help="llama.cpp")
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--token-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = args.out or ROOT / "reports" / (
        f"validation-{args.runtime}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    out.mkdir(parents=True, exist_ok=True)
    per_copy = resumes_per_copy(args.trace)
    if per_copy < 1:
        raise SystemExit(f"error: {args.trace} has no resumed calls")
    copies = -(-args.min_resumes // per_copy)
    tiled = out / f"{args.trace.stem}-x{copies}.parquet"
    write_trajectories(tile_steps(load_trajectories(args.trace), copies), tiled,
                       Provenance("tiled", [str(args.trace)],
                                  notes=[f"{copies} copies end to end"]))
    policies = args.policies or DEFAULT_POLICIES[args.runtime]
    cmd = [sys.executable, "-m", "harness", "bench", "--runtime", args.runtime, "--trace",
           str(tiled), "--policies", policies, "--calibrate", "--concurrency",
           str(args.concurrency), "--ctx-per-slot", str(args.ctx_per_slot), "--slots",
           str(args.slots), "--token-scale", str(args.token_scale), "--first-token-timeout",
           "120", "--out", str(out / "bench"), *server_args(args.runtime, args.pool_tokens)]
    print(f"{args.trace.name} x {copies} ({per_copy * copies} resumes): {' '.join(cmd[1:])}",
          flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    rows = [r for p in policies.split(",") if (r := row(out / "bench", p, args.runtime))]
    doc = {"runtime": args.runtime, "trace": str(args.trace), "copies": copies,
           "pool_tokens": args.pool_tokens, "concurrency": args.concurrency,
           "bench_exit": rc, "rows": rows}
    (out / "validation.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "validation.md").write_text(table(rows) + "\n")
    print(table(rows))
    if not rows:
        return rc or 3
    return 0 if all(r["target_met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
