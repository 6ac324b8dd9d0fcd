"""`harness advise`'s inputs: a pause policy (and server settings) recommended from a search in
simulation, confirmed on the live server."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from harness.advise.candidates import OBJECTIVES, SPACE, engine_space
from harness.advise.run import AdvisePlan
from harness.errors import InputError
from harness.limits import MAX_POOL_TOKENS
from harness.specs import shared
from harness.specs.fields import Field, Spec
from harness.traces.shipped import shipped_trace


def _as_list(f: Field, help_text: str) -> Field:
    """A shared integer input as a comma-separated list of distinct values (the settings the
    advisor may choose from), with the bounds it has everywhere."""
    return f.but(default=None, many=True, shown="text", show_default=False, help=help_text)


@dataclass(frozen=True)
class AdviseSpec(Spec):
    """An advice on `trace` with `calibration`'s rates, under the search's SLO."""

    COMMAND = "advise"

    trace: Path | None = shared.TRACE.but(help=shared.SHIPPED_TRACE_HELP).attr()
    calibration: Path = shared.CALIBRATION.but(
        required=True,
        help="Rates from `harness calibrate` for the simulator (measure next to the server "
             "confirmed on), or a shipped preset's name (harness calibrate --list); of the "
             "--runtime's engine.").attr()
    objective: str = Field("objective", "--objective", "choice", "capacity",
                           choices=OBJECTIVES, show_default=True).attr()
    policies: str | None = Field(
        "policies", "--policies",
        help="The policy families searched (with the parameters the advisor tries); default: "
             f"every one the runtime executes (llamacpp: {', '.join(SPACE)}; vllm: "
             f"{', '.join(engine_space('vllm'))}; sglang: "
             f"{', '.join(engine_space('sglang', has_swap=False))}).").attr()
    slots: tuple[int, ...] | None = _as_list(
        shared.SLOTS,
        "llama.cpp: slot counts the server may run with, e.g. 2,4,8 (default 4).").attr()
    ctx_per_slot: tuple[int, ...] | None = _as_list(
        shared.CTX_PER_SLOT,
        "llama.cpp: context per slot the server may run with, e.g. 2048,4096 (default "
        "4096).").attr()
    kv_tokens: tuple[int, ...] | None = Field(
        "kv_tokens", "--kv-tokens", "int", low=16, high=MAX_POOL_TOKENS, many=True, shown="text",
        help="vLLM, SGLang: KV pool sizes in tokens the server may run with, e.g. 2560,4096 "
             "(default: the calibration's kv_capacity_tokens); a local server is started with "
             "each (vLLM --num-gpu-blocks-override, SGLang --max-total-tokens).").attr()
    agents: int | None = Field(
        "agents", "--agents", "int", low=1, high=100_000, shown="range",
        help="memory-time: the operating point (default: the best fixed policy's simulated "
             "capacity).").attr()
    tolerance: float = Field(
        "tolerance", "--tolerance", "float", 0.15, low=0.0, high=10.0, low_open=True,
        shown="range", show_default=True,
        help="The most the prediction may miss the measurement by.").attr()
    search: shared.Search = shared.Search.attr()
    runtime: str = shared.RUNTIME.attr()
    url: str | None = shared.URL.but(
        help="A running server (then --slots and --ctx-per-slot, or --kv-tokens, are its "
             "own).").attr()
    seed: int = shared.SEED.attr()
    token_scale: float = shared.TOKEN_SCALE.attr()
    out: Path | None = shared.OUT.but(help=shared.ROOT_HELP.format(job="advise")).attr()
    connection: shared.Connection = shared.Connection.attr()

    def check(self) -> None:
        if self.url and (len(self.slots or ()) > 1 or len(self.ctx_per_slot or ()) > 1):
            raise InputError("--url: the server's own slots and context are what it has; give "
                             "one --slots and one --ctx-per-slot (its settings)")
        self.search.spec()
        self.connection.options(self.url)

    def plan(self, root: Path | None = None) -> AdvisePlan:
        """The advice asked for, its results under `root` (default: --out, else
        reports/advise-<UTC time>)."""
        live = replace(self.connection.options(self.url), runtime=self.runtime, url=self.url,
                       seed=self.seed, arrivals=shared.arrivals_of(1, None, False),
                       token_scale=self.token_scale)
        root = root or self.out or Path("reports") / f"advise-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        return AdvisePlan(
            root, self.trace or shipped_trace(), self.calibration, self.objective,
            tuple(p.strip() for p in (self.policies or "").split(",") if p.strip()),
            self.slots or (), self.ctx_per_slot or (), self.search.spec(), live,
            self.agents, self.tolerance, self.kv_tokens or ())
