"""`harness capacity`'s inputs: the most concurrent agents a server holds under an SLO, searched
for each policy on live bounded runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.capacity.driver import SearchSpec
from harness.capacity.run import CapacityPlan, plan_capacity
from harness.policies import POLICIES
from harness.replay.options import RunOptions
from harness.specs.fields import Spec
from harness.specs.shared import (
    AUTH,
    CTX_PER_SLOT,
    OUT,
    ROOT_HELP,
    RUNTIME,
    SCOPED_POLICY_ARGS,
    SEARCH,
    SEED,
    SERVER_ARGS,
    SHIPPED_TRACE_HELP,
    SLOTS,
    TIMEOUTS,
    TOKEN_SCALE,
    TRACE,
    URL,
    arrivals_of,
    group,
    headers_of,
    search_of,
    timeouts_of,
)
from harness.specs.shared import (
    POLICIES as POLICIES_FIELD,
)


@dataclass(frozen=True)
class CapacitySpec(Spec):
    """A capacity search of `policies` on a server (a local one per point, or `url`)."""

    COMMAND = "capacity"

    runtime: str = RUNTIME.attr()
    url: str | None = URL.but(
        help="A running server (default: a local server started per point).").attr()
    trace: Path | None = TRACE.but(help=SHIPPED_TRACE_HELP).attr()
    policies: str = POLICIES_FIELD.but(
        default="keep,swap,recompute", show_default=True,
        help=f"Comma-separated, from: {', '.join(POLICIES)}.").attr()
    policy_args: tuple[str, ...] = SCOPED_POLICY_ARGS.attr()
    slo: str = SEARCH[0].attr()
    budget: str = SEARCH[1].attr()
    point_duration: str = SEARCH[2].attr()
    warmup: str = SEARCH[3].attr()
    start: int = SEARCH[4].attr()
    max_agents: int = SEARCH[5].attr()
    resolution: float = SEARCH[6].attr()
    no_confirm: bool = SEARCH[7].attr()
    seed: int = SEED.attr()
    token_scale: float = TOKEN_SCALE.attr()
    slots: int = SLOTS.attr()
    ctx_per_slot: int = CTX_PER_SLOT.attr()
    server_args: tuple[str, ...] = SERVER_ARGS.attr()
    out: Path | None = OUT.but(help=ROOT_HELP.format(job="capacity")).attr()
    connect_timeout: float = TIMEOUTS[0].attr()
    first_token_timeout: float = TIMEOUTS[1].attr()
    stall_timeout: float = TIMEOUTS[2].attr()
    request_timeout: float = TIMEOUTS[3].attr()
    api_key: str | None = AUTH[0].attr()
    header: tuple[str, ...] = AUTH[1].attr()
    skip_oversized: bool = AUTH[2].attr()

    def check(self) -> None:
        self.search()
        self.base()

    def search(self) -> SearchSpec:
        """The search's SLO, budget, points and settings."""
        return search_of(*group(self, SEARCH))

    def base(self) -> RunOptions:
        """What every point's run shares (its agent count and directory are the search's)."""
        return RunOptions(
            trace=Path(), policy="", out=Path(), runtime=self.runtime, url=self.url,
            seed=self.seed, slots=self.slots, ctx_per_slot=self.ctx_per_slot,
            server_args=self.server_args, arrivals=arrivals_of(1, None, False),
            timeouts=timeouts_of(*group(self, TIMEOUTS)),
            headers=headers_of(self.api_key, self.header, self.url),
            skip_oversized=self.skip_oversized, token_scale=self.token_scale)

    def plan(self) -> CapacityPlan:
        """The search, checked (policies, their arguments, the trace) before its first point."""
        return plan_capacity(self.policies, self.policy_args, self.trace, self.search(),
                             self.base(), self.out)
