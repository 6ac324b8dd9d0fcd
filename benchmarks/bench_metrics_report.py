"""Time summarize() and the HTML report on ~1,000,000 synthetic records (built vectorised), and
check the summary's peak memory.

    .venv/bin/python benchmarks/bench_metrics_report.py [--records 1000000] [--out DIR]

Each synthetic trajectory alternates LLM calls and tool pauses (keep / swap / recompute, chosen
per pause), with lognormal tool waits; a tenth of the calls are bystander requests. The records
are written as a replay writes them (parts of 2,000 rows), and `summarize_dir` runs on them in a
process of its own, so its peak RSS is the summary's: the target is < 400 MB over the
interpreter with its imports and < 1 GB for the whole process (a 10,000-agent run makes about
1M records). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.records.schema import RECORDS_SCHEMA
from harness.records.store import RECORDS_DIR, RUN_JSON, write_json

TOOLS = 10  # tool pauses per trajectory
PART_ROWS = 2000  # rows per records part, as the replay flushes them
RSS_ADDED_TARGET_MB = 400.0  # summarize_dir's peak RSS over the interpreter with its imports
RSS_PEAK_TARGET_MB = 1000.0  # the whole process's peak RSS
KV_BPT = 36864
CLASSES = np.array(["local_read", "remote_read", "sandbox", "browser", "human"], dtype=object)
ACTIONS = np.array(["keep", "swap", "recompute"], dtype=object)


def _template() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event, role, step) of each row of one trajectory, in order."""
    rows: list[tuple[str, str, int]] = [("trajectory_start", "start", 0)]
    for j in range(TOOLS + 1):
        call = 2 * j
        rows += [("call_start", "call", call), ("kv_state", "active", call),
                 ("first_token", "ttft", call), ("call_end", "decode", call)]
        if j < TOOLS:
            tool = call + 1
            rows += [("pause_decision", "decision", tool), ("tool_start", "tool", tool),
                     ("kv_state", "paused", tool), ("tool_end", "wait", tool),
                     ("restore", "restore", tool)]
    rows += [("kv_state", "released", 2 * TOOLS), ("trajectory_end", "end", 2 * TOOLS)]
    return (np.array([r[0] for r in rows], dtype=object), np.array([r[1] for r in rows],
            dtype=object), np.array([r[2] for r in rows], dtype=np.int64))


def _agents(n_traj: int, rng: np.random.Generator) -> pd.DataFrame:
    events, roles, steps = _template()
    width = events.size
    shape = (n_traj, width)

    def cols(role: str) -> np.ndarray:
        return np.asarray(roles == role)

    dt = np.zeros(shape)
    dt[:, 0] = rng.uniform(0, 600, n_traj)
    dt[:, cols("ttft")] = rng.lognormal(np.log(0.08), 0.4, (n_traj, int(cols("ttft").sum())))
    dt[:, cols("decode")] = rng.lognormal(np.log(0.5), 0.3, (n_traj, int(cols("decode").sum())))
    dt[:, cols("wait")] = rng.lognormal(np.log(1.0), 1.2, (n_traj, TOOLS))
    dt[:, cols("restore")] = rng.uniform(0.0, 0.03, (n_traj, TOOLS))
    t_ns = (np.cumsum(dt, axis=1) * 1e9).astype(np.int64)
    action = rng.choice(ACTIONS, (n_traj, TOOLS))
    event = np.broadcast_to(events, shape).copy()
    # the restore row: swap_in after a swap, recompute after a recompute, slot_wait after keep
    event[:, cols("restore")] = np.where(action == "swap", "swap_in",
                                         np.where(action == "recompute", "recompute",
                                                  "slot_wait"))
    tokens = (1000 + 100 * steps).astype("float64")
    tok = np.broadcast_to(tokens, shape)
    status = np.full(shape, None, dtype=object)
    for role in ("active", "paused", "released"):
        status[:, cols(role)] = role
    status[:, cols("decode") | cols("wait")] = "ok"
    status[:, cols("end")] = "completed"
    paused = cols("paused")
    kv = np.full(shape, np.nan)
    kv[:, cols("active")] = tok[:, cols("active")]
    kv[:, paused] = np.where(action == "keep", tok[:, paused], 0.0)
    kv[:, cols("released")] = 0.0
    tool_class = np.full(shape, None, dtype=object)
    for role in ("decision", "tool", "wait"):
        tool_class[:, cols(role)] = rng.choice(CLASSES, (n_traj, TOOLS))
    act = np.full(shape, None, dtype=object)
    act[:, cols("decision")] = action
    restore = event == "swap_in"
    recompute = event == "recompute"

    def at(role: str, values: np.ndarray | float) -> np.ndarray:
        out = np.full(shape, np.nan)
        out[:, cols(role)] = values if np.isscalar(values) else np.asarray(values)[cols(role)]
        return out

    planned = np.full(shape, np.nan)
    planned[:, cols("tool")] = dt[:, cols("wait")]
    resume = np.full(shape, None, dtype=object)
    resume[:, cols("call")] = steps[cols("call")] > 0
    ids = np.array([f"traj-{i}" for i in range(n_traj)], dtype=object)
    return pd.DataFrame({
        "t_ns": t_ns.ravel(), "event": event.ravel(), "trajectory_id": np.repeat(ids, width),
        "traffic": "agent", "step": np.broadcast_to(steps, shape).ravel().astype("float64"),
        "tool_class": tool_class.ravel(), "action": act.ravel(), "status": status.ravel(),
        "is_resume": resume.ravel(), "prompt_tokens": at("call", tokens).ravel(),
        "appended_tokens": at("call", 100.0).ravel(), "output_tokens": at("decode", 64.0).ravel(),
        "cached_tokens": at("decode", tokens - 100).ravel(),
        "prompt_n": at("decode", 100.0).ravel(),
        "server_ms": np.where(restore, 15.0, at("decode", 20.0)).ravel(),
        "decode_ms": at("decode", 400.0).ravel(),
        "retained_tokens": at("decision", tokens).ravel(),
        "recomputed_tokens": np.where(recompute, tok, np.nan).ravel(),
        "bytes": np.where(restore, tok * KV_BPT, np.nan).ravel(),
        "kv_tokens": kv.ravel(),
        "planned_latency_s": planned.ravel(),
    })


def _bystanders(n: int, rng: np.random.Generator) -> pd.DataFrame:
    t0 = rng.uniform(0, 600, n)
    ttft = rng.lognormal(np.log(0.05), 0.3, n)
    times = np.stack([t0, t0 + ttft, t0 + ttft + 0.3], axis=1).ravel()
    return pd.DataFrame({
        "t_ns": (times * 1e9).astype(np.int64),
        "event": np.tile(np.array(["call_start", "first_token", "call_end"], dtype=object), n),
        "trajectory_id": np.repeat(np.array([f"bystander-{i}" for i in range(n)], dtype=object),
                                   3),
        "traffic": "bystander", "step": 0.0,
        "status": np.tile(np.array([None, None, "ok"], dtype=object), n),
        "is_resume": np.tile(np.array([False, None, None], dtype=object), n),
        "output_tokens": np.tile(np.array([np.nan, np.nan, 32.0]), n),
    })


def synthetic_records(n_records: int = 1_000_000, seed: int = 0) -> pd.DataFrame:
    """About n_records rows of one run's events: agent trajectories plus ~3% bystander rows."""
    rng = np.random.default_rng(seed)
    width = _template()[0].size
    n_traj = max(1, int(n_records * 0.97) // width)
    agents = _agents(n_traj, rng)
    df = pd.concat([agents, _bystanders(max(0, (n_records - len(agents)) // 3), rng)],
                   ignore_index=True)
    df = df.sort_values("t_ns", kind="stable").reset_index(drop=True)
    df["seq"] = np.arange(len(df), dtype=np.int64)
    df["run_id"] = "bench"
    return conform(pa.Table.from_pandas(df, preserve_index=False)).to_pandas()


def conform(table: pa.Table) -> pa.Table:
    """Cast to the records schema, adding missing columns as nulls."""
    cols = []
    for field in RECORDS_SCHEMA:
        if field.name in table.column_names:
            cols.append(table[field.name].cast(field.type))
        else:
            cols.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(cols, schema=RECORDS_SCHEMA)


def bench_run() -> dict[str, Any]:
    return {"run_id": "bench", "runtime": "synthetic", "policy": "mixed",
            "model": {"name": "bench", "kv_bytes_per_token": KV_BPT}, "seed": 0}


def write_results(df: pd.DataFrame, out: Path, part_rows: int = PART_ROWS) -> None:
    """The records as a results directory: numbered parts of `part_rows` rows, and run.json."""
    (out / RECORDS_DIR).mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df, schema=RECORDS_SCHEMA, preserve_index=False)
    for i, start in enumerate(range(0, table.num_rows, part_rows)):
        pq.write_table(table.slice(start, part_rows), out / RECORDS_DIR / f"part-{i:05d}.parquet",
                       compression="zstd")
    write_json(out / RUN_JSON, bench_run())


def _peak_mb() -> float:
    """This process's peak RSS (MB). VmHWM, where there is one: ru_maxrss keeps the peak of the
    process before exec, here the parent's (which built the records)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux


def summary_rss_child(results_dir: Path) -> None:
    """In a fresh process: summarize_dir's time and peak RSS, as JSON on stdout."""
    from harness.metrics.summary import summarize_dir

    base = _peak_mb()
    t0 = time.perf_counter()
    summarize_dir(results_dir)
    print(json.dumps({"s": time.perf_counter() - t0, "base_mb": base, "peak_mb": _peak_mb()}))


def check_summary_rss(results_dir: Path) -> bool:
    """Run summarize_dir in a process of its own; print its peak RSS against the targets."""
    done = subprocess.run([sys.executable, __file__, "--summary-rss", str(results_dir)],
                          capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    added = got["peak_mb"] - got["base_mb"]
    ok_added, ok_peak = added < RSS_ADDED_TARGET_MB, got["peak_mb"] < RSS_PEAK_TARGET_MB
    print(f"summary peak RSS (summarize_dir, own process, {got['s']:.2f} s): "
          f"{added:,.0f} MB over the interpreter and imports ({got['base_mb']:,.0f} MB), "
          f"target < {RSS_ADDED_TARGET_MB:,.0f} MB: {'OK' if ok_added else 'MISSED'}; "
          f"process {got['peak_mb']:,.0f} MB, target < {RSS_PEAK_TARGET_MB:,.0f} MB: "
          f"{'OK' if ok_peak else 'MISSED'}")
    return ok_added and ok_peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--summary-rss", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summary_rss is not None:
        summary_rss_child(args.summary_rss)
        return 0
    from harness.metrics.summary import summarize
    from harness.records.manifest import RunManifest

    t0 = time.perf_counter()
    df = synthetic_records(args.records)
    t1 = time.perf_counter()
    print(f"built {len(df):,} records in {t1 - t0:.2f} s")
    summary = summarize(df, RunManifest.from_dict(bench_run()), None)
    t2 = time.perf_counter()
    res = summary["resume_latency_ms"]
    print(f"summarize: {t2 - t1:.2f} s  (trajectories {summary['trajectories']['total']:,}, "
          f"resumes {res['n']:,}, resume p95 {res['p95']:.1f} ms, "
          f"{summary['memory_time_mib_s']:.4g} MiB·s, {summary['bytes_moved']:,} bytes moved, "
          f"{summary['tokens_recomputed']:,} tokens recomputed)")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-report-"))
    write_results(df, out)
    del df
    ok = check_summary_rss(out)
    try:
        from harness.report.render import render_report
    except ImportError:
        print("report: not available")
        return 0 if ok else 1
    t3 = time.perf_counter()
    html = render_report([out])
    t4 = time.perf_counter()
    (out / "report.html").write_text(html, encoding="utf-8")
    print(f"report (read + summarize + plots + HTML): {t4 - t3:.2f} s, {len(html):,} bytes")
    print(f"total summarize + report: {(t2 - t1) + (t4 - t3):.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
