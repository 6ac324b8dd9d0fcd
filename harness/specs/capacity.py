"""`harness capacity`'s inputs: the most concurrent agents a server holds under an SLO, searched
for each policy on live bounded runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.capacity.run import CapacityPlan, plan_capacity
from harness.policies import POLICIES
from harness.replay.options import RunOptions
from harness.specs import shared
from harness.specs.fields import Spec


@dataclass(frozen=True)
class CapacitySpec(Spec):
    """A capacity search of `policies` on a server (a local one per point, or `url`)."""

    COMMAND = "capacity"

    runtime: str = shared.RUNTIME.attr()
    url: str | None = shared.URL.but(
        help="A running server (default: a local server started per point).").attr()
    trace: Path | None = shared.TRACE.but(help=shared.SHIPPED_TRACE_HELP).attr()
    policies: str = shared.POLICIES.but(
        default="keep,swap,recompute", show_default=True,
        help=f"Comma-separated, from: {', '.join(POLICIES)}.").attr()
    policy_args: tuple[str, ...] = shared.SCOPED_POLICY_ARGS.attr()
    search: shared.Search = shared.Search.attr()
    seed: int = shared.SEED.attr()
    token_scale: float = shared.TOKEN_SCALE.attr()
    slots: int = shared.SLOTS.attr()
    ctx_per_slot: int = shared.CTX_PER_SLOT.attr()
    server_args: tuple[str, ...] = shared.SERVER_ARGS.attr()
    out: Path | None = shared.OUT.but(help=shared.ROOT_HELP.format(job="capacity")).attr()
    connection: shared.Connection = shared.Connection.attr()

    def check(self) -> None:
        self.search.spec()
        self.base()

    def base(self) -> RunOptions:
        """What every point's run shares (its agent count and directory are the search's)."""
        return replace(
            self.connection.options(self.url), runtime=self.runtime, url=self.url,
            seed=self.seed, slots=self.slots, ctx_per_slot=self.ctx_per_slot,
            server_args=self.server_args, arrivals=shared.arrivals_of(1, None, False),
            token_scale=self.token_scale)

    def plan(self) -> CapacityPlan:
        """The search, checked (policies, their arguments, the trace) before its first point."""
        return plan_capacity(self.policies, self.policy_args, self.trace, self.search.spec(),
                             self.base(), self.out)
