"""`harness run`: replay a trace against a runtime under one pause policy."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import click
import pandas as pd

from harness import __version__
from harness.adapters.base import Runtime, ServerOptions
from harness.adapters.http import Timeouts
from harness.adapters.runtimes import RUNTIMES, get_runtime
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.model.calibration import read_calibration
from harness.plan.injection import Injection, load_injection
from harness.plan.planner import Arrivals, Plan, make_plan
from harness.plan.shard import MAX_SHARDS, Shard, shard_plan
from harness.plan.tokens import stable_seed
from harness.policies import POLICIES, make_policy, parse_policy_args
from harness.policies.base import PausePolicy
from harness.records.host import host_identity
from harness.records.manifest import ArrivalsRef, CpuPinning, Outcome, RunManifest, TraceRef
from harness.replay import pinning
from harness.replay.named_policies import per_pause_policy
from harness.replay.options import AUTO, RunOptions
from harness.replay.runner import ShardRun, run_on_runtime
from harness.selftest.result import read_selftest
from harness.traces.reuse import ideal_reuse_for
from harness.traces.scale import check_token_scale, imported_token_scale, scale_tokens
from harness.traces.schema import file_sha256
from harness.traces.tile import copies_needed, tile_steps
from harness.traces.validate import load_trajectories

__all__ = ["RunOptions", "execute_run", "arrivals_from_flags", "run_cmd"]


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


@dataclass(frozen=True)
class PlannedRun:
    """A run's whole plan (every shard's), and what it was made from."""

    plan: Plan
    steps: pd.DataFrame
    injection: Injection
    copies: int
    policy: PausePolicy


def plan_run(o: RunOptions, rt: Runtime) -> PlannedRun:
    """Check the policy and plan the whole run (InputError for bad input)."""
    pol = make_policy(per_pause_policy(o.policy, rt), o.policy_args)
    steps = scale_tokens(load_trajectories(o.trace), o.token_scale)
    injection = load_injection(o.inject)
    a = o.arrivals
    # A bounded closed loop never runs out of work: the trace repeats (new content per copy).
    copies = (copies_needed(steps, a.concurrency, o.duration_s, a.time_scale)
              if o.duration_s is not None and a.mode == "closed" else 1)
    plan = dataclasses.replace(make_plan(tile_steps(steps, copies), injection, a, o.seed),
                               horizon_s=o.duration_s)
    return PlannedRun(plan, steps, injection, copies, pol)


def server_options(o: RunOptions, run_id: str, pin: CpuPinning | None) -> ServerOptions:
    """What a local server is started with (or which server is reached: `o.url`)."""
    return ServerOptions(policy=o.policy, run_id=run_id, url=o.url, slots=o.slots,
                         ctx_per_slot=o.ctx_per_slot, threads=o.threads, model=o.model,
                         server_args=o.server_args, server_cpus=pin.server if pin else None,
                         shared=o.server_shared if o.url else None)


def new_run_id(policy: str) -> str:
    """A run id: the policy, the UTC time and a random tag."""
    return f"{policy}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def execute_run(o: RunOptions, echo: Callable[[str], None] = click.echo,
                runtime: Runtime | None = None) -> RunManifest:
    """Validate inputs, plan, replay (starting a local server unless `url`); returns run.json.
    `runtime`: the runtime to drive (default: the registry's `o.runtime`). A shard of a run
    (`o.shard`) replays its part of the whole plan on the run's shared timeline."""
    rt = runtime or get_runtime(o.runtime)
    p = plan_run(o, rt)
    whole, steps, a = p.plan, p.steps, o.arrivals
    plan = shard_plan(whole, o.shard)
    pin = (pinning.decide(pinning.available_cpus(), o.url is None, rt.pins_local_server)
           if o.pinning == AUTO else o.pinning)
    pinning.apply(pin)
    run = RunManifest(
        run_id=o.run_id or new_run_id(o.policy),
        runtime=rt.name, policy=o.policy, policy_args=dict(o.policy_args),
        policy_sees_true_latency=p.policy.sees_true_latency,
        trace=TraceRef(str(o.trace), file_sha256(o.trace), len(whole.trajectories),
                       int(len(steps)), len(whole.all_trajectories()) - len(whole.trajectories),
                       o.token_scale * imported_token_scale(o.trace),
                       ideal_reuse_for(steps, p.policy), p.copies),
        seed=o.seed, injection=p.injection.as_dict(),
        arrivals=ArrivalsRef(a.mode, a.concurrency, a.rate, a.time_scale),
        harness_version=__version__, git_commit=git_commit(), host=host_identity(),
        started_at=datetime.now(UTC).isoformat(), cpu_pinning=pin,
        instrument_error=o.instrument_error,
        window=(None if o.duration_s is None
                else {"warmup_s": o.warmup_s, "duration_s": o.duration_s}),
        shard=str(o.shard) if o.shard.count > 1 else None, start_at=o.start_at)
    cal = read_calibration(o.calibration) if o.calibration else None
    if o.calibration and cal:
        run.calibration = {"path": str(o.calibration), **cal.to_dict()}
    ensure_out_dir(o.out)
    server = server_options(o, str(run.run_id), pin)
    return run_on_runtime(rt, server, plan, o.policy_args, run, o.out,
                          cal.rates() if cal else None, o.scrape_interval_s, echo, o.timeouts,
                          o.headers, o.skip_oversized, ShardRun(o.shard, o.start_at,
                                                                o.start_gate))


def ensure_out_dir(path: Path, flag: str = "--out") -> None:
    """Create a results directory; InputError when `path` is a file or cannot be made."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path} is a file; give a directory for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot create it ({exc.strerror or exc})") from None


def check_url(url: str | None) -> None:
    """InputError unless `url` is an http(s) URL with a host."""
    if url is None:
        return
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--url must be http://host[:port] or https://..., got {url[:80]!r}")


def arrivals_from_flags(concurrency: int | None, rate: float | None, trace_timing: bool,
                        time_scale: float) -> Arrivals:
    if sum(x is not None and x is not False for x in (concurrency, rate, trace_timing)) > 1:
        raise InputError("choose one of --concurrency, --rate, --trace-timing")
    mode: Literal["closed", "poisson", "trace"] = (
        "poisson" if rate is not None else "trace" if trace_timing else "closed")
    # None means the flag was not given; a 0 given is refused below, never replaced.
    return Arrivals(mode=mode, concurrency=4 if concurrency is None else concurrency,
                    rate=1.0 if rate is None else rate, time_scale=time_scale)


# The ranges a run's numeric flags must fall in: (flag, low, high), low exclusive for floats.
RUN_FLAG_RANGES: tuple[tuple[str, float, float], ...] = (
    ("--slots", 1, 65_536), ("--ctx-per-slot", 16, 16_777_216), ("--threads", 1, 4096),
    ("--scrape-interval", 0.01, 3600.0), ("--time-scale", 1e-6, 1e6))


def check_run_flags(**values: float) -> None:
    """InputError naming the flag and its range when a value is outside it (keys: flag names
    without dashes, underscores for hyphens)."""
    for flag, low, high in RUN_FLAG_RANGES:
        key = flag[2:].replace("-", "_")
        if key in values and not low <= values[key] <= high:
            raise InputError(f"{flag} must be in [{low:g}, {high:g}], got {values[key]:g}")


def check_window(duration_s: float | None, warmup_s: float) -> None:
    """InputError unless --duration is a positive number of seconds and --warmup lies in
    [0, duration)."""
    if duration_s is None:
        if warmup_s:
            raise InputError("--warmup needs --duration (a bounded run)")
        return
    if not 0 < duration_s <= 7 * 86_400:
        raise InputError(f"--duration must be in (0, 604800] seconds, got {duration_s:g}")
    if not 0 <= warmup_s < duration_s:
        raise InputError(f"--warmup must be in [0, --duration), got {warmup_s:g} with "
                         f"--duration {duration_s:g}")


def timeout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--connect-timeout, --first-token-timeout, --stall-timeout, --request-timeout."""
    d = Timeouts()
    for flag, default, what in (
            ("--request-timeout", d.request_s, "Seconds for a whole non-streamed request "
             "(server info, slot actions, scrapes)."),
            ("--stall-timeout", d.idle_s, "Seconds a streamed answer may go silent once it "
             "has begun; a stalled call is recorded `timeout` and its trajectory fails."),
            ("--first-token-timeout", d.first_byte_s, "Seconds from sending a call to its "
             "first streamed data (a long prefill on a CPU server takes minutes)."),
            ("--connect-timeout", d.connect_s, "Seconds to open a connection.")):
        f = click.option(flag, type=float, default=default, show_default=True, help=what)(f)
    return f


def token_scale_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--token-scale: every token count of the trace times F (rounded up), so long real
    sessions fit a small local model; recorded in run.json (trace.token_scale)."""
    return click.option("--token-scale", type=float, default=1.0, show_default=True,
                        help="Multiply every token count of the trace by this (rounded up), "
                             "e.g. 0.05 to fit 100k-token sessions in a 16k context.")(f)


def auth_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--api-key (or HARNESS_API_KEY), repeatable --header, and --skip-oversized."""
    f = click.option("--skip-oversized", is_flag=True,
                     help="Skip (and record in run.json) trajectories whose context cannot "
                          "fit a slot, instead of refusing the run.")(f)
    f = click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'",
                     help="An HTTP header for every request to the server, repeatable.")(f)
    return click.option("--api-key", envvar="HARNESS_API_KEY", show_envvar=True,
                        help="Sent as 'Authorization: Bearer KEY'; never recorded.")(f)


def headers_from_flags(api_key: str | None, headers: tuple[str, ...],
                       url: str | None = None) -> dict[str, str]:
    """The request headers the flags ask for; InputError for one that is not 'Name: value',
    or for an Authorization beside credentials in `url` (one or the other)."""
    out: dict[str, str] = {}
    for h in headers:
        name, sep, value = h.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in " \t\r\n") or "\n" in value:
            raise InputError(f"--header must be 'Name: value', got {h[:60]!r}")
        out[name] = value
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    if url and "@" in urllib.parse.urlsplit(url).netloc and any(
            k.lower() == "authorization" for k in out):
        raise InputError("--url carries credentials and an Authorization header is given "
                         "(--api-key or --header): use one of them")
    return out


def timeouts_from_flags(connect_timeout: float, first_token_timeout: float,
                        stall_timeout: float, request_timeout: float) -> Timeouts:
    """The flags as Timeouts; InputError naming the rule when one is out of range."""
    try:
        return Timeouts(connect_timeout, first_token_timeout, stall_timeout, request_timeout)
    except ValueError as exc:
        raise InputError(str(exc).replace("timeout connect_s", "--connect-timeout")
                         .replace("timeout first_byte_s", "--first-token-timeout")
                         .replace("timeout idle_s", "--stall-timeout")
                         .replace("timeout request_s", "--request-timeout")) from None


@click.command("run")
@click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
              show_default=True)
@click.option("--url", help="A running server; without it a local one is started and stopped.")
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
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@token_scale_option
@click.option("--out", required=True, type=click.Path(path_type=Path))
@click.option("--slots", type=int, default=4, show_default=True, help="Local server: -np.")
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="Local server: GGUF model (default: SmolLM2-135M-Instruct); --runtime "
              "openai: the served model's name (default: the first /v1/models lists).")
@click.option("--scrape-interval", type=float, default=0.2, show_default=True)
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Rates from `harness calibrate` for the policies to price actions with.")
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
def run_cmd(runtime: str, url: str | None, trace_path: Path, policy: str,
            policy_args: tuple[str, ...], inject: str, concurrency: int | None,
            rate: float | None, trace_timing: bool, time_scale: float, seed: int, out: Path,
            slots: int, ctx_per_slot: int, threads: int, model_path: Path | None,
            scrape_interval: float, calibration: Path | None,
            server_args: tuple[str, ...], selftest: Path | None, connect_timeout: float,
            first_token_timeout: float, stall_timeout: float, request_timeout: float,
            api_key: str | None, headers: tuple[str, ...], skip_oversized: bool,
            repeats: int, token_scale: float, duration_s: float | None,
            warmup_s: float, shard_text: str | None, start_at: float | None, workers: int,
            ray_address: str | None) -> None:
    """Replay TRACE against a runtime under POLICY and write a results directory."""
    check_token_scale(token_scale)
    check_window(duration_s, warmup_s)
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot, threads=threads,
                    scrape_interval=scrape_interval, time_scale=time_scale)
    check_url(url)
    timeouts = timeouts_from_flags(connect_timeout, first_token_timeout, stall_timeout,
                                   request_timeout)
    instrument = read_selftest(selftest) if selftest else None
    opts = RunOptions(
        trace=trace_path, policy=policy, out=out, runtime=runtime, url=url,
        policy_args=parse_policy_args(policy_args), inject=inject,
        arrivals=arrivals_from_flags(concurrency, rate, trace_timing, time_scale), seed=seed,
        slots=slots, ctx_per_slot=ctx_per_slot, threads=threads, model=model_path,
        scrape_interval_s=scrape_interval, calibration=calibration, server_args=server_args,
        instrument_error=instrument, timeouts=timeouts,
        headers=headers_from_flags(api_key, headers, url), skip_oversized=skip_oversized,
        token_scale=token_scale, duration_s=duration_s, warmup_s=warmup_s)
    opts = sharding_from_flags(opts, shard_text, start_at, workers, ray_address, repeats)
    if workers > 1 or repeats == 1:
        if workers > 1:
            from harness.distributed.driver import run_distributed

            run = run_distributed(opts, workers, ray_address, lambda m: click.echo(m, err=True))
        else:
            run = execute_run(opts, lambda m: click.echo(m, err=True))
        _print_result(out, run)
        exit_on_server_failures([run])
        return
    from harness.report.repeats import format_spread, repeat_dirs, write_repeats

    ensure_out_dir(out)
    dirs = repeat_dirs(out, repeats)
    runs = []
    for k, d in enumerate(dirs, 1):
        click.echo(f"repeat {k} of {repeats} -> {d}", err=True)
        runs.append(execute_run(dataclasses.replace(opts, out=d),
                                lambda m: click.echo(m, err=True)))
        _print_result(d, runs[-1])
    click.echo(format_spread(write_repeats(out, dirs)))
    click.echo(f"spread between repeats -> {out / 'repeats.json'}")
    exit_on_server_failures(runs)


# A shared start this far from now is a mistake (a typo, milliseconds for seconds).
START_AT_WINDOW_S = 86_400.0


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


def shared_run_id(opts: RunOptions, start_at: float | None) -> str:
    """The run id every shard of one run derives alike, without talking to the others: the
    policy, the start, and a hash of the trace, seed and start."""
    when = datetime.fromtimestamp(start_at or 0.0, UTC)
    tag = stable_seed("run", file_sha256(opts.trace) if opts.trace.is_file() else opts.trace,
                      opts.seed, repr(start_at)) % 16**6
    return f"{opts.policy}-{when:%Y%m%dT%H%M%S}-{tag:06x}"


# The run finished, but trajectories failed because the server did (not the task's own fault).
SERVER_FAILURES_EXIT = 4


def exit_on_server_failures(runs: list[RunManifest]) -> None:
    """Exit SERVER_FAILURES_EXIT, with one line, when a run lost trajectories to the server."""
    lost = {str(r.policy): r.outcome.server_failed for r in runs
            if r.outcome is not None and r.outcome.server_failed}
    if lost:
        which = ", ".join(f"{p}: {n}" for p, n in lost.items())
        click.echo(f"error: trajectories failed because the server failed ({which}); "
                   "the results are kept", err=True)
        sys.exit(SERVER_FAILURES_EXIT)


def _print_result(out: Path, run: RunManifest) -> None:
    o = run.outcome or Outcome()
    click.echo(f"{run.policy}: {o.completed} completed, {o.cancelled} cancelled, "
               f"{o.failed} failed in {run.duration_s or 0:.1f}s -> {out}")
    if run.cleanup and (undone := run.cleanup.problems()):
        click.echo(f"warning: cleanup incomplete: {'; '.join(undone)}; details in "
                   f"{out / 'run.json'} (cleanup)", err=True)
