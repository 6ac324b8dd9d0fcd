"""The simulated server's parameters, run counters and pause contexts (the tool-class history
is harness.policies.history, shared with the replay)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import InputError

# The engines whose memory semantics the simulator models (harness.model.engines): llama.cpp's
# slots (or a plain token pool), and vLLM's and SGLang's paged prefix caches.
from harness.model.engines import BLOCK_SIZE as BLOCK_SIZE
from harness.model.engines import ENGINES as ENGINES
from harness.model.engines import LLAMACPP as LLAMACPP
from harness.model.engines import PREFIX_CACHE_ENGINES
from harness.model.iteration import (
    BATCH_TOKENS,
    NOISE_DRAWS,
    IterationCosts,
    MeasuredRates,
    fit_costs,
)
from harness.policies import check_slot_model_action
from harness.policies.base import (
    KEEP,
    KEEP_EVICTABLE,
    SWAP,
    Decision,
    PauseContext,
    PausePolicy,
    ServerRates,
)
from harness.policies.builtin import Keep, KeepEvictable, Recompute, Swap
from harness.policies.history import History as History  # re-exported for the engine

# records: pause_decision `a` % 8 (3: a ttl, whose detail text says what follows it)
ACTION_CODE = {KEEP: 0, SWAP: 1, "recompute": 2, KEEP_EVICTABLE: 4}
DROP = ACTION_CODE["recompute"]
EVICTABLE = ACTION_CODE[KEEP_EVICTABLE]


@dataclass(frozen=True)
class ServerModel:
    """Calibrated rates the simulated server runs at (iteration costs fitted from them)."""

    prefill_tok_s: float
    decode_tok_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    kv_bytes_per_token: float
    prefill_points: tuple[tuple[int, float], ...] = ()
    decode_points: tuple[tuple[int, float], ...] = ()
    append_points: tuple[tuple[int, float], ...] = ()
    batch_tokens: int = BATCH_TOKENS
    long_append_points: tuple[tuple[int, float], ...] = ()
    wake: tuple[float, float] | None = None  # the first iteration after idle: (s, tau s)
    # the same measured at several idle times: (idle s, extra s), ascending (empty: none): what
    # the server's prompt time grows by
    wake_curve: tuple[tuple[float, float], ...] = ()
    # ... and what a request's way there and back grows by after the same idle times (the
    # front end, the client: outside the engine's iterations, so it holds back no other call)
    way_wake_curve: tuple[tuple[float, float], ...] = ()
    # the server's own spread: measured times over their median, ascending (empty: none)
    noise_samples: tuple[float, ...] = ()
    request_overhead_s: float = 0.0  # a call's way to the engine (HTTP, API server, hand-over)
    # its distribution: measured overheads to draw from (empty: the constant for every call)
    request_overhead_samples_s: tuple[float, ...] = ()
    # The server's front end (API server, tokenizer manager): each arriving request's turn in
    # it, one request at a time, first come first served (0: none, requests in parallel)...
    front_end_s: float = 0.0
    # ... the CPU a request's front-end work (its arrival and its answer) takes from the
    # engine's compute, where they share processors (0: none, as on a GPU with its own cores)
    front_end_cpu_s: float = 0.0
    # ... and per token a streaming call is sent, taken from the engine's compute the same way
    stream_token_s: float = 0.0
    # tokens an iteration computes within its fixed cost (a GPU's roofline ridge; 0: none)
    free_tokens: int = 0

    def iteration_costs(self) -> IterationCosts:
        """What an iteration costs (harness.model.iteration), fitted to these rates."""
        return fit_costs(MeasuredRates(self.prefill_tok_s, self.decode_tok_s,
                                       self.prefill_points, self.decode_points,
                                       self.append_points, self.long_append_points),
                         self.batch_tokens, self.wake, self.wake_curve, self.free_tokens)

    def noise_draws(self, seed: int, server: int = 0) -> list[float]:
        """Factors on each iteration's time (NOISE_DRAWS of them, used in turn), drawn
        uniformly from `noise_samples` by a generator seeded by `seed` and the server's index
        in a fleet; empty without samples (every iteration as the model prices it)."""
        if not self.noise_samples:
            return []
        rng = np.random.default_rng([seed, 0x0E4D, 2, server])
        return [float(v) for v in rng.choice(np.asarray(self.noise_samples, dtype=float),
                                             NOISE_DRAWS)]

    def front_end(self) -> tuple[float, float, float]:
        """A request's turn in the front end, and the engine's compute its front-end work
        takes at its arrival (within that turn) and at its answer, in s."""
        arrive = min(self.front_end_s, self.front_end_cpu_s)
        return self.front_end_s, arrive, self.front_end_cpu_s - arrive

    def overhead_draws(self, n: int, seed: int, stream: int = 0) -> list[float]:
        """Each of `n` steps' request overhead (s), drawn uniformly from the samples by a
        generator seeded by `seed` (the same draws for every policy of a seed; `stream` > 0:
        another sequence, e.g. the control requests'); empty when there are no samples (every
        call takes `request_overhead_s`)."""
        samples = self.request_overhead_samples_s
        if not samples:
            return []
        rng = np.random.default_rng([seed, 0x0E4D, stream] if stream else [seed, 0x0E4D])
        return [float(v) for v in rng.choice(np.asarray(samples, dtype=float), n)]

    def policy_rates(self) -> ServerRates:
        """The rates a policy prices with (restore at swap-in bandwidth), as the replay's."""
        return ServerRates(self.prefill_tok_s, self.swap_in_bytes_per_s, self.kv_bytes_per_token)


@dataclass(frozen=True)
class Capacity:
    """KV capacity: `tokens` (a token pool) or `slots` x `ctx_per_slot` (llama.cpp's slots).

    `engine`: whose memory semantics apply. llamacpp: a slot, or a pool reservation, is freed
    when a pause drops it and nothing stays cached. vllm and sglang: a token pool in blocks of
    `block_size` tokens with a prefix cache of what no call or pin holds (evictable, least
    recently freed first; harness.simulate.block_cache), and a host tier of `host_tokens` for
    swap (None: unbounded)."""

    tokens: int | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    engine: str = LLAMACPP
    block_size: int = 1
    host_tokens: int | None = None

    @property
    def prefix_cache(self) -> bool:
        """An engine with an evictable prefix cache (vLLM, SGLang)."""
        return self.engine in PREFIX_CACHE_ENGINES

    @property
    def slot_mode(self) -> bool:
        return self.slots is not None

    @property
    def units(self) -> int:
        """Slots in slot mode, tokens otherwise."""
        return int(self.slots if self.slots is not None else self.tokens or 0)

    @property
    def context_limit(self) -> int:
        """The longest context one trajectory may hold."""
        return int((self.ctx_per_slot if self.slots is not None else self.tokens) or 0)


@dataclass
class Counters:
    """What the event loop counted."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    pauses: int = 0
    preemptions: int = 0  # paused contexts preempted (an idle server without a timeout)
    preempted_calls: int = 0  # running calls preempted for memory (vLLM's engine model)
    control_requests: int = 0  # pause controls and releases sent as requests (vLLM's)
    events: int = 0
    sim_time_s: float = 0.0
    stalled: int = 0  # trajectories that started and were still waiting when nothing was left
    evicted_tokens: int = 0  # a prefix cache: tokens evicted to make room
    swaps_refused: int = 0  # offloads refused because the host tier was full (kept pinned)
    pins_released: int = 0  # pinned paused contexts released by the valve (harness.simulate.valve)
    late: int = 0  # pinned to a replay: its tool ends and starts the simulation reached later
    late_s: float = 0.0  # by how much, in all
    late_max_s: float = 0.0  # and at most


_FIELDS = tuple(f.name for f in dataclasses.fields(PauseContext))


def context_factory() -> Callable[..., PauseContext]:
    """Build PauseContexts from positional field values, skipping the frozen-dataclass __init__.

    The result equals `PauseContext(*values)` field for field (tests check it); the shortcut is
    used only while PauseContext is a plain frozen dataclass without __slots__ or __post_init__.
    """
    plain = (not hasattr(PauseContext, "__slots__")
             and not hasattr(PauseContext, "__post_init__"))
    if not plain:
        return PauseContext
    new = object.__new__
    names = _FIELDS

    def make(*values: Any) -> PauseContext:
        ctx = new(PauseContext)
        ctx.__dict__.update(zip(names, values, strict=False))
        return ctx

    return make


def resolve(d: Decision, texts: dict[str, int], text: Callable[[str], int],
            prefix_cache: bool = False
            ) -> tuple[float | None, str | None, str, int, int, float]:
    """A decision as the loop records it: (ttl, after, action, action code + 8 x detail text,
    reason text, predicted wait or NaN); `texts` caches `text` (RecordSink.text) by reason.
    `prefix_cache`: the engine has one (keep-evictable is an action there, nowhere else)."""
    ttl, action, reason = d.ttl_s, d.action, d.reason
    ri = texts.get(reason)
    if ri is None:
        ri = texts[reason] = text(reason)
    for a in (action, d.after) if d.after is not None else (action,):
        if a not in ACTION_CODE or (a == KEEP_EVICTABLE and not prefix_cache):
            check_slot_model_action(a, "simulate --engine llamacpp")
            raise InputError(f"simulate: a policy decided {a!r}, which is no pause action")
    code = ACTION_CODE[action] if ttl is None else 3 + 8 * text(f"ttl_s={ttl} after={d.after}")
    wait = d.predicted_wait_s
    return ttl, d.after, action, code, ri, float("nan") if wait is None else wait


FixedDecision = tuple[bool, int, int, int, float]  # fixed?, action, code, reason text, wait


def fixed_decision(policy: PausePolicy, run_id: str, texts: dict[str, int],
                   text: Callable[[str], int], prefix_cache: bool) -> FixedDecision:
    """Keep, keep-evictable, swap and recompute decide the same at every pause: their decision,
    asked once, so that the loop skips building a context; (False, 0, 0, 0, NaN) for any other
    policy."""
    if type(policy) not in (Keep, KeepEvictable, Swap, Recompute):
        return False, 0, 0, 0, float("nan")
    _, _, action, code, reason, wait = resolve(
        policy.decide(PauseContext(run_id, "", "", None, 0, True, "")), texts, text,
        prefix_cache)
    return True, ACTION_CODE[action], code, reason, wait
