"""`harness run`: replay a trace against a runtime under one pause policy."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import click

from harness.adapters.http import Timeouts
from harness.commands.exits import exit_on_server_failures, print_result
from harness.commands.options import (
    Command,
    arrivals_from_flags,
    auth_options,
    check_run_flags,
    check_window,
    runtime_option,
    scrape_interval_option,
    seed_option,
    timeout_options,
    token_scale_option,
    url_option,
)
from harness.distributed.driver import RayWorkers
from harness.errors import InputError
from harness.plan.shard import MAX_SHARDS, Shard
from harness.policies import POLICIES, parse_policy_args
from harness.replay.options import RunOptions
from harness.replay.run import IN_PROCESS, RunEnvironment, execute_repeats, shared_run_id
from harness.report.repeats import format_spread
from harness.selftest.result import read_selftest

# A shared start this far from now is a mistake (a typo, milliseconds for seconds).
START_AT_WINDOW_S = 86_400.0


def _err(message: str) -> None:
    click.echo(message, err=True)


@click.command("run", cls=Command)
@runtime_option()
@url_option("A running server; without it a local one is started and stopped.")
@click.option("--trace", "trace_path", required=True, type=click.Path(path_type=Path))
@click.option("--policy", required=True,
              help=f"One of {', '.join(POLICIES)}, or a server policy of the runtime's "
                   "(e.g. Dynamo's round-robin, session).")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="KEY=VALUE")
@click.option("--inject", default="none", show_default=True,
              help="Injection profile: none, slow-tools, abandoned-tools, chaos, or a TOML file.")
@click.option("--concurrency", type=int, help="Closed loop: N agents (default 4).")
@click.option("--rate", type=float, help="Open loop: Poisson arrivals per second.")
@click.option("--trace-timing", is_flag=True, help="Open loop: the trace's start_s.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Multiply arrivals, tool latencies and deadlines by this.")
@seed_option
@token_scale_option
@click.option("--out", required=True, type=click.Path(path_type=Path))
@click.option("--slots", type=int, default=4, show_default=True, help="Local server: -np.")
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="Local server: GGUF model (default: SmolLM2-135M-Instruct); --runtime "
              "openai: the served model's name (default: the first /v1/models lists).")
@scrape_interval_option
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Rates from `harness calibrate` (a file, or a shipped preset's name) for "
                   "the policies to price actions with.")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra flag for the local server, repeatable (e.g. --server-arg=-ngl "
                   "--server-arg=99 to offload a llama-server to the GPU).")
@click.option("--selftest", "selftest", type=click.Path(path_type=Path),
              help="A `harness selftest` file: its instrument error goes into run.json.")
@click.option("--duration", "duration_s", type=float,
              help="Stop the run after this many seconds (what is still running is recorded "
                   "interrupted, reason run-horizon): a bounded run for a steady-state figure.")
@click.option("--warmup", "warmup_s", type=float, default=0.0, show_default=True,
              help="With --duration: the first seconds, which the run's window figures "
                   "(window.json) leave out.")
@click.option("--repeats", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Run N times (OUT/repeat-1 ...) and write the spread between the repeats "
                   "to OUT/repeats.json.")
@click.option("--shard", "shard_text", metavar="I/N",
              help="Replay only shard I of N of the run (trajectories by a hash of their id, "
                   "agents, bystanders and slots split): one of N load generators acting as "
                   "one run, with --start-at; `harness merge` joins their results.")
@click.option("--start-at", type=float, metavar="UNIX_S",
              help="With --shard: the run's shared start, in Unix seconds (every shard the "
                   "same, e.g. $(( $(date +%s) + 30 ))).")
@click.option("--workers", type=click.IntRange(1, MAX_SHARDS), default=1, show_default=True,
              help="Drive the run from N load generators (Ray actors; needs the "
                   "[distributed] extra): a local Ray instance, or --ray-address.")
@click.option("--ray-address", metavar="HOST:PORT",
              help="With --workers: an existing Ray cluster instead of a local instance.")
@timeout_options
@auth_options
def run_command(runtime: str, url: str | None, trace_path: Path, policy: str,
                policy_args: tuple[str, ...], inject: str, concurrency: int | None,
                rate: float | None, trace_timing: bool, time_scale: float, seed: int,
                out: Path, slots: int, ctx_per_slot: int, threads: int,
                model_path: Path | None, scrape_interval: float, calibration: Path | None,
                server_args: tuple[str, ...], selftest: Path | None, timeouts: Timeouts,
                headers: dict[str, str], skip_oversized: bool, repeats: int,
                token_scale: float, duration_s: float | None, warmup_s: float,
                shard_text: str | None, start_at: float | None, workers: int,
                ray_address: str | None) -> None:
    """Replay TRACE against a runtime under POLICY and write a results directory."""
    check_window(duration_s, warmup_s)
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot, threads=threads,
                    scrape_interval=scrape_interval, time_scale=time_scale)
    opts = RunOptions(
        trace=trace_path, policy=policy, out=out, runtime=runtime, url=url,
        policy_args=parse_policy_args(policy_args), inject=inject,
        arrivals=arrivals_from_flags(concurrency, rate, trace_timing, time_scale), seed=seed,
        slots=slots, ctx_per_slot=ctx_per_slot, threads=threads, model=model_path,
        scrape_interval_s=scrape_interval, calibration=calibration, server_args=server_args,
        instrument_error=read_selftest(selftest) if selftest else None, timeouts=timeouts,
        headers=headers, skip_oversized=skip_oversized, token_scale=token_scale,
        duration_s=duration_s, warmup_s=warmup_s)
    opts = sharding_from_flags(opts, shard_text, start_at, workers, ray_address, repeats)
    env: RunEnvironment = RayWorkers(workers, ray_address) if workers > 1 else IN_PROCESS
    runs, spread = execute_repeats(opts, repeats, env, _err, print_result)
    if spread is not None:
        click.echo(format_spread(spread))
        click.echo(f"spread between repeats -> {out / 'repeats.json'}")
    exit_on_server_failures(runs)


def sharding_from_flags(opts: RunOptions, shard_text: str | None, start_at: float | None,
                        workers: int, ray_address: str | None, repeats: int) -> RunOptions:
    """`opts` as one shard of a run (--shard, --start-at), after the flags' checks; InputError
    naming the flag when they do not go together."""
    if ray_address is not None and workers == 1:
        raise InputError("--ray-address needs --workers N (N >= 2)")
    if workers > 1 and (shard_text is not None or start_at is not None):
        raise InputError("--workers shards the run itself: leave out --shard and --start-at")
    if (workers > 1 or shard_text is not None) and repeats > 1:
        raise InputError("--repeats runs one process: leave it out with --workers or --shard")
    if shard_text is None:
        if start_at is not None:
            raise InputError("--start-at needs --shard I/N")
        return opts
    shard = Shard.parse(shard_text)
    if shard.count > 1 and start_at is None:
        raise InputError("--shard needs --start-at UNIX_S: the shards' shared start")
    if start_at is not None and not abs(start_at - time.time()) <= START_AT_WINDOW_S:
        raise InputError(f"--start-at must be Unix seconds within a day of now, got "
                         f"{start_at:.0f}")
    return dataclasses.replace(opts, shard=shard, start_at=start_at,
                               run_id=shared_run_id(opts, start_at))
