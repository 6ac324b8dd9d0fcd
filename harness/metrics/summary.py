"""summary.json: the headline metrics of one run, a pure function of its records.

`summarize(records, run, server_metrics)` is what the replay writes at the end of a run (a
typed `Summary`, harness.metrics.summary_types, which also reads and writes the file);
`summarize_dir(results_dir)` computes the same from a results directory, reading the records
part by part (a fraction of the memory of the whole records table; summary.json is the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.errors import InputError
from harness.metrics import hint_outcomes, jobs, latency, occupancy, outcomes, retention
from harness.metrics.bootstrap import mean_ci
from harness.metrics.events import read_events
from harness.metrics.frames import Frames, build_frames, link_events
from harness.metrics.health import CLIENT_LAG_WARN_MS, lag_cause, run_health
from harness.metrics.reuse import measured_reuse
from harness.metrics.routing import router_report, routing
from harness.metrics.server_times import server_times
from harness.metrics.summary_types import (
    SUMMARY_KEYS,
    SUMMARY_VERSION,
    HealthCheck,
    HintOutcomes,
    OutcomeIntervals,
    Quantiles,
    Rate,
    Summary,
    Trajectories,
)
from harness.policies.builtin import wants_program_order
from harness.records.manifest import RunManifest, read_manifest
from harness.records.store import read_records, read_server_metrics
from harness.traces.buckets import PAUSE_BUCKETS

__all__ = ["SUMMARY_KEYS", "Judging", "Summary", "load_dir", "load_frames", "summarize",
           "summarize_dir", "summarize_frames"]

def summarize(
    records: pd.DataFrame,
    run: RunManifest,
    server_metrics: pd.DataFrame | None,
    slo: dict[str, float] | None = None,
    *,
    mismatch_abs_tokens: int = outcomes.MISMATCH_ABS_TOKENS,
    mismatch_rel: float = outcomes.MISMATCH_REL,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Summary:
    """The headline metrics of one run (keys listed in the module's SUMMARY_KEYS).

    Pure: reads nothing, writes nothing. `run` is run.json (any field may be unknown);
    `slo` maps SLO_KEYS to bounds. Cache mismatches are judged with a tolerance of
    max(mismatch_abs_tokens, mismatch_rel x retained tokens, run.cache_block_tokens):
    a runtime that reuses whole blocks leaves up to a block of a kept context uncached.
    """
    bounds = outcomes.check_slo(slo)
    frames = build_frames(records)
    return summarize_frames(frames, run, server_metrics, bounds,
                            Judging(mismatch_abs_tokens, mismatch_rel, n_resamples, seed))


@dataclass(frozen=True)
class Judging:
    """How a summary judges and bootstraps: the cache-mismatch tolerance (`summarize`) and the
    bootstrap's resamples and seed."""

    mismatch_abs_tokens: int = outcomes.MISMATCH_ABS_TOKENS
    mismatch_rel: float = outcomes.MISMATCH_REL
    n_resamples: int = 1000
    seed: int = 0


def summarize_frames(
    frames: Frames,
    run: RunManifest,
    server_metrics: pd.DataFrame | None,
    slo: dict[str, float],
    judging: Judging = Judging(),
    damage: Sequence[str] = (),
) -> Summary:
    """`summarize` on already-linked frames (the report reuses them for its plots); `damage`:
    what `load_frames` left out of a damaged results directory, a failed health check."""
    mismatch_abs_tokens, n_resamples, seed = (judging.mismatch_abs_tokens, judging.n_resamples,
                                              judging.seed)
    bpt = run.kv_bytes_per_token
    duration = frames.duration_s
    calls, pauses = frames.calls, frames.pauses
    traj = outcomes.trajectory_outcomes(frames, slo)
    block = run.cache_block_tokens
    if isinstance(block, int | float) and not isinstance(block, bool) and block > 0:
        mismatch_abs_tokens = max(mismatch_abs_tokens, int(block))
    judged = outcomes.judge_resumes(frames, mismatch_abs_tokens, judging.mismatch_rel,
                                    reuses_output=run.cache_reuses_output is not False)
    mism = outcomes.mismatches_of(judged)
    mem = occupancy.memory_time(frames.kv, duration, bpt)
    lat = latency.call_latency(calls)
    lag = latency.pct(pauses["lag_ms"].dropna())
    job_rows = jobs.job_table(frames)
    throughput = latency.throughput(calls, duration)
    health = run_health(frames, run, lag, damage)
    return Summary(
        runtime=run.runtime,
        policy=run.policy,
        trajectories=Trajectories.read(traj, _WHERE),
        resume_latency_ms=_quantiles(latency.resume_latency(calls, n_resamples, seed)),
        resume_parts_ms=latency.resume_parts(calls),
        client_lag_ms=_quantiles(lag),
        ttft_ms=_quantiles(lat["ttft_ms"]),
        tpot_ms=_quantiles(lat["tpot_ms"]),
        itl_ms=_quantiles(lat["itl_ms"]),
        itl_source=lat["itl_source"],
        e2e_ms=_quantiles(lat["e2e_ms"]),
        request_throughput_per_s=throughput["request_throughput_per_s"],
        output_token_throughput_per_s=throughput["output_token_throughput_per_s"],
        tokens_recomputed=int(pauses["recomputed_tokens"].sum()),
        bytes_moved=int(pauses["swap_out_bytes"].sum() + pauses["swap_in_bytes"].sum()),
        cache_mismatches=int(len(mism)),
        cache_mismatch_list=outcomes.mismatch_list(mism),
        hint_honoured=_rate(retention.hint_honoured(judged)),
        effective_retention=_rate(retention.effective_retention(judged)),
        hint_outcomes=_hints(hint_outcomes.hint_outcomes(frames, judged)),
        job_completion_s=_quantiles(jobs.job_completion(job_rows, n_resamples, seed)),
        makespan_s=jobs.makespan_s(job_rows),
        memory_time_token_s=mem["memory_time_token_s"],
        memory_time_mib_s=mem["memory_time_mib_s"],
        kv_paused_peak_tokens=mem["kv_paused_peak_tokens"],
        kv_paused_mean_tokens=mem["kv_paused_mean_tokens"],
        kv_active_peak_tokens=mem["kv_active_peak_tokens"],
        kv_active_mean_tokens=mem["kv_active_mean_tokens"],
        goodput_per_min=outcomes.goodput_per_min(traj["succeeded"], duration),
        outcome_ci95=OutcomeIntervals.read(
            _outcome_ci(outcomes.trajectory_units(frames, slo), duration, bpt, n_resamples,
                        seed), _WHERE),
        bystander_ttft_ms=_quantiles(lat["bystander_ttft_ms"]),
        by_tool_class=_by_tool_class(frames, bpt),
        by_pause_bucket=_by_pause_bucket(frames, bpt),
        reuse=measured_reuse(frames),
        routing=_routing(calls, server_metrics),
        server_occupancy=occupancy.server_occupancy(server_metrics),
        server_times_ms=server_times(server_metrics),
        duration_s=duration,
        pauses=int(len(pauses)),
        pause_actions={str(k): int(v) for k, v in
                       pauses["action"].astype(object).value_counts().sort_index().items()},
        slo=dict(slo),
        kv_bytes_per_token=bpt,
        warnings=_warnings(lag, run),
        health=[HealthCheck.read(c, _WHERE) for c in health],
        run_id=run.run_id,
        summary_version=SUMMARY_VERSION,
    )


_WHERE = "summary"


def _quantiles(stats: dict[str, Any]) -> Quantiles:
    quantiles: Quantiles = Quantiles.read(stats, _WHERE)
    return quantiles


def _rate(stats: dict[str, Any] | None) -> Rate | None:
    rate: Rate | None = None if stats is None else Rate.read(stats, _WHERE)
    return rate


def _hints(stats: dict[str, Any] | None) -> HintOutcomes | None:
    hints: HintOutcomes | None = None if stats is None else HintOutcomes.read(stats, _WHERE)
    return hints


def _routing(calls: pd.DataFrame, server_metrics: pd.DataFrame | None) -> dict[str, Any] | None:
    """Where calls were served, with the router's own account of it where it gives one."""
    out = routing(calls)
    if out is not None:
        out["router"] = router_report(server_metrics)
    return out


def _outcome_ci(units: pd.DataFrame, duration_s: float, bpt: float | None,
                n_resamples: int, seed: int) -> dict[str, list[float] | None]:
    """Bootstrap 95% CIs over trajectories of success rate, goodput and paused memory-time."""
    n = len(units)
    success = mean_ci(units["success"].to_numpy(), n_resamples=n_resamples, seed=seed)
    mem = mean_ci(units["paused_token_s"].to_numpy(), n_resamples=n_resamples, seed=seed)
    per_min = n / (duration_s / 60.0) if duration_s > 0 else None
    mem_sum = [n * v for v in mem] if mem else None
    mib_per_token_s = occupancy.to_mib(1.0, bpt)
    return {
        "success_rate": success,
        "goodput_per_min": [per_min * v for v in success] if success and per_min else None,
        "memory_time_token_s": mem_sum,
        "memory_time_mib_s": ([mib_per_token_s * v for v in mem_sum]
                              if mem_sum and mib_per_token_s is not None else None),
    }


def _warnings(client_lag: dict[str, Any], run: RunManifest) -> list[str]:
    """What a reader must know before trusting the numbers."""
    out = []
    if run.status is not None and run.status != "finished":
        out.append(f"incomplete run (status {run.status}): the figures cover what was measured "
                   "until it stopped, not the whole plan")
    left = run.cleanup.remote_dumps_left if run.cleanup is not None else []
    if left:
        out.append(f"{len(left)} swap dumps were left on the remote server's disk (no server "
                   "API deletes them): their names are in run.json cleanup.remote_dumps_left")
    failed = run.outcome.server_failed if run.outcome is not None else 0
    if failed:
        out.append(f"{failed} trajectories failed because the server failed (errors, "
                   "timeouts): their resumes are missing from the figures")
    caps = run.capabilities
    if isinstance(caps, dict) and wants_program_order(run.policy, run.policy_args) and not \
            caps.get("call_priority"):
        out.append(f"{run.policy}'s program order (calls served by their task's arrival, "
                   "pinned ones first) did not run: this server does not schedule by a call's "
                   "priority (vLLM does with --scheduling-policy priority)")
    p99 = client_lag.get("p99")
    if p99 is not None and p99 > CLIENT_LAG_WARN_MS:
        out.append(f"client lag P99 {p99:.1f} ms > {CLIENT_LAG_WARN_MS:g} ms: the harness woke "
                   f"late to tool ends ({lag_cause(p99)}); resume latency is timed from the "
                   "wake, but the load was offered late by that much")
    return out


def _group_stats(frames: Frames, keys: pd.Series, bpt: float | None) -> dict[str, Any]:
    pauses = frames.pauses
    out: dict[str, Any] = {}
    for key, grp in pauses.groupby(keys, sort=True):
        out[str(key)] = {
            "pauses": int(len(grp)),
            "resume_latency_ms": latency.pct(grp["resume_ms"]),
            "wait_s": latency.pct(grp["wait_s"]),
            "memory_time_token_s": float(grp["paused_token_s"].sum()),
            "memory_time_mib_s": occupancy.to_mib(float(grp["paused_token_s"].sum()), bpt),
        }
    return out


def _by_tool_class(frames: Frames, bpt: float | None) -> dict[str, Any]:
    keys = frames.pauses["tool_class"].astype(object).fillna("unknown")
    return _group_stats(frames, keys, bpt)


def _by_pause_bucket(frames: Frames, bpt: float | None) -> dict[str, Any]:
    keys = latency.bucket_of(frames.pauses["wait_s"])
    stats = _group_stats(frames, keys, bpt)
    empty = {"pauses": 0, "resume_latency_ms": latency.pct(np.zeros(0)),
             "wait_s": latency.pct(np.zeros(0)), "memory_time_token_s": 0.0,
             "memory_time_mib_s": occupancy.to_mib(0.0, bpt)}
    return {label: stats.get(label, empty) for label, _, _ in PAUSE_BUCKETS}


def load_dir(results_dir: Path) -> tuple[pd.DataFrame, RunManifest, pd.DataFrame | None]:
    """Records, run.json (`RunManifest()` when absent) and server metrics (None when none).

    InputError when the directory is missing or holds no records. (`load_frames` reads only
    what the metrics need, in a fraction of the memory.)
    """
    results_dir = _results_dir(results_dir)
    try:
        records = read_records(results_dir)
        server = read_server_metrics(results_dir)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{results_dir}: unreadable records ({exc})") from None
    if records.empty:
        raise InputError(f"{results_dir}: no records (expected records/part-*.parquet)")
    return records, read_manifest(results_dir), (server if len(server) else None)


def load_frames(results_dir: Path | str, damage: list[str] | None = None
                ) -> tuple[Frames, RunManifest, pd.DataFrame | None]:
    """`load_dir`, with the records linked into frames as they are read.

    The records are read part by part, split by event type (`read_events`): the whole records
    table is never in memory, which for a long run is most of the memory a summary needs.
    With `damage` (a list), what cannot be read but leaves the rest readable (a part, a
    run.json field) is left out and said there (`read_events`, `read_manifest`).
    """
    results_dir = _results_dir(results_dir)
    try:
        events = read_events(results_dir, damage)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{results_dir}: unreadable records ({exc})") from None
    try:
        server = read_server_metrics(results_dir)
    except (OSError, ValueError, pa.ArrowException) as exc:
        if damage is None:
            raise InputError(f"{results_dir}: unreadable records ({exc})") from None
        damage.append(f"{results_dir}: unreadable server metrics "
                      f"({str(exc).splitlines()[0][:160]}): left out")
        server = pd.DataFrame()
    if not len(events):
        raise InputError(f"{results_dir}: no records (expected records/part-*.parquet)")
    frames = link_events(events)
    del events  # the frames hold what is needed from here on
    return frames, read_manifest(results_dir, damage), (server if len(server) else None)


def _results_dir(results_dir: Path | str) -> Path:
    path = Path(results_dir)
    if not path.is_dir():
        raise InputError(f"{path}: not a results directory")
    return path


def summarize_dir(
    results_dir: Path | str, slo: dict[str, float] | None = None, *, run: RunManifest | None = None
) -> Summary:
    """summarize() of a results directory's records, run.json (or `run`, the manifest a run
    holds in memory) and server metrics."""
    bounds = outcomes.check_slo(slo)
    frames, on_disk, server = load_frames(results_dir)
    return summarize_frames(frames, on_disk if run is None else run, server, bounds)
