"""One replay run: results directory, run metadata, server scraping, executor, summary.

Everything measured is on disk as it happens (record parts flushed every second); run.json is
written at the start and rewritten at the end, so a killed run leaves readable, labelled results.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.adapters.base import Adapter
from harness.plan.planner import Plan
from harness.policies.base import PausePolicy, ServerRates
from harness.records.schema import RECORDS_SCHEMA, SERVER_METRICS_SCHEMA
from harness.records.store import (
    RECORDS_DIR,
    RUN_JSON,
    SERVER_METRICS_DIR,
    SUMMARY_JSON,
    PartWriter,
    read_records,
    read_server_metrics,
    write_json,
)
from harness.replay.clock import NS, Clock, sleep_s
from harness.replay.executor import Executor, RunCounters
from harness.replay.recorder import Recorder


async def _scrape_loop(adapter: Adapter, clock: Clock, writer: PartWriter, interval_s: float,
                       errors: list[str]) -> None:
    while True:
        t = clock.now_ns()
        try:
            for source, name, labels, value in await adapter.scrape():
                writer.append({"t_ns": t, "source": source, "name": name, "labels": labels,
                               "value": value})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a missed sample is noted, never fatal
            if len(errors) < 20:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
        await sleep_s(clock, interval_s)


def write_summary(out_dir: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """Recompute summary.json from the records on disk (None if metrics are unavailable)."""
    try:
        from harness.metrics.summary import summarize
    except ImportError:
        return None
    summary: dict[str, Any] = summarize(read_records(out_dir), run, read_server_metrics(out_dir))
    write_json(out_dir / SUMMARY_JSON, summary)
    return summary


async def replay(adapter: Adapter, clock: Clock, plan: Plan, policy: PausePolicy, out_dir: Path,
                 run: dict[str, Any], rates: ServerRates, scrape_interval_s: float = 0.2,
                 leftover_dumps: Callable[[], list[str]] | None = None) -> dict[str, Any]:
    """Replay `plan` through `adapter`; returns run.json's final content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if any((out_dir / RECORDS_DIR).glob("part-*.parquet")):
        from harness.errors import InputError

        raise InputError(f"{out_dir} already holds records; choose a new --out directory")
    info = await adapter.server_info()
    run.update({
        "runtime": info.runtime, "server_version": info.server_version,
        "server_model": info.model, "vocab_size": info.vocab_size,
        "slots": info.slots, "ctx_per_slot": info.ctx_per_slot, "status": "running",
        "capabilities": {"harness_slots": adapter.capabilities.harness_slots,
                         "pause_actions": sorted(adapter.capabilities.pause_actions)},
        "wall_anchor_ns": getattr(clock, "wall_anchor_ns", None),
    })
    write_json(out_dir / RUN_JSON, run)
    recorder = Recorder(PartWriter(out_dir / RECORDS_DIR, RECORDS_SCHEMA), run["run_id"], clock)
    metrics_writer = PartWriter(out_dir / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA)
    scrape_errors: list[str] = []
    scraper = asyncio.create_task(
        _scrape_loop(adapter, clock, metrics_writer, scrape_interval_s, scrape_errors))
    executor = Executor(adapter, clock, recorder, policy, plan, run["run_id"], info.vocab_size,
                        info.slots, info.ctx_per_slot, rates)
    counters = RunCounters()
    status = "interrupted"
    try:
        counters = await executor.run()
        status = "finished"
    finally:
        scraper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scraper
        metrics_writer.flush()
        recorder.flush()
        idle: bool | None = None
        with contextlib.suppress(Exception):
            idle = await adapter.slots_idle()
        counters = executor.counters
        run.update({
            "status": status,
            "duration_s": clock.now_ns() / NS,
            "outcome": {"completed": counters.completed, "cancelled": counters.cancelled,
                        "failed": counters.failed, "unsupported_actions": counters.unsupported},
            "final_rates": {"prefill_tok_s": executor.rates.prefill_tok_s,
                            "swap_bytes_per_s": executor.rates.swap_bytes_per_s},
            "cleanup": {"slots_idle": idle,
                        "dump_files_left": leftover_dumps() if leftover_dumps else None,
                        "errors": counters.cleanup_errors},
            "scrape_errors": scrape_errors,
        })
        write_json(out_dir / RUN_JSON, run)
    write_summary(out_dir, run)
    return run


def dumps_for_run(dump_dir: Path | None, run_id: str) -> Callable[[], list[str]] | None:
    """A check for dump files of this run left on the local server's disk."""
    if dump_dir is None:
        return None
    return lambda: sorted(p.name for p in dump_dir.glob(f"{run_id}*"))


