"""One replay run: the server a runtime brings up, the run's HTTP client, run.json, server
scraping, the executor and the summary. The core drives the runtime (harness.adapters.base.
Runtime) here, the same way for every runtime.

Everything measured is on disk as it happens (record parts flushed every second); run.json is
written at the start and rewritten at the end, so a killed run leaves readable, labelled results.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.adapters.base import Adapter, Runtime, RuntimeSession, ServerInfo, ServerOptions
from harness.adapters.http import KEEPALIVE_S, REQUEST_ERRORS, Timeouts, connect
from harness.errors import InputError, ServerError
from harness.metrics.summary import summarize_dir
from harness.metrics.summary_types import Summary, save_summary
from harness.metrics.window import WINDOW_JSON, window_of_dir
from harness.plan.planner import Plan
from harness.plan.shard import WHOLE, Shard, check_shard_slots, shard_slots
from harness.policies import make_policy
from harness.policies.base import PausePolicy, ServerRates
from harness.policies.builtin import FALLBACK_RATES
from harness.records.atomic import reserve_space
from harness.records.manifest import (
    CLEANUP_ERRORS_KEPT,
    RUN_JSON_RESERVE,
    RUN_JSON_RESERVE_BYTES,
    Cleanup,
    RunManifest,
)
from harness.records.parts import PartWriter
from harness.records.schema import RECORDS_SCHEMA, SERVER_METRICS_SCHEMA
from harness.records.store import (
    RECORDS_DIR,
    SERVER_METRICS_DIR,
    write_json,
)
from harness.replay import loop, progress
from harness.replay.clock import NS, Clock, RealClock, sleep_s
from harness.replay.executor import Executor, RunCounters, ServerFacts
from harness.replay.gcwatch import GcWatch
from harness.replay.preflight import available_memory, check_plan, check_subagent_slots
from harness.replay.recorder import Recorder

SCRAPE_CONNECTIONS = 1  # the server-metrics sampler's own request
SCRAPE_SHARE = 0.02  # the most of the client's time a server sample may take
# ... but never starved: the interval stretches to at most this many times the one asked for
# (a sample's cost is its wall time, which a saturated client inflates).
SCRAPE_MAX_STRETCH = 20.0


@dataclass(frozen=True)
class ShardRun:
    """One load generator of several acting as one run: its shard of the plan, and the shared
    origin of the run's timeline (Unix seconds; None: now)."""

    shard: Shard = WHOLE
    start_at: float | None = None
    # called on a thread once ready to start: the shared start (None: stop instead)
    gate: Callable[[], float | None] | None = None


@dataclass
class ReplayJob:
    """What one replay on a runtime's server runs: the plan, the server asked for, the policy's
    arguments, run.json as far as it is known (`run`, completed as the run goes), where the
    results go, the calibrated rates (None: defaults with the model's KV bytes per token), the
    server-sample interval, the client's timeouts and headers, whether to skip trajectories too
    large for a slot, and the shard of several load generators it is."""

    plan: Plan
    server: ServerOptions
    policy_args: dict[str, str]
    run: RunManifest
    out: Path
    rates: ServerRates | None = None
    scrape_interval_s: float = 0.2
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    headers: dict[str, str] | None = None
    skip_oversized: bool = False
    shard_run: ShardRun = ShardRun()


@dataclass(frozen=True)
class ReplaySettings:
    """How `replay` runs besides its plan: the server-sample interval, where leftover dump files
    are listed (llama.cpp), the server's info when already asked for, how often a progress line
    is printed (None: never), and the shard of several load generators this one is."""

    scrape_interval_s: float = 0.2
    leftover_dumps: Callable[[], list[str]] | None = None
    info: ServerInfo | None = None
    progress_every_s: float | None = None
    shard: Shard = WHOLE


def max_in_flight(plan: Plan) -> int:
    """The most requests the plan can have in flight at once: one per concurrent agent, one per
    bystander, and the scrape; an agent whose sub-agents run at once counts each of them. The
    connection pool is this large, so it never queues."""
    peaks = sorted((t.peak_requests() for t in plan.trajectories), reverse=True)
    if plan.arrivals.mode == "closed":
        peaks = peaks[:plan.arrivals.concurrency]
    return max(1, sum(peaks)) + len(plan.bystanders) + SCRAPE_CONNECTIONS


def run_on_runtime(runtime: Runtime, job: ReplayJob, echo: Callable[[str], None]
                   ) -> RunManifest:
    """Start (or reach) the runtime's server, replay the job's plan on it and stop what was
    started; returns the final run.json. The client's pool and the server are sized for the
    plan's most requests in flight (the server's `connections` is set here)."""
    server = dataclasses.replace(job.server, connections=max_in_flight(job.plan))
    run = job.run
    with runtime.start(server, job.out) as session:
        for note in session.notes:
            echo(note)
        record_details(run, session)
        bpt = session.details.kv_bytes_per_token
        rates = job.rates or ServerRates(FALLBACK_RATES.prefill_tok_s,
                                         FALLBACK_RATES.swap_bytes_per_s,
                                         bpt or FALLBACK_RATES.kv_bytes_per_token)
        run.event_loop = loop.loop_name()
        loop.run(_replay_session(session, dataclasses.replace(job, server=server, rates=rates)))
    return run


async def _replay_session(session: RuntimeSession, job: ReplayJob) -> None:
    plan, server, run, out, timeouts, shard_run = (job.plan, job.server, job.run, job.out,
                                                   job.timeouts, job.shard_run)
    headers, rates = job.headers, job.rates
    assert rates is not None  # run_on_runtime settles them
    limit = server.connections
    run.http = {"connection_limit": limit, "keepalive_s": KEEPALIVE_S, "pooled": True,
                "timeouts_s": timeouts.to_dict()}
    if headers:  # which headers went with the requests, never their values
        run.http["headers"] = sorted(headers)
    async with connect(session.details.url, limit, timeouts, headers) as http:
        adapter = session.connect(http)
        info = await server_info(adapter, redact_url(session.details.url))
        plan, skipped = check_plan(plan, info.ctx_per_slot, job.skip_oversized,
                                   available_memory())
        if skipped:
            run.skipped_oversized = skipped
        shard = shard_run.shard
        slots = info.slots if adapter.capabilities.harness_slots else None
        check_shard_slots(slots, shard.count)
        check_subagent_slots(plan, len(shard_slots(slots, shard)) if slots else None)
        how = session.realise(info)
        run.harness_policy, run.server_policy = how.harness_policy, how.label
        same = how.harness_policy == server.policy
        policy = make_policy(how.harness_policy, job.policy_args if same else {})
        leftover = session.leftover_dumps
        died: list[str] = []
        start_at = shard_run.start_at
        if shard_run.gate is not None:  # ready: the driver starts every shard at once
            start_at = await asyncio.to_thread(shard_run.gate)
            if start_at is None:
                raise asyncio.CancelledError()
            run.start_at = start_at
        clock = RealClock(None if start_at is None else int(start_at * NS))
        # A shared origin ahead: wait for it. One already past: start now; the calls planned
        # before now are recorded late (their client lag says by how much).
        await clock.sleep_until(0)
        replaying = asyncio.ensure_future(replay(
            adapter, clock, plan, policy, out, run, rates, ReplaySettings(
                job.scrape_interval_s,
                leftover_dumps=(lambda: leftover(str(run.run_id))) if leftover else None,
                info=info, progress_every_s=progress.interval_s(), shard=shard)))
        watch = (asyncio.create_task(_watch_server(session.server_exited, replaying, died))
                 if session.server_exited else None)
        collector = GcWatch()
        try:
            async with collector:
                try:
                    await replaying
                except asyncio.CancelledError:
                    if not died:
                        raise
            # The plan may have run out (every call refused) before the watch's next look.
            reason = session.server_exited() if session.server_exited and not died else None
            if reason is not None:
                died.append(reason)
            if died:
                run.status, run.stop_reason = "interrupted", died[0]
                raise ServerError(died[0])
        finally:
            if watch is not None:
                watch.cancel()
            if run.status is not None:  # the replay began: its run.json gets the pool's waits
                run.client_gc = collector.to_dict()
                run.http.update(http.pool_waits.to_dict())
                run.http["connections_opened"] = http.pool.opened
                run.write(out)


SERVER_WATCH_S = 0.5  # how often a local server's process is checked during a run


async def _watch_server(exited: Callable[[], str | None], replaying: asyncio.Future[Any],
                        died: list[str]) -> None:
    """End the replay as soon as the local server has exited: a dead server would otherwise be
    sent every remaining call (each failing) until the plan ran out."""
    while not replaying.done():
        reason = exited()
        if reason is not None:
            died.append(reason)
            replaying.cancel()
            return
        await asyncio.sleep(SERVER_WATCH_S)


def redact_url(url: str) -> str:
    """`url` with any password in it replaced by ***, as run.json and logs show it."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


SERVER_INFO_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, TypeError,
                                                   AttributeError)


async def server_info(adapter: Adapter, url: str) -> ServerInfo:
    """The server's own report; ServerError (one line) when it cannot be had."""
    try:
        return await adapter.server_info()
    except SERVER_INFO_ERRORS as exc:
        raise ServerError(f"{url}: no usable answer to the server-info request "
                          f"({type(exc).__name__}: {exc})"[:400]) from None


def record_details(run: RunManifest, session: RuntimeSession) -> None:
    """What the runtime's session says about its server, into run.json."""
    d = session.details
    run.server_url, run.server_flags, run.server_binary = redact_url(d.url), d.flags, d.binary
    run.server_build, run.server_python, run.server_env = d.build, d.python, d.env
    run.server_start_s, run.model = d.start_s, d.model
    run.server_process = d.process
    if d.extra:
        run.server_extra = {**(run.server_extra or {}), **d.extra}


@dataclass
class ScrapeStats:
    """What the server sampler did: its samples, and how far it stretched its interval."""

    interval_s: float
    samples: int = 0
    cost_ms_max: float = 0.0
    longest_interval_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


SCRAPE_YIELD_ROWS = 256


async def _scrape_loop(adapter: Adapter, clock: Clock, writer: PartWriter, stats: ScrapeStats,
                       errors: list[str]) -> None:
    """Sample the server every stats.interval_s, or less often where a sample costs more than
    SCRAPE_SHARE of the time between samples: the sampler's cost on the client stays bounded
    whatever the server exports (a /slots of thousands of slots, a /metrics of hundreds of
    series), and never more than SCRAPE_MAX_STRETCH times less often."""
    while True:
        t = clock.now_ns()
        began = time.perf_counter()
        yielded = 0.0  # time the loop spent on the replay between the sample's slices
        try:
            for i, (source, name, labels, value) in enumerate(await adapter.scrape(), 1):
                writer.append({"t_ns": t, "source": source, "name": name, "labels": labels,
                               "value": value})
                if i % SCRAPE_YIELD_ROWS == 0:
                    # A /slots of 10,000 slots is 20,000 rows: recorded in slices, the loop
                    # serving the replay between them (in one go it stalled it ~130 ms).
                    paused = time.perf_counter()
                    await asyncio.sleep(0)
                    yielded += time.perf_counter() - paused
            stats.samples += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a missed sample is noted, never fatal
            if len(errors) < 20:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
        cost = time.perf_counter() - began - yielded
        interval = min(max(stats.interval_s, cost / SCRAPE_SHARE),
                       SCRAPE_MAX_STRETCH * stats.interval_s)
        stats.cost_ms_max = max(stats.cost_ms_max, 1e3 * cost)
        stats.longest_interval_s = max(stats.longest_interval_s, interval)
        await sleep_s(clock, interval)


def write_summary(out_dir: Path, run: RunManifest) -> Summary:
    """Recompute summary.json (and, for a bounded run, window.json) from the records on disk;
    returns the summary."""
    # Streamed over the record parts: memory stays flat however long the run was.
    summary = summarize_dir(out_dir, run=run)
    save_summary(out_dir, summary)
    if run.window is not None:  # a bounded run: the figures of its window too
        write_json(out_dir / WINDOW_JSON, window_of_dir(
            out_dir, run.window["warmup_s"], run.window["duration_s"], run.kv_bytes_per_token))
    return summary


def _record_info(run: RunManifest, adapter: Adapter, info: ServerInfo, clock: Clock) -> None:
    run.runtime, run.server_version, run.server_model = (info.runtime, info.server_version,
                                                         info.model)
    run.vocab_size, run.slots, run.ctx_per_slot = info.vocab_size, info.slots, info.ctx_per_slot
    run.cache_block_tokens = info.cache_block_tokens
    run.cache_reuses_output = info.reuses_output
    if info.extra:
        run.server_extra = {**(run.server_extra or {}), **info.extra}
    run.capabilities = {"harness_slots": adapter.capabilities.harness_slots,
                        "pause_actions": sorted(adapter.capabilities.pause_actions),
                        "call_priority": adapter.capabilities.call_priority}
    run.wall_anchor_ns = getattr(clock, "wall_anchor_ns", None)
    run.status = "running"


async def replay(adapter: Adapter, clock: Clock, plan: Plan, policy: PausePolicy, out_dir: Path,
                 run: RunManifest, rates: ServerRates,
                 settings: ReplaySettings = ReplaySettings()) -> RunManifest:
    """Replay `plan` through `adapter` (whose info is asked for when the settings do not give
    it); returns run.json's final content. The settings' `progress_every_s`: print a progress
    line that often (stderr). Their `shard`: one load generator of several (the plan is its
    shard already): it assigns its own slots only, only the first samples the server, and the
    server-wide end checks (slots idle) are left to whoever merges the shards, since the others
    may still be running."""
    scrape_interval_s, leftover_dumps, shard = (settings.scrape_interval_s,
                                                settings.leftover_dumps, settings.shard)
    progress_every_s = settings.progress_every_s
    out_dir.mkdir(parents=True, exist_ok=True)
    if any((out_dir / RECORDS_DIR).glob("part-*.parquet")):
        raise InputError(f"{out_dir} already holds records; choose a new --out directory")
    info = settings.info or await adapter.server_info()
    # before run.json says `running`: a disk already full ends the run with nothing written
    reserve = reserve_space(out_dir / RUN_JSON_RESERVE, RUN_JSON_RESERVE_BYTES)
    _record_info(run, adapter, info, clock)
    try:
        run.write(out_dir)
    except OSError:
        reserve.unlink(missing_ok=True)
        raise
    recorder = Recorder(PartWriter(out_dir / RECORDS_DIR, RECORDS_SCHEMA), str(run.run_id),
                        clock)
    metrics_writer = PartWriter(out_dir / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA)
    scrape_errors: list[str] = []
    scrape = ScrapeStats(scrape_interval_s)
    scraper = (asyncio.create_task(
        _scrape_loop(adapter, clock, metrics_writer, scrape, scrape_errors))
        if shard.index == 0 else None)
    sharded = shard.count > 1
    executor = Executor(adapter, clock, recorder, policy, plan, str(run.run_id), ServerFacts(
        info.vocab_size, info.slots, info.ctx_per_slot, rates,
        slot_ids=shard_slots(info.slots, shard) if sharded and info.slots else None))
    run.history_window = executor.history_window
    shown = (asyncio.create_task(progress.report(executor.progress, clock, progress_every_s))
             if progress_every_s else None)
    status = "interrupted"
    cpu0 = time.process_time()
    failure: BaseException | None = None
    write_errors: list[OSError] = []
    try:
        await executor.run()
        status = "finished"
    except BaseException as exc:
        failure = exc
        raise
    finally:
        for task in (scraper, shown):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for writer in (metrics_writer, recorder):
            try:  # a full disk: what the parts before hold stays readable, run.json is ended
                writer.close()
            except OSError as exc:
                write_errors.append(exc)
        idle: bool | None = None
        held: list[str] | None = None
        with contextlib.suppress(Exception):
            idle = None if sharded else await adapter.slots_idle()
        with contextlib.suppress(Exception):
            # What the server still holds for the run (pins, sessions, host copies): every
            # trajectory's end released its own, so anything here is a leak.
            held = await adapter.held()
        errors = executor.counters.cleanup_errors
        _record_end(run, executor, clock, status, Cleanup(
            idle, leftover_dumps() if leftover_dumps else None,
            errors[:CLEANUP_ERRORS_KEPT], executor.counters.remote_dumps_left, len(errors),
            held_left=held), scrape_errors)
        run.scrape = scrape.to_dict()
        run.client_cpu_s = time.process_time() - cpu0
        unwritten = next((e for e in (failure, *write_errors)
                          if isinstance(e, OSError) and e.filename is not None), None)
        if unwritten is not None:
            run.status = "interrupted"
            run.stop_reason = run.stop_reason or (
                f"results could not be written: {unwritten.filename}: "
                f"{unwritten.strerror or unwritten}")
        # The space set aside when the run began is what lets run.json be ended on a full disk.
        reserve.unlink(missing_ok=True)
        run.write(out_dir)
    if write_errors:
        raise write_errors[0]
    write_summary(out_dir, run)
    return run


def _record_end(run: RunManifest, executor: Executor, clock: Clock, status: str,
                cleanup: Cleanup, scrape_errors: list[str]) -> None:
    c: RunCounters = executor.counters
    run.status, run.duration_s = status, clock.now_ns() / NS
    run.outcome = dataclasses.replace(c.outcome)
    run.final_rates = {"prefill_tok_s": executor.rates.prefill_tok_s,
                       "swap_bytes_per_s": executor.rates.swap_bytes_per_s}
    run.cleanup, run.scrape_errors = cleanup, scrape_errors
    run.bystanders_ended_s = c.bystanders_ended_s
