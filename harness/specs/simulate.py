"""`harness simulate`'s inputs: one trace through the discrete-event server model under one
policy (one server, or a fleet behind a router)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from harness.errors import InputError
from harness.limits import MAX_BLOCK_SIZE, MAX_POOL_TOKENS
from harness.model.calibration import DEFAULT_PRESET, Calibration
from harness.model.engines import ENGINES, LLAMACPP
from harness.policies import parse_policy_args
from harness.simulate.fleet import ROUND_ROBIN, ROUTERS, check_fleet
from harness.simulate.options import DEFAULT_DEADLINE_S, FIRST_TOKEN_TIMEOUT_S, SimOptions
from harness.simulate.run import check_capacity
from harness.specs import shared
from harness.specs.fields import Field, Spec

MAX_SERVERS = 1024


def _first_token_timeout(raw: str, label: str) -> str:
    """Seconds > 0 or 'none' (as given, checked)."""
    if raw.strip().lower() == "none":
        return "none"
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{label} must be seconds > 0 or 'none', got {raw!r}")
    return raw


@dataclass(frozen=True)
class SimSpec(Spec):
    """A simulation of `trace` under `policy` on a modelled server (`calibration`'s rates)."""

    COMMAND = "simulate"

    trace: Path = shared.TRACE.but(required=True).attr()
    policy: str = shared.POLICY.but(help="keep, swap, recompute, ttl, threshold, ...").attr()
    policy_args: tuple[str, ...] = shared.POLICY_ARGS.attr()
    capacity_tokens: int | None = Field(
        "capacity_tokens", "--capacity-tokens", "int", low=1, high=MAX_POOL_TOKENS, shown="text",
        help="KV capacity as a token pool.").attr()
    slots: int | None = shared.SLOTS.but(
        default=None, shown="text", show_default=False,
        help="KV capacity as llama.cpp slots (with --ctx-per-slot).").attr()
    ctx_per_slot: int | None = shared.CTX_PER_SLOT.but(
        default=None, shown="text", show_default=False, help="Context tokens per slot.").attr()
    engine: str | None = Field(
        "engine", "--engine", "choice", choices=ENGINES,
        help="Memory semantics: llamacpp (slots, or a plain token pool; nothing cached once "
             "dropped) or vllm / sglang (a paged prefix cache: what no call or pin holds stays "
             "cached, evictable, least recently freed first). Default: the calibration's "
             "engine, else llamacpp.").attr()
    block_size: int | None = Field(
        "block_size", "--block-size", "int", low=1, high=MAX_BLOCK_SIZE, shown="text",
        help="vllm/sglang: tokens per KV block (default: the calibration's, else 16 for vLLM, "
             "1 for SGLang).").attr()
    host_tokens: int | None = Field(
        "host_tokens", "--host-tokens", "int", low=0, high=10**13, shown="text",
        help="vllm/sglang: the host tier's capacity for swap, in tokens (default: unbounded); "
             "an offload that does not fit is refused and the context stays pinned.").attr()
    calibration: Path = shared.CALIBRATION.but(
        default=DEFAULT_PRESET, show_default=True,
        help="Rates: a file from `harness calibrate`, or a shipped preset's name (harness "
             "calibrate --list).").attr()
    concurrency: int | None = shared.CONCURRENCY.but(shown="text").attr()
    rate: float | None = shared.RATE.but(shown="text").attr()
    trace_timing: bool = shared.TRACE_TIMING.attr()
    seed: int = shared.SEED.but(shown="text").attr()
    history_window: int = Field(
        "history_window", "--history-window", "int", 1000, low=0, high=10**9, shown="text",
        show_default=True,
        help="Latencies per tool class a policy sees (0: all, as the replay).").attr()
    default_deadline_s: float = Field(
        "default_deadline_s", "--default-deadline-s", "float", DEFAULT_DEADLINE_S, low=0.0,
        low_open=True, shown="text", show_default=True,
        help="Deadline of tool steps without one.").attr()
    first_token_timeout: str = Field(
        "first_token_timeout", "--first-token-timeout", "str", f"{FIRST_TOKEN_TIMEOUT_S:g}",
        show_default=True, check=_first_token_timeout,
        help="The client's, in seconds, as `harness run --first-token-timeout`: a call without "
             "its first token that long after it was sent fails its trajectory (what it holds "
             "is released); 'none': calls wait as long as it takes.").attr()
    slot_handoff: str = Field(
        "slot_handoff", "--slot-handoff", default="fifo", show_default=True,
        help="Closed loop, slots: 'fifo' (as the replay: a freed slot goes to the longest "
             "waiter) or 'agent' (an agent that ends a trajectory starts its next one on the "
             "slot it freed, ahead of the waiters).").attr()
    token_scale: float = shared.TOKEN_SCALE.but(
        help="Multiply every token count of the trace by this (rounded up), as `harness run "
             "--token-scale` does.").attr()
    servers: int = Field(
        "servers", "--servers", "int", 1, low=1, high=MAX_SERVERS, shown="text",
        show_default=True,
        help="K identical servers (each with the calibration and the capacity given) behind "
             f"--router, at most {MAX_SERVERS:,}.").attr()
    router: str = Field(
        "router", "--router", default=ROUND_ROBIN, show_default=True,
        help=f"With --servers > 1, one of {', '.join(ROUTERS)}: 'round-robin' sends each LLM "
             "call to the next server in turn (a resumed call that moves prefills its whole "
             "context again there; its KV on the old server is released); 'prefix-affinity' "
             "sends every call of a trajectory to the server of its first call, a new "
             "trajectory (or sub-agent) to the server with the fewest trajectories assigned "
             "(ties: lowest index).").attr()
    pinned_to: Path | None = Field(
        "pinned_to", "--pinned-to", "path", metavar="REPLAY_DIR",
        help="The engine model alone: start every trajectory and end every tool when this "
             "replay of the same trace (same --token-scale, copies, --concurrency and --seed) "
             "did, never earlier than the simulation reaches them, so its calls meet the "
             "company the replay's met; run.json counts those reached late.").attr()
    pin_release: str = shared.PINS[0].attr()
    no_summary: bool = Field("no_summary", "--no-summary", "flag", False,
                             help="Skip summary.json.").attr()
    out: Path = shared.OUT.but(required=True).attr()

    def check(self) -> None:
        check_fleet(self.servers, self.router)
        if self.pinned_to is not None and self.servers > 1:
            raise InputError("--pinned-to holds one server's simulation to a replay: not with "
                             "--servers")
        shared.arrivals_of(self.concurrency, self.rate, self.trace_timing)

    def options(self, cal: Calibration) -> SimOptions:
        """The simulation on `cal`'s server: its engine and KV pool where the inputs leave them
        to the calibration."""
        kind = self.engine or (cal.engine_kind if cal.engine_kind in ENGINES else LLAMACPP)
        tokens, block = self.capacity_tokens, self.block_size
        if kind != LLAMACPP:  # what the calibrated server reported, unless told otherwise
            if tokens is None and self.slots is None and self.ctx_per_slot is None:
                tokens = cal.kv_capacity_tokens
            if block is None and cal.engine_kind == kind:
                block = cal.block_size
        cap = check_capacity(tokens, self.slots, self.ctx_per_slot, kind, block,
                             self.host_tokens)
        arrivals = shared.arrivals_of(self.concurrency, self.rate, self.trace_timing)
        timeout = (math.inf if self.first_token_timeout == "none"
                   else float(self.first_token_timeout))
        return SimOptions(
            self.trace, self.policy, parse_policy_args(self.policy_args), cap,
            self.calibration, arrivals, self.seed, self.out, self.history_window,
            self.default_deadline_s, write_summary=not self.no_summary,
            slot_handoff=self.slot_handoff, token_scale=self.token_scale, servers=self.servers,
            router=self.router, first_token_timeout_s=timeout, pinned_to=self.pinned_to,
            pin_release=self.pin_release, spec=self.record())
