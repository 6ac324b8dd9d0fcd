"""`harness bench`'s inputs: one trace replayed under several policies, one server per policy,
compared in one report (with, on a calibration, the model's prediction, the simulator and the
advisor's pick; on --capacity, a capacity search)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.capacity.budget import parse_span
from harness.capacity.slo import Slo, parse_slo
from harness.errors import InputError
from harness.policies import POLICIES
from harness.replay.options import RunOptions
from harness.selftest.result import read_selftest
from harness.specs import shared
from harness.specs.fields import Field, Spec

# What `--help` names as the runtimes' usual policies, and the SLO the advisor's pick is judged
# under when --slo is not given.
DEFAULT_POLICIES = ("keep", "swap", "recompute")
DEFAULT_PICK_SLO = "resume_p95=2000ms"
MIN_CAPACITY_BUDGET_S, MAX_CAPACITY_BUDGET_S = 60.0, 7 * 86_400.0


@dataclass(frozen=True)
class BenchSpec(Spec):
    """A bench of `policies` on `trace`: a local server per policy (or `url`), `repeats`
    rounds, results under `out` (default: reports/bench-<UTC time>)."""

    COMMAND = "bench"

    runtime: str = shared.RUNTIME.attr()
    url: str | None = shared.URL.but(
        help="A running server (default: start a local server per policy).").attr()
    trace: Path | None = shared.TRACE.but(help=shared.SHIPPED_TRACE_HELP).attr()
    policies: str | None = shared.POLICIES.but(
        help=f"Comma-separated, from: {', '.join(POLICIES)} and the runtime's server policies "
             f"(default: the runtime's, e.g. {','.join(DEFAULT_POLICIES)}).").attr()
    policy_args: tuple[str, ...] = shared.SCOPED_POLICY_ARGS.but(
        help="A policy argument; POLICY.KEY=VALUE for one policy (e.g. ttl.tau=2), KEY=VALUE "
             "for every policy of the bench that takes KEY.").attr()
    inject: str = shared.INJECT.attr()
    concurrency: int = shared.CONCURRENCY.but(default=6, show_default=True, help=None).attr()
    time_scale: float = shared.TIME_SCALE.attr()
    token_scale: float = shared.TOKEN_SCALE.attr()
    seed: int = shared.SEED.attr()
    slots: int = shared.SLOTS.attr()
    ctx_per_slot: int = shared.CTX_PER_SLOT.attr()
    scrape_interval: float = shared.SCRAPE_INTERVAL.attr()
    calibration: Path | None = shared.CALIBRATION.but(
        help="Rates from `harness calibrate`, or a shipped preset's name (harness calibrate "
             "--list): policies price actions with them, each policy's directory gets the "
             "analytical prediction (prediction.json), and (llama.cpp, closed loop, no "
             "injection, time scale 1) the simulator runs each policy too "
             "(<policy>-simulated), compared in the report.").attr()
    calibrate_first: bool = Field(
        "calibrate_first", "--calibrate", "flag", False,
        help="llama.cpp, vLLM, SGLang: measure the server first (harness calibrate, written "
             "to <out>/calibration.json) and use it as --calibration: rates measured next to "
             "the replays they predict; re-measured briefly after the replays, each rate's "
             "drift in <out>/calibration-drift.json.").attr()
    server_args: tuple[str, ...] = shared.SERVER_ARGS.but(
        help="Extra flag for the local server, repeatable (e.g. -ngl 99).").attr()
    out: Path | None = shared.OUT.but(help=shared.ROOT_HELP.format(job="bench")).attr()
    selftest: Path | None = shared.SELFTEST.but(
        help="A `harness selftest` file: its instrument error goes into each run.json.").attr()
    repeats: int = shared.REPEATS.but(
        help="Run every policy N times, round by round (<policy>/repeat-1 ...); each policy's "
             "spread between its repeats goes to <policy>/repeats.json and is printed, and "
             "the report sets the repeats side by side.").attr()
    slo: str | None = Field(
        "slo", "--slo",
        help="The SLO for --capacity and for the advisor's pick (which runs with a "
             f"calibration; default {DEFAULT_PICK_SLO}), e.g. resume_p95=2000ms.").attr()
    capacity_search: bool = Field(
        "capacity_search", "--capacity", "flag", False,
        help="After the replays, a capacity search of every policy under --slo (harness "
             "capacity, into <out>/capacity).").attr()
    capacity_budget: str = Field(
        "capacity_budget", "--capacity-budget", default="10m", show_default=True,
        help="Wall time for the --capacity search.").attr()
    connection: shared.Connection = shared.Connection.attr()

    def check(self) -> None:
        if self.capacity_search and not self.slo:
            raise InputError("--capacity needs --slo (e.g. --slo resume_p95=2000ms)")
        self.pick_slo()
        self.capacity_s()
        self.base()

    def pick_slo(self) -> Slo:
        """The SLO of the advisor's pick and the capacity search."""
        return parse_slo(self.slo or DEFAULT_PICK_SLO)

    def capacity_s(self) -> float | None:
        """The capacity search's wall time in seconds; None without --capacity."""
        budget = parse_span("--capacity-budget", self.capacity_budget, MIN_CAPACITY_BUDGET_S,
                            MAX_CAPACITY_BUDGET_S)
        return budget if self.capacity_search else None

    def base(self) -> RunOptions:
        """What every replay of the bench shares (each policy's fills in its trace, policy,
        directory, server and calibration)."""
        return replace(
            self.connection.options(self.url), inject=self.inject, token_scale=self.token_scale,
            arrivals=shared.arrivals_of(self.concurrency, None, False, self.time_scale),
            seed=self.seed, slots=self.slots, ctx_per_slot=self.ctx_per_slot,
            scrape_interval_s=self.scrape_interval, server_args=self.server_args,
            instrument_error=read_selftest(self.selftest) if self.selftest else None,
            spec=self.record())
