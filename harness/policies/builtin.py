"""The built-in pause policies: keep, keep-evictable, swap, recompute, ttl, continuum, threshold,
min-waste, oracle."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.errors import InputError
from harness.policies.base import (
    KEEP,
    KEEP_EVICTABLE,
    RECOMPUTE,
    SWAP,
    Decision,
    PauseContext,
    PausePolicy,
    ServerRates,
    program_order,
)

# Used to price actions before the run has measured anything (llama.cpp on a 2-core CPU with a
# ~135M model: ~240 prefill tok/s, slot restore ~5 GB/s, ~23 KB of KV per token).
FALLBACK_RATES = ServerRates(prefill_tok_s=240.0, swap_bytes_per_s=5e9, kv_bytes_per_token=23e3)


# What a TTL may do with a context still paused at its expiry: offload it, drop it, or unpin it
# and leave it to the engine's prefix cache (reused if nothing evicted it by the resume).
TTL_AFTER = (SWAP, RECOMPUTE, KEEP_EVICTABLE)


def _rates(ctx: PauseContext) -> ServerRates:
    return ctx.rates or FALLBACK_RATES


def _quantile(history: Sequence[float], q: float, min_n: int, default: float) -> float:
    if len(history) < min_n:
        return default
    fast = getattr(history, "linear_quantile", None)  # the simulator's sorted window
    if fast is not None:
        return float(fast(q))
    return float(np.quantile(np.asarray(history, dtype=float), q))


@dataclass
class Keep:
    """Keep (pin) the KV cache through the pause: instant resume, memory held throughout."""

    name: str = "keep"
    sees_true_latency: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        return Decision(KEEP, "keep policy: KV stays resident through every pause")


@dataclass
class KeepEvictable:
    """Leave the KV to the engine's own prefix cache through the pause: reused on resume if
    nothing evicted it meanwhile (vLLM's and SGLang's default), never pinned."""

    name: str = "keep-evictable"
    sees_true_latency: bool = False
    holds: bool = False  # its calls need not be held: nothing of it is ever pinned

    def decide(self, ctx: PauseContext) -> Decision:
        return Decision(KEEP_EVICTABLE, "keep-evictable policy: the engine's cache decides")


@dataclass
class Swap:
    """Swap the KV cache to host storage at the pause and restore it on resume."""

    name: str = "swap"
    sees_true_latency: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        return Decision(SWAP, "swap policy: KV moved off the device at every pause")


@dataclass
class Recompute:
    """Discard the KV cache at the pause and re-prefill the whole context on resume."""

    name: str = "recompute"
    sees_true_latency: bool = False
    holds: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        return Decision(RECOMPUTE, "recompute policy: KV discarded at every pause")


@dataclass
class Ttl:
    """Keep for a time-to-live, then swap, discard or leave it to the engine's cache (`after`).

    With a fixed `tau` every pause gets it; otherwise tau is the `quantile` of this tool class's
    latencies observed so far in the run (`default_tau` until `min_history` samples exist).
    """

    tau: float | None = None
    quantile: float = 0.9
    after: str = SWAP
    min_history: int = 5
    default_tau: float = 2.0
    name: str = "ttl"
    sees_true_latency: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        if self.tau is not None:
            tau, why = self.tau, f"fixed tau={self.tau:g}s"
        else:
            tau = _quantile(ctx.history_s, self.quantile, self.min_history, self.default_tau)
            why = (f"tau=P{100 * self.quantile:g} of {len(ctx.history_s)} observed "
                   f"{ctx.tool_class} latencies" if len(ctx.history_s) >= self.min_history
                   else f"default tau={self.default_tau:g}s (too little history)")
        return Decision(KEEP, f"ttl: keep for {tau:.3g}s then {self.after} ({why})",
                        predicted_wait_s=None, ttl_s=tau, after=self.after)


def _cdf_argmax(history: Sequence[float], benefit: float) -> tuple[float, float]:
    """(tau, P(tau)) maximising P(tau) x benefit - tau over tau = 0 and every observed
    latency, P the observed latencies' empirical CDF; the smallest such tau on a tie."""
    ordered = getattr(history, "sorted", None)  # History keeps its values sorted
    xs = np.asarray(ordered if ordered is not None else np.sort(np.asarray(history, float)),
                    dtype=float)
    xs = xs[np.isfinite(xs)]
    n = xs.size
    if not n:
        return 0.0, 0.0
    best_tau, best_p = 0.0, float(np.searchsorted(xs, 0.0, side="right")) / n
    p = np.searchsorted(xs, xs, side="right") / n  # P(T <= x) at every observed x
    gain = p * benefit - xs
    i = int(np.argmax(gain))
    if gain[i] > best_p * benefit:
        best_tau, best_p = float(xs[i]), float(p[i])
    return best_tau, best_p


@dataclass
class Continuum:
    """Continuum's time-to-live per tool call (Li et al., arXiv 2511.02230, later CacheTTL):
    pin the paused context for tau*, then leave it to the engine (`after`).

    tau* = argmax over tau of P(tau) x (T x eta + reload) - tau, where P is the empirical
    CDF of this tool class's observed latencies, tau runs over 0 and every observed latency,
    T is the run's recent queueing delay of calls whose context was not held
    (`PauseContext.queue_delay_s`, 0 until measured, as the paper starts it), `reload` the
    time to bring the context back (its re-prefill at the measured rate; its restore when
    `after` is swap) and `eta` the workload's memoryfulness factor (-corr(k, N - k) over
    programs' served and remaining requests; 1 by default, the paper's cold-start value).
    The paper's memory cost (the context's share of memory x tau) divides out of the argmax;
    memory pressure enters through T. With fewer than `min_history` observations of the class
    (the paper's K = 100) the tool's latency is taken as Exp(1) s, which gives
    tau* = ln(benefit) for a benefit above 1 s, else 0. tau* = 0 applies `after` at once.

    Its scheduler's program-level first-come-first-served order (`program_order`: pinned
    calls first, then by their task's arrival) runs where the runtime schedules by a call's
    priority (vLLM under --scheduling-policy priority, which also preempts the latest task's
    call first; the engine model). Left out: the paper falls back on the CDF of all tools
    before a class has K samples (the policy sees one class's history). Its unpinning of the
    latest program's pins when nothing else fits is the engine's, not the policy's: the
    pin-release valve (`--pin-release latest-program`, the default) of the project's vLLM
    connector and of a local SGLang server (the engine model has none yet: its pins give way by
    preemption).
    """

    eta: float = 1.0
    min_history: int = 100
    after: str = KEEP_EVICTABLE
    name: str = "continuum"
    sees_true_latency: bool = False
    program_order: bool = True  # its scheduler's program-level FCFS, where the runtime can

    def decide(self, ctx: PauseContext) -> Decision:
        rates = _rates(ctx)
        reload = (rates.restore_s(ctx.retained_tokens) if self.after == SWAP
                  else rates.recompute_s(ctx.retained_tokens))
        queue = ctx.queue_delay_s or 0.0
        benefit = queue * self.eta + reload
        n = len(ctx.history_s)
        if n >= self.min_history:
            tau, p = _cdf_argmax(ctx.history_s, benefit)
            why = f"P(T<={tau:.3g}s)={p:.2f} over {n} observed {ctx.tool_class} latencies"
        else:
            tau = math.log(benefit) if benefit > 1.0 else 0.0
            why = f"cold start ({n} < {self.min_history} observed): T ~ Exp(1 s)"
        detail = (f"benefit {benefit:.3g}s = queue {queue:.3g}s x eta {self.eta:g} + reload "
                  f"{reload:.3g}s; {why}")
        if tau <= 0.0:
            return Decision(self.after, f"continuum: tau*=0, {self.after} at once ({detail})")
        return Decision(KEEP, f"continuum: keep for {tau:.3g}s then {self.after} ({detail})",
                        ttl_s=tau, after=self.after)


@dataclass
class Threshold:
    """Rule-based choice from the predicted wait, free slots and the cost of each restore path."""

    keep_max_s: float = 0.5
    min_free_fraction: float = 0.25
    cheap_tokens: int = 256
    quantile: float = 0.5
    min_history: int = 3
    default_wait_s: float = 1.0
    name: str = "threshold"
    sees_true_latency: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        rates = _rates(ctx)
        wait = _quantile(ctx.history_s, self.quantile, self.min_history, self.default_wait_s)
        free = ctx.free_slots / max(ctx.total_slots, 1)
        restore = rates.restore_s(ctx.retained_tokens)
        recompute = rates.recompute_s(ctx.retained_tokens)
        if wait <= self.keep_max_s and free >= self.min_free_fraction:
            return Decision(KEEP, f"short predicted wait {wait:.3g}s and {free:.0%} slots free",
                            wait)
        if ctx.retained_tokens <= self.cheap_tokens or recompute <= restore:
            return Decision(RECOMPUTE, f"cheap to re-prefill: {ctx.retained_tokens} tokens in "
                                       f"{recompute:.3g}s (restore {restore:.3g}s)", wait)
        if wait > restore:
            return Decision(SWAP, f"predicted wait {wait:.3g}s exceeds restore {restore:.3g}s",
                            wait)
        return Decision(KEEP, f"predicted wait {wait:.3g}s below restore {restore:.3g}s", wait)


def _least_waste(wait: float, tokens: int, rates: ServerRates) -> tuple[str, str]:
    # Memory waste in token-seconds (InferCept): preserving holds the context for the whole
    # wait; discarding holds it while it is re-prefilled; swapping holds it for both transfers.
    waste = {
        KEEP: wait * tokens,
        RECOMPUTE: rates.recompute_s(tokens) * tokens,
        SWAP: 2 * rates.restore_s(tokens) * tokens,
    }
    best = min(waste, key=lambda k: (waste[k], k))
    detail = ", ".join(f"{k}={v:.3g}" for k, v in waste.items())
    return best, f"least memory waste (token*s: {detail})"


@dataclass
class MinWaste:
    """InferCept's min-waste: the action wasting the least memory, from the mean observed wait."""

    min_history: int = 3
    default_wait_s: float = 1.0
    name: str = "min-waste"
    sees_true_latency: bool = False

    def decide(self, ctx: PauseContext) -> Decision:
        h = ctx.history_s
        wait = float(np.mean(h)) if len(h) >= self.min_history else self.default_wait_s
        action, why = _least_waste(wait, ctx.retained_tokens, _rates(ctx))
        return Decision(action, f"predicted wait {wait:.3g}s; {why}", wait)


@dataclass
class Oracle:
    """Knows each pause's true length and picks the least-waste action for it: the best any
    policy could do pause by pause on wasted KV time, not a bound on every metric (keeping can
    still win on resume latency, and freeing early on memory-time)."""

    name: str = "oracle"
    sees_true_latency: bool = True

    def decide(self, ctx: PauseContext) -> Decision:
        if ctx.true_latency_s is None:
            return Decision(RECOMPUTE, "oracle: the tool never returns, free the KV at once")
        action, why = _least_waste(ctx.true_latency_s, ctx.retained_tokens, _rates(ctx))
        return Decision(action, f"oracle (true wait {ctx.true_latency_s:.3g}s); {why}",
                        ctx.true_latency_s)


def _float(args: dict[str, str], key: str, positive: bool = True) -> float:
    try:
        v = float(args[key])
    except ValueError:
        raise InputError(f"--policy-arg {key}={args[key]!r}: not a number") from None
    if not np.isfinite(v) or (positive and v <= 0) or v < 0:
        raise InputError(f"--policy-arg {key}={args[key]!r}: must be a finite number > 0")
    return v


def _build(cls: Callable[..., PausePolicy], allowed: dict[str, str],
           args: dict[str, str], policy: str) -> PausePolicy:
    kwargs: dict[str, object] = {}
    for k in args:
        if k not in allowed:
            raise InputError(f"policy {policy!r} takes no argument {k!r}"
                             + (f"; it takes {', '.join(sorted(allowed))}" if allowed else ""))
        kind = allowed[k]
        if kind == "after":
            if args[k] not in TTL_AFTER:
                raise InputError(f"--policy-arg after={args[k]!r}: must be one of "
                                 f"{', '.join(TTL_AFTER)}")
            kwargs[k] = args[k]
        elif kind == "fraction":
            v = _float(args, k)
            if v > 1:
                raise InputError(f"--policy-arg {k}={args[k]!r}: must be in (0, 1]")
            kwargs[k] = v
        elif kind == "bool":
            if args[k].lower() not in ("0", "1", "true", "false"):
                raise InputError(f"--policy-arg {k}={args[k]!r}: must be 0, 1, true or false")
            kwargs[k] = args[k].lower() in ("1", "true")
        elif kind == "int":
            v = _float(args, k)
            if v != int(v) or v > 1_000_000:
                raise InputError(f"--policy-arg {k}={args[k]!r}: must be a whole number in "
                                 "[1, 1000000]")  # 2.7 was silently read as 2
            kwargs[k] = int(v)
        else:
            kwargs[k] = _float(args, k)
    return cls(**kwargs)


POLICIES: dict[str, tuple[Callable[..., PausePolicy], dict[str, str]]] = {
    "keep": (Keep, {}),
    "keep-evictable": (KeepEvictable, {}),
    "swap": (Swap, {}),
    "recompute": (Recompute, {}),
    "ttl": (Ttl, {"tau": "float", "quantile": "fraction", "after": "after",
                  "min_history": "int", "default_tau": "float"}),
    "continuum": (Continuum, {"eta": "float", "min_history": "int", "after": "after",
                              "program_order": "bool"}),
    "threshold": (Threshold, {"keep_max_s": "float", "min_free_fraction": "fraction",
                              "cheap_tokens": "int", "quantile": "fraction",
                              "default_wait_s": "float"}),
    "min-waste": (MinWaste, {"default_wait_s": "float", "min_history": "int"}),
    "oracle": (Oracle, {}),
}


def wants_program_order(name: object, args: object = None) -> bool:
    """Whether the built-in policy `name` with `--policy-arg` values `args` (a run.json's
    `policy` and `policy_args`) asks for program order (base.program_order); False for
    anything that names no policy it could have run."""
    if not isinstance(name, str) or name not in POLICIES:
        return False
    given = args if isinstance(args, dict) else {}
    try:
        return program_order(make_policy(name, {str(k): str(v) for k, v in given.items()}))
    except InputError:
        return False


def parse_policy_args(pairs: tuple[str, ...], flag: str = "--policy-arg") -> dict[str, str]:
    """`KEY=VALUE` flag values as a dict; InputError naming `flag` for one without `=` or a
    key given twice (the last would silently win, as no other repeated flag does)."""
    out: dict[str, str] = {}
    for p in pairs:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise InputError(f"{flag} {p!r}: expected KEY=VALUE")
        k, v = p.split("=", 1)
        if k.strip() in out:
            raise InputError(f"{flag} {k.strip()}: given twice ({k.strip()}={out[k.strip()]} "
                             f"and {k.strip()}={v.strip()}); give each key once")
        out[k.strip()] = v.strip()
    return out


def make_policy(name: str, args: dict[str, str] | None = None) -> PausePolicy:
    """A built-in policy by name with `--policy-arg` values; InputError for anything unknown."""
    if name not in POLICIES:
        raise InputError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
    cls, allowed = POLICIES[name]
    return _build(cls, allowed, dict(args or {}), name)


# The policies the slot model (the analytical model, the simulator) can price: it models slots
# and a host tier, not an engine's evictable prefix cache, so keep-evictable runs only live.
# continuum leaves a context to that cache at its TTL's expiry unless told otherwise (after=).
SLOT_MODEL_POLICIES: tuple[str, ...] = tuple(p for p in POLICIES
                                             if p not in ("keep-evictable", "continuum"))


def check_slot_model_action(action: str, where: str) -> None:
    """InputError when a decision's action is one the slot model cannot price."""
    if action == KEEP_EVICTABLE:
        raise InputError(f"{where}: keep-evictable is an engine's evictable prefix cache, which "
                         "the slot model does not model; simulate it with --engine vllm or sglang, "
                         "or run it against a live server")
