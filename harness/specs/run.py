"""`harness run`'s inputs: one replay of a trace under one policy."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from harness.errors import InputError
from harness.plan.shard import MAX_SHARDS, Shard
from harness.policies import POLICIES, parse_policy_args
from harness.replay.options import RunOptions
from harness.replay.run import shared_run_id
from harness.selftest.result import read_selftest
from harness.specs import shared
from harness.specs.fields import Field, Spec

# A shared start this far from now is a mistake (a typo, milliseconds for seconds).
START_AT_WINDOW_S = 86_400.0
MAX_DURATION_S = 7 * 86_400.0


@dataclasses.dataclass(frozen=True)
class RunSpec(Spec):
    """A replay of `trace` under `policy` on a runtime (a local server, or `url`)."""

    COMMAND = "run"

    runtime: str = shared.RUNTIME.attr()
    url: str | None = shared.URL.but(
        help="A running server; without it a local one is started and stopped.").attr()
    trace: Path = shared.TRACE.but(required=True).attr()
    policy: str = shared.POLICY.but(
        help=f"One of {', '.join(POLICIES)}, or a server policy of the runtime's (e.g. "
             "Dynamo's round-robin, session).").attr()
    policy_args: tuple[str, ...] = shared.POLICY_ARGS.attr()
    inject: str = shared.INJECT.but(
        help="Injection profile: none, slow-tools, abandoned-tools, chaos, or a TOML "
             "file.").attr()
    concurrency: int | None = shared.CONCURRENCY.attr()
    rate: float | None = shared.RATE.attr()
    trace_timing: bool = shared.TRACE_TIMING.attr()
    time_scale: float = shared.TIME_SCALE.but(
        help="Multiply arrivals, tool latencies and deadlines by this.").attr()
    seed: int = shared.SEED.attr()
    token_scale: float = shared.TOKEN_SCALE.attr()
    out: Path = shared.OUT.but(required=True).attr()
    slots: int = shared.SLOTS.but(help="Local server: -np.").attr()
    ctx_per_slot: int = shared.CTX_PER_SLOT.attr()
    threads: int = shared.THREADS.attr()
    model: Path | None = Field(
        "model", "--model", "path",
        help="Local server: GGUF model (default: SmolLM2-135M-Instruct); --runtime openai: the "
             "served model's name (default: the first /v1/models lists).").attr()
    scrape_interval: float = shared.SCRAPE_INTERVAL.attr()
    calibration: Path | None = shared.CALIBRATION.but(
        help="Rates from `harness calibrate` (a file, or a shipped preset's name) for the "
             "policies to price actions with.").attr()
    server_args: tuple[str, ...] = shared.SERVER_ARGS.but(
        help="Extra flag for the local server, repeatable (e.g. --server-arg=-ngl "
             "--server-arg=99 to offload a llama-server to the GPU).").attr()
    selftest: Path | None = shared.SELFTEST.but(
        help="A `harness selftest` file: its instrument error goes into run.json.").attr()
    duration: float | None = Field(
        "duration", "--duration", "float", low=0.0, high=MAX_DURATION_S, low_open=True,
        help="Stop the run after this many seconds (what is still running is recorded "
             "interrupted, reason run-horizon): a bounded run for a steady-state figure.").attr()
    warmup_s: float = Field(
        "warmup_s", "--warmup", "float", 0.0, show_default=True,
        help="With --duration: the first seconds, which the run's window figures "
             "(window.json) leave out.").attr()
    repeats: int = shared.REPEATS.but(
        help="Run N times (OUT/repeat-1 ...) and write the spread between the repeats to "
             "OUT/repeats.json.").attr()
    shard: str | None = Field(
        "shard", "--shard", metavar="I/N",
        help="Replay only shard I of N of the run (trajectories by a hash of their id, agents, "
             "bystanders and slots split): one of N load generators acting as one run, with "
             "--start-at; `harness merge` joins their results.").attr()
    start_at: float | None = Field(
        "start_at", "--start-at", "float", metavar="UNIX_S",
        help="With --shard: the run's shared start, in Unix seconds (every shard the same, "
             "e.g. $(( $(date +%s) + 30 ))).").attr()
    workers: int = Field(
        "workers", "--workers", "int", 1, low=1, high=MAX_SHARDS, shown="range", show_default=True,
        help="Drive the run from N load generators (Ray actors; needs the [distributed] "
             "extra): a local Ray instance, or --ray-address.").attr()
    ray_address: str | None = Field(
        "ray_address", "--ray-address", metavar="HOST:PORT",
        help="With --workers: an existing Ray cluster instead of a local instance.").attr()
    connection: shared.Connection = shared.Connection.attr()

    def check(self) -> None:
        check_window(self.duration, self.warmup_s)
        self.options()

    def options(self) -> RunOptions:
        """The replay's RunOptions (one shard of a run where --shard asks for one)."""
        opts = dataclasses.replace(
            self.connection.options(self.url), trace=self.trace, policy=self.policy,
            out=self.out, runtime=self.runtime, url=self.url,
            policy_args=parse_policy_args(self.policy_args), inject=self.inject,
            arrivals=shared.arrivals_of(self.concurrency, self.rate, self.trace_timing,
                                 self.time_scale),
            seed=self.seed, slots=self.slots, ctx_per_slot=self.ctx_per_slot,
            threads=self.threads, model=self.model, scrape_interval_s=self.scrape_interval,
            calibration=self.calibration, server_args=self.server_args,
            instrument_error=read_selftest(self.selftest) if self.selftest else None,
            token_scale=self.token_scale, duration_s=self.duration, warmup_s=self.warmup_s,
            spec=self.record())
        return sharding(opts, self.shard, self.start_at, self.workers, self.ray_address,
                        self.repeats)


def check_window(duration_s: float | None, warmup_s: float) -> None:
    """InputError unless --duration is a positive number of seconds and --warmup lies in
    [0, duration)."""
    if duration_s is None:
        if warmup_s:
            raise InputError("--warmup needs --duration (a bounded run)")
        return
    if not 0 < duration_s <= MAX_DURATION_S:
        raise InputError(f"--duration must be in (0, 604800] seconds, got {duration_s:g}")
    if not 0 <= warmup_s < duration_s:
        raise InputError(f"--warmup must be in [0, --duration), got {warmup_s:g} with "
                         f"--duration {duration_s:g}")


def sharding(opts: RunOptions, shard_text: str | None, start_at: float | None, workers: int,
             ray_address: str | None, repeats: int) -> RunOptions:
    """`opts` as one shard of a run (--shard, --start-at); InputError naming the flag when the
    inputs do not go together."""
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
