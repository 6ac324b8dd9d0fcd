"""Continuum's published result, reproduced two ways (not part of `make perf`: it needs the
shared traces, and its live part a CPU vLLM server; about 40 minutes in all on a 2-core VM).

    python benchmarks/reproduce_continuum.py [--part sim,live|tables] [--jobs 500] [--agents 64]
        [--replicates 5] [--live-jobs 32] [--live-agents 8] [--pool-tokens 2560]
        [--token-scale 0.02] [--model DIR] [--out reports/continuum]

Continuum (Li et al., arXiv 2511.02230, later CacheTTL) ran 500 SWE-bench Verified jobs with 64
agents at a time on Llama-3.1-70B-Instruct (4 x H100), under vLLM and under Continuum, and
published every job's duration (../shared/traces/continuum/, read from there). The same
question here, on the SWE-bench agent runs of mini-swe-agent (../shared/traces/mini-swe-agent/,
real tool times and token counts):

- `sim`: the engine model with vLLM's semantics and the preset `vllm-llama3.1-70b-h100x4`
  (composed from published H100 kernel measurements by benchmarks/derive_presets.py; its swap,
  pool and append fields declared), `--jobs` jobs with `--agents` at a time, every policy,
  `--replicates` times with the jobs in a different seeded order (the makespan's spread), each
  run cut to its first calls so that a job makes `--turns-mean` calls on average (the paper's
  10.9; `cut_turns`: in proportion to each run's own length), with no client timeout (the
  paper's agents wait for their calls; with the harness client's 600 s most calls that wait
  for memory behind pinned contexts would fail instead);
- `live`: `harness run` against a local CPU vLLM with the project's connector and a KV
  pool of `--pool-tokens` (smaller than the agents' contexts), `--live-jobs` jobs token-scaled
  by `--token-scale`, `--live-agents` at a time, each policy stopped past `--live-bound-s`
  (a stalled server: its finished jobs are reported, its times and ratios are not). `--model`
  serves a model folder instead of the tiny random-weight one: SmolLM2-135M-Instruct's real
  weights (`make vllm MODEL=smollm2` makes the folder), with which a context costs seconds to
  prefill again, as reloads do at scale.

The policies: keep-evictable (vLLM's default, the paper's baseline), continuum (the paper's TTL
rule), ttl with a fixed 2 s then keep-evictable (the released code's rule), keep (pinned) and
recompute. Writes `continuum.md` (the tables for docs/results.md) and `continuum.json` under
`--out`: per policy the job completion time (mean, P50, P95, P99) and makespan, the speedup of
each policy over keep-evictable with bootstrap intervals over jobs (the makespan's: median and
range over the replicates), the mechanisms (measured reuse, tokens evicted, preemptions,
recomputed tokens), and the paper's own figures and ratios from its per-job durations. Exits 2
when the shared traces are missing, 3 when the live server could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.metrics.jobs import job_table, makespan_s, not_completed, speedups
from harness.metrics.summary import load_frames, summarize_frames
from harness.model.calibration import resolve_calibration
from harness.plan.planner import Arrivals
from harness.records.store import read_json
from harness.simulate.options import SimOptions
from harness.simulate.run import run_simulation
from harness.simulate.server import Capacity
from harness.traces.importers import import_trace
from harness.traces.schema import Provenance, write_trajectories
from harness.traces.tile import tile_steps

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
PRESET = "vllm-llama3.1-70b-h100x4"
BASELINE = "keep-evictable"
# name -> (policy, --policy-arg values)
POLICIES: dict[str, tuple[str, dict[str, str]]] = {
    "keep-evictable": ("keep-evictable", {}),
    "continuum": ("continuum", {}),
    # its TTL without its scheduler (simulated only: a bench runs each policy name once)
    "continuum-ttl-only": ("continuum", {"program_order": "0"}),
    "ttl": ("ttl", {"tau": "2", "after": "keep-evictable"}),
    "keep": ("keep", {}),
    "recompute": ("recompute", {}),
}
VLLM_BLOCK = 32  # the CPU engine's block size


def paper_figures(folder: Path) -> dict[str, Any]:
    """The paper's per-job durations (s) and its summary figures, per system."""
    out: dict[str, Any] = {}
    for system in ("vllm", "continuum"):
        doc = json.loads((folder / f"swebench_llama70B_{system}_results.json").read_text())
        durations = np.array([float(v) for v in doc["job_durations"].values()])
        out[system] = {"jobs": durations, "makespan_s": float(doc["total_duration"]),
                       "published": {k: doc[k] for k in ("num_jobs", "average_duration",
                                                         "median_duration", "percentile_95",
                                                         "percentile_99", "total_duration")}}
    return out


PAPER_TURNS = 10.9  # the paper's traces' mean LLM calls a job


def cut_turns(source: pd.DataFrame, mean_turns: float) -> tuple[pd.DataFrame, float]:
    """Each run cut to its first k LLM calls (and the tool steps between them), k in
    proportion to its own length so that the runs' mean is `mean_turns`: k = max(1,
    round(calls x mean_turns / mean calls)). The runs keep their real tool times and token
    counts, and their spread of lengths; nothing is invented. Returns the cut steps and the
    mean calls a job they have."""
    llm = source["kind"] == "llm"
    calls = llm.groupby(source["trajectory_id"]).sum()
    keep_calls = (calls * (mean_turns / calls.mean())).round().clip(lower=1).astype(int)
    seen = llm.astype(int).groupby(source["trajectory_id"]).cumsum()
    limit = source["trajectory_id"].map(keep_calls)
    # up to and with the k-th call; a tool after it would end the job on a tool
    kept = (seen < limit) | ((seen == limit) & llm)
    return source[kept].reset_index(drop=True), float(keep_calls.mean())


def jobs_trace(source: pd.DataFrame, n: int, seed: int, path: Path) -> Path:
    """The first `n` jobs of the source's trajectories in a seeded order, repeated as needed
    (each copy sends new content), written to `path`."""
    ids = list(dict.fromkeys(source["trajectory_id"].astype(str)))
    order = np.random.default_rng(seed).permutation(len(ids))
    copies = -(-n // len(ids))
    tiled = tile_steps(source, copies)
    want = []
    for k in range(copies):
        for i in order:
            want.append(ids[i] if k == 0 else f"{ids[i]}~{k}")
    want = want[:n]
    rank = {t: r for r, t in enumerate(want)}
    picked = tiled[tiled["trajectory_id"].isin(rank)].copy()
    picked["_rank"] = picked["trajectory_id"].map(rank)
    picked = picked.sort_values(["_rank", "step"], kind="stable").drop(columns="_rank")
    write_trajectories(picked.reset_index(drop=True), path,
                       Provenance("mini-swe-agent", [str(SHARED / "mini-swe-agent")],
                                  notes=[f"{n} jobs in seeded order {seed}"]))
    return path


def run_facts(d: Path) -> dict[str, Any]:
    """One run's job times and mechanisms."""
    frames, run, server = load_frames(d)
    jobs = job_table(frames)
    # a run stopped past its bound wrote no summary: computed from the frames read here
    s = (read_json(d / "summary.json") if (d / "summary.json").exists()
         else summarize_frames(frames, run, server, {}))
    sim = run.simulator or {}
    actions = frames.pauses["action"].astype(object)
    return {"jct": jobs["jct_s"].dropna().to_numpy(),
            # pauses held for a time-to-live (continuum's tau* > 0), of all its pauses
            "ttl_pauses": [int((actions == "ttl").sum()), int(actions.notna().sum())],
            "hint_outcomes": (s.get("hint_outcomes") or {}).get("shares"),
            "makespan_s": makespan_s(jobs), "reuse": (s.get("reuse") or {}).get("hit_rate"),
            "evicted_tokens": sim.get("evicted_tokens"), "preemptions": sim.get("preemptions"),
            "recomputed": s.get("tokens_recomputed"), "not_completed": not_completed(jobs),
            "server_queue_ms": ((s.get("server_times_ms") or {}).get("queue") or {}).get(
                "mean_ms")}


def simulate_part(source: pd.DataFrame, out: Path, jobs: int, agents: int,
                  replicates: int, turns_mean: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """Every policy on the engine model with the 70B preset, `replicates` seeded orders of
    `jobs` jobs; `turns_mean` > 0: the runs cut to that many calls a job (cut_turns)."""
    if turns_mean > 0:
        source, got = cut_turns(source, turns_mean)
        print(f"runs cut to {got:.2f} calls a job on average", flush=True)
    cal = resolve_calibration(PRESET)
    assert cal.kv_capacity_tokens is not None and cal.block_size is not None
    cap = Capacity(tokens=cal.kv_capacity_tokens, engine="vllm", block_size=cal.block_size)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    for r in range(replicates):
        trace = jobs_trace(source, jobs, r, out / f"jobs-{r}.parquet")
        for name, (policy, args) in POLICIES.items():
            d = out / f"{name}-{r}"
            t0 = time.perf_counter()
            # no client timeout: the paper's agents wait for their calls as long as it takes
            run_simulation(SimOptions(trace, policy, args, cap, None, Arrivals("closed", agents),
                                      r, d, first_token_timeout_s=math.inf), cal)
            facts = run_facts(d)
            results[name].append(facts)
            print(f"sim replicate {r} {name}: JCT mean {np.mean(facts['jct']):,.0f} s, "
                  f"makespan {facts['makespan_s'] or 0:,.0f} s "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return results


def live_part(source: pd.DataFrame, out: Path, jobs: int, agents: int, pool: int,
              token_scale: float, bound_s: float, model: Path | None = None,
              only: set[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each policy replayed by `harness run` on a local server of its own (serving `model`,
    else the tiny one), stopped (SIGINT: what it measured is kept, the server stopped) if it
    runs past `bound_s`: a policy that stalls the server is reported with the jobs it
    finished, not waited for."""
    env = dict(os.environ)
    if model is not None:
        env["HARNESS_VLLM_MODEL"] = str(model)
    trace = jobs_trace(source, jobs, 0, out / "jobs.parquet")
    live = {k: v for k, v in POLICIES.items() if k == v[0] and (only is None or k in only)}
    for name, (policy, args) in live.items():
        cmd = [sys.executable, "-m", "harness", "run", "--runtime", "vllm", "--trace",
               str(trace), "--policy", policy, "--concurrency", str(agents),
               "--token-scale", str(token_scale), "--ctx-per-slot", str(pool),
               f"--server-arg=--num-gpu-blocks-override={pool // VLLM_BLOCK + 1}",
               "--out", str(out / "bench" / name)]
        cmd += [a for k, v in args.items() for a in ("--policy-arg", f"{k}={v}")]
        print(" ".join(cmd[1:]), flush=True)
        run = subprocess.Popen(cmd, cwd=ROOT, env=env)
        try:
            rc = run.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            print(f"{name}: past {bound_s:g} s, stopped", flush=True)
            run.send_signal(signal.SIGINT)
            rc = run.wait()
        except KeyboardInterrupt:
            # SIGINT lets the run stop its server; a kill (subprocess.run's) would not
            run.send_signal(signal.SIGINT)
            run.wait()
            raise
        if rc not in (0, 4, 130):  # 4: trajectories lost to the server; 130: stopped here
            raise SystemExit(rc)
    return {name: [run_facts(out / "bench" / name)] for name in live
            if (out / "bench" / name / "run.json").exists()}


def stored(root: Path, patterns: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs a previous invocation left under `root`: per policy, one per pattern
    (`{}` stands for the policy's name), where every one of them has a summary."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in POLICIES:
        dirs = [root / p.format(name) for p in patterns]
        if all((d / "run.json").exists() for d in dirs):
            out[name] = [run_facts(d) for d in dirs]
    return out if BASELINE in out else {}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ci(c: list[float] | None) -> str:
    return f" ({c[0]:.2f}-{c[1]:.2f})" if c else ""


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def ratios(base: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """BASE over NEW, pooled over replicates for the job times; the makespan per replicate."""
    out: dict[str, Any] = speedups(np.concatenate([b["jct"] for b in base]),
                                   np.concatenate([n["jct"] for n in new]))
    per = [b["makespan_s"] / n["makespan_s"] for b, n in zip(base, new, strict=True)
           if b["makespan_s"] and n["makespan_s"]]
    out["makespan"] = {"ratio": float(np.median(per)) if per else None,
                       "range": [min(per), max(per)] if len(per) > 1 else None}
    return out


def table(results: dict[str, list[dict[str, Any]]], plain: dict[str, Any], title: str) -> str:
    """The markdown table of `results`, with the figures `_plain` computed of them."""
    lines = [f"**{title}**", "",
             "| policy | JCT mean / P50 / P95 / P99 s | makespan s | speedup over "
             f"{BASELINE}: mean, P50, P95 (95% CI) | makespan | reuse | tokens evicted | "
             "preemptions | recomputed | server queue mean ms | not completed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        fig = plain[name]
        q = [fig["jct_s"][k] for k in ("mean", "p50", "p95", "p99")]
        ms = [m for m in fig["makespan_s"] if m]
        # no ratio where the baseline did not run (--live-policies without it)
        rt = fig["speedup_over_baseline"] or {
            k: {"ratio": None, "ci95": None} for k in ("mean", "p50", "p95")}
        mk = rt.get("makespan") or {"ratio": None, "range": None}
        mk_text = _x(mk["ratio"]) + (f" ({mk['range'][0]:.2f}-{mk['range'][1]:.2f})"
                                     if mk["range"] else "")
        reuse = [r["reuse"] for r in runs if r["reuse"] is not None]
        ev = [r["evicted_tokens"] for r in runs if r["evicted_tokens"] is not None]
        pre = [r["preemptions"] for r in runs if r["preemptions"] is not None]
        rec = [r["recomputed"] for r in runs if r["recomputed"] is not None]
        left: dict[str, int] = {}
        for r in runs:
            for k, v in (r["not_completed"] or {}).items():
                left[k] = left.get(k, 0) + v
        qu = [r["server_queue_ms"] for r in runs if r["server_queue_ms"] is not None]
        if any(k in left for k in ("interrupted", "incomplete")):
            # stopped before its batch finished: the jobs that did finish are the short ones,
            # so neither their times nor a ratio would be comparable
            q, ms, mk_text = [None] * 4, [], "-"
            rt = {k: {"ratio": None, "ci95": None} for k in ("mean", "p50", "p95")}
        cells = [name, " / ".join(_s(v) for v in q),
                 _s(float(np.median(ms)) if ms else None),
                 ", ".join(_x(rt[k]["ratio"]) + _ci(rt[k]["ci95"]) for k in ("mean", "p50", "p95")),
                 mk_text, f"{100 * np.mean(reuse):.1f}%" if reuse else "-",
                 _s(float(np.mean(ev)) if ev else None), _s(float(np.mean(pre)) if pre else None),
                 _s(float(np.mean(rec)) if rec else None),
                 f"{np.mean(qu):.1f}" if qu else "-",
                 (f"{fig['jobs_completed']} completed in the run's bound; "
                  if not ms and left else "")
                 + (", ".join(f"{v} {k}" for k, v in left.items()) or "0")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_table(paper: dict[str, Any]) -> str:
    v, c = paper["vllm"], paper["continuum"]
    sp = speedups(v["jobs"], c["jobs"])
    rows = ["**The paper** (500 jobs, 64 agents, Llama-3.1-70B-Instruct on 4 x H100; "
            "its per-job durations)", "",
            "| figure | vLLM s | Continuum s | speedup (95% CI over jobs) |", "|---|---|---|---|"]
    for key, label in (("mean", "JCT mean"), ("p50", "JCT P50"), ("p95", "JCT P95"),
                       ("p99", "JCT P99")):
        fv = float(np.mean(v["jobs"])) if key == "mean" else float(np.percentile(
            v["jobs"], int(key[1:])))
        fc = float(np.mean(c["jobs"])) if key == "mean" else float(np.percentile(
            c["jobs"], int(key[1:])))
        rows.append(f"| {label} | {fv:,.1f} | {fc:,.1f} | {_x(sp[key]['ratio'])}"
                    f"{_ci(sp[key]['ci95'])} |")
    rows.append(f"| makespan | {v['makespan_s']:,.1f} | {c['makespan_s']:,.1f} | "
                f"{v['makespan_s'] / c['makespan_s']:.2f}x |")
    return "\n".join(rows)


def paper_beside(paper: dict[str, Any], sim: dict[str, Any]) -> str:
    """The simulated absolute mean JCTs beside the paper's, for vLLM's default
    (keep-evictable) and Continuum, with each side's speedup."""
    v, c = (float(np.mean(paper[k]["jobs"])) for k in ("vllm", "continuum"))
    sv, sc = (sim.get(k, {}).get("jct_s", {}).get("mean") for k in (BASELINE, "continuum"))
    rows = ["| JCT mean | paper s | simulated s | simulated / paper |", "|---|---|---|---|"]
    for label, p, s_ in (("vLLM's default (keep-evictable)", v, sv), ("Continuum", c, sc)):
        rows.append(f"| {label} | {p:,.1f} | {_s(s_)} | {_x(s_ / p if s_ else None)} |")
    rows.append(f"| speedup | {v / c:.2f}x | {_x(sv / sc if sv and sc else None)} | |")
    return "\n".join(rows)


def _plain(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = results.get(BASELINE)
    out: dict[str, Any] = {}
    for name, runs in results.items():
        jct = np.concatenate([r["jct"] for r in runs])
        out[name] = {"jobs_completed": int(jct.size),
                     "jct_s": {"mean": float(jct.mean()) if jct.size else None,
                               **{f"p{q}": float(np.percentile(jct, q)) if jct.size else None
                                  for q in (50, 95, 99)}},
                     "makespan_s": [r["makespan_s"] for r in runs],
                     "speedup_over_baseline": ratios(base, runs) if base else None,
                     "reuse": [r["reuse"] for r in runs],
                     "evicted_tokens": [r["evicted_tokens"] for r in runs],
                     "preemptions": [r["preemptions"] for r in runs],
                     "tokens_recomputed": [r["recomputed"] for r in runs],
                     "not_completed": [r["not_completed"] for r in runs],
                     "ttl_pauses": [r.get("ttl_pauses") for r in runs],
                     "hint_outcomes": [r.get("hint_outcomes") for r in runs]}
    return out


def ttl_lines(results: dict[str, list[dict[str, Any]]]) -> str:
    """How often each policy held a pause for a time-to-live (continuum: tau* > 0), and what
    became of its hints on the server."""
    out = []
    for name, runs in results.items():
        held = [r["ttl_pauses"] for r in runs if r.get("ttl_pauses")]
        k, n = sum(h[0] for h in held), sum(h[1] for h in held)
        shares = [r["hint_outcomes"] for r in runs if r.get("hint_outcomes")]
        hint = (", hints: " + ", ".join(f"{o} {100 * float(np.mean([x[o] for x in shares])):.0f}%"
                                        for o in shares[0])) if shares else ""
        if n:
            out.append(f"- {name}: a time-to-live at {k:,} of {n:,} pauses "
                       f"({100 * k / n:.0f}%){hint}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="sim,live",
                    help="sim, live or both (comma-separated), or tables; a part not run is "
                         "reported from what --out holds of it")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--turns-mean", type=float, default=PAPER_TURNS,
                    help="sim: cut each run to its first calls, in proportion to its length, so "
                         "that a job makes this many calls on average, as the paper's (0: the "
                         "runs whole, 80 calls a job)")
    ap.add_argument("--live-jobs", type=int, default=32)
    ap.add_argument("--live-agents", type=int, default=8)
    ap.add_argument("--pool-tokens", type=int, default=2560)
    ap.add_argument("--live-bound-s", type=float, default=420.0,
                    help="stop a live policy's run past this (its server stalled)")
    ap.add_argument("--token-scale", type=float, default=0.02)
    ap.add_argument("--live-policies", default=None,
                    help="live: these policies only (comma-separated; default: every one but "
                         "continuum-ttl-only)")
    ap.add_argument("--model", type=Path, default=None,
                    help="live: the model folder the server serves (default: the tiny "
                         "random-weight model)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "continuum")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.part.split(",") if p.strip()}
    if not parts or parts - {"sim", "live", "tables"}:
        print(f"error: --part {args.part!r}: sim, live, both, or tables (run nothing, "
              "report what --out holds)", file=sys.stderr)
        return 2
    for need in (SHARED / "continuum", SHARED / "mini-swe-agent"):
        if not need.is_dir():
            print(f"error: {need} is missing: the shared traces this reproduction reads",
                  file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    paper = paper_figures(SHARED / "continuum")
    source = import_trace("mini-swe-agent", SHARED / "mini-swe-agent", {}).steps
    doc: dict[str, Any] = {"paper": {k: v["published"] for k, v in paper.items()},
                           "settings": {k: str(v) for k, v in vars(args).items()}}
    md = [paper_table(paper)]
    if "sim" in parts:
        res = simulate_part(source, args.out / "sim", args.jobs, args.agents, args.replicates,
                            args.turns_mean)
    else:  # a part not run this time is reported from what OUT holds of it
        res = stored(args.out / "sim", [f"{{}}-{r}" for r in range(args.replicates)])
    if res:
        doc["simulated"] = _plain(res)
        md.append(table(res, doc["simulated"],
                        f"Simulated: {args.jobs} jobs, {args.agents} agents, engine model "
                        f"(vLLM) with the preset {PRESET} (composed from published H100 "
                        f"kernel measurements), {args.replicates} orders"
                        + (f", runs cut to {args.turns_mean:g} calls a job on average"
                           if args.turns_mean > 0 else ", runs whole")))
        md.append(paper_beside(paper, doc["simulated"]))
    res = (live_part(source, args.out / "live", args.live_jobs, args.live_agents,
                     args.pool_tokens, args.token_scale, args.live_bound_s, args.model,
                     {p.strip() for p in args.live_policies.split(",")}
                     if args.live_policies else None)
           if "live" in parts
           else stored(args.out / "live" / "bench", ["{}"]))
    if res:
        doc["live"] = _plain(res)
        md.append(table(res, doc["live"],
                        f"Live: CPU vLLM ({args.model.name if args.model else 'tiny model'}), "
                        f"{args.live_jobs} jobs token-scaled by "
                        f"{args.token_scale:g}, {args.live_agents} agents, "
                        f"{args.pool_tokens:,}-token pool"))
        md.append(ttl_lines(res))
    (args.out / "continuum.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    (args.out / "continuum.md").write_text("\n\n".join(md) + "\n")
    print("\n\n".join(md))
    print(f"\nwritten: {args.out / 'continuum.md'}, {args.out / 'continuum.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
