"""The analytical model: first-order cost of one paused request under each pause policy.

For a pause of `p` seconds over `T` retained tokens, with cache C = T x bytes per token:

- keep: resume 0; device memory-time C x p; nothing moved or recomputed.
- swap: swap-out starts at the pause and overlaps the wait; the device copy is held until it
  finishes (C x min(p, C / out-bandwidth)); resume = swap-in = C / in-bandwidth, plus whatever of
  the swap-out is still running when the tool returns; 2 C bytes moved.
- recompute: the cache is dropped at once; resume = T / prefill rate; T tokens recomputed.
- ttl(tau): keep for min(p, tau); past tau, swap or recompute (`after`) the remaining wait.
- threshold, min-waste, oracle: whatever action the harness policy object picks, priced as above.
  The model never lets a policy see the pauses it prices (no history): threshold and min-waste use
  their default predicted wait (or the one given); the oracle alone sees the true wait.

A pause that never resumes (the tool never returns, it returns after its deadline, or nothing
follows it) is priced until it ends (the deadline for a cancelled one): memory-time and swap-out
count, swap-in, recompute and resume latency do not. Every decision comes from harness.policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.model.calibration import prefill_rate_at
from harness.policies import check_slot_model_action
from harness.policies.base import KEEP, RECOMPUTE, SWAP, PauseContext, PausePolicy, ServerRates
from harness.traces.stats import quantiles

MIB = 1 << 20
GIB = 1 << 30
_CODES = {KEEP: 0, SWAP: 1, RECOMPUTE: 2}


@dataclass(frozen=True)
class Rates:
    """Transfer bandwidths (bytes/s) and prefill rate (tokens/s); optionally by context length."""

    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    prefill_tok_s: float
    prefill_points: tuple[tuple[int, float], ...] = ()
    source: str = "flags"

    def validate(self) -> Rates:
        for key in ("swap_out_bytes_per_s", "swap_in_bytes_per_s", "prefill_tok_s"):
            v = getattr(self, key)
            if not np.isfinite(v) or v <= 0:
                raise InputError(f"{key} must be finite and > 0, got {v!r}")
        return self

    def server_rates(self, kv_bytes_per_token: float) -> ServerRates:
        """What a policy prices its options with (restore = swap-in bandwidth)."""
        return ServerRates(self.prefill_tok_s, self.swap_in_bytes_per_s, kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        return {
            "swap_out_bytes_per_s": self.swap_out_bytes_per_s,
            "swap_in_bytes_per_s": self.swap_in_bytes_per_s,
            "swap_out_gib_s": self.swap_out_bytes_per_s / GIB,
            "swap_in_gib_s": self.swap_in_bytes_per_s / GIB,
            "prefill_tok_s": self.prefill_tok_s,
            "prefill_points": [list(p) for p in self.prefill_points],
            "source": self.source,
        }


@dataclass(frozen=True)
class Pauses:
    """The pauses to price, as columns: retained tokens, the wait priced, whether it resumes."""

    tokens: np.ndarray
    pause_s: np.ndarray
    resumes: np.ndarray
    tool_class: Sequence[str]
    deadline_s: np.ndarray
    trajectory_id: Sequence[str] = field(default_factory=tuple)

    def __len__(self) -> int:
        return int(self.tokens.size)

    @classmethod
    def uniform(cls, tokens: int, pauses_s: Sequence[float]) -> Pauses:
        """`len(pauses_s)` pauses of `tokens` tokens each, all resuming."""
        n = len(pauses_s)
        return cls(np.full(n, tokens, dtype=np.int64), np.asarray(pauses_s, dtype=float),
                   np.ones(n, dtype=bool), ("remote_read",) * n, np.full(n, np.nan))

    def validate(self) -> Pauses:
        if len(self) == 0:
            raise InputError("empty workload: no pauses to price")
        if (self.tokens <= 0).any():
            raise InputError("retained tokens must be > 0 at every pause")
        if (~np.isfinite(self.pause_s) | (self.pause_s < 0)).any():
            raise InputError("pause lengths must be finite and >= 0")
        return self


@dataclass(frozen=True)
class Costs:
    """Per-pause costs of one policy (arrays aligned with the pauses; resume NaN = no resume)."""

    action: list[str]
    reason: list[str]
    resume_ms: np.ndarray
    mib_s: np.ndarray
    bytes_moved: np.ndarray
    tokens_recomputed: np.ndarray

    def totals(self) -> dict[str, Any]:
        """Totals and P50/P95/P99 of every cost over the pauses."""
        out: dict[str, Any] = {}
        for key in ("resume_ms", "mib_s", "bytes_moved", "tokens_recomputed"):
            arr = getattr(self, key)
            q = quantiles(arr)
            finite = arr[np.isfinite(arr)]
            total = finite.sum() if finite.size else 0
            q["total"] = _num(total)
            q["mean"] = _num(finite.mean()) if finite.size else None
            out[key] = {k: _num(v) for k, v in q.items()}
        out["mib_moved"] = _num(float(self.bytes_moved.sum()) / MIB)
        out["actions"] = {a: self.action.count(a) for a in sorted(set(self.action))}
        return out


def _num(v: Any) -> Any:
    """Plain JSON numbers: integers stay integers, floats are rounded to 1e-9."""
    if v is None:
        return None
    if isinstance(v, int | np.integer):
        return int(v)
    return round(float(v), 9)


def decide_all(policy: PausePolicy, pauses: Pauses, rates: ServerRates,
               free_fraction: float = 1.0) -> list[Any]:
    """Each pause's Decision from the policy, seeing what a server could know (no history)."""
    total = 1000
    free = int(round(free_fraction * total))
    oracle = policy.sees_true_latency
    out = []
    for i in range(len(pauses)):
        resumes = bool(pauses.resumes[i])
        dl = float(pauses.deadline_s[i])
        ctx = PauseContext(
            run_id="model", trajectory_id=(pauses.trajectory_id[i] if pauses.trajectory_id
                                           else f"pause-{i}"),
            tool_class=pauses.tool_class[i], deadline_ms=None if np.isnan(dl) else dl * 1000,
            retained_tokens=int(pauses.tokens[i]), resume_required=resumes,
            priority="interactive", history_s=(), free_slots=free, total_slots=total,
            rates=rates,
            true_latency_s=float(pauses.pause_s[i]) if oracle and resumes else None)
        out.append(policy.decide(ctx))
    return out


def price(decisions: Sequence[Any], pauses: Pauses, kv_bytes_per_token: float,
          rates: Rates) -> Costs:
    """Price each pause under its decision (vectorised over the pauses)."""
    n = len(pauses)
    tokens = pauses.tokens.astype(np.int64)
    p = pauses.pause_s.astype(float)
    resumes = pauses.resumes.astype(bool)
    is_ttl = np.array([d.ttl_s is not None for d in decisions], dtype=bool)
    tau = np.array([d.ttl_s if d.ttl_s is not None else np.inf for d in decisions], dtype=float)
    for d in decisions:
        check_slot_model_action(d.action, "the model")
        if d.after is not None:
            check_slot_model_action(d.after, "the model (a TTL's expiry)")
    first = np.array([_CODES[d.action] for d in decisions], dtype=np.int8)
    after = np.array([_CODES.get(d.after or "", -1) for d in decisions], dtype=np.int8)
    # Held on the device from the pause: the whole wait (keep) or until tau (ttl).
    expired = is_ttl & (p > tau)
    held = np.where(is_ttl, np.minimum(p, tau), np.where(first == 0, p, 0.0))
    evict = np.where(is_ttl, np.where(expired, after, -1), np.where(first == 0, -1, first))
    remaining = np.where(is_ttl, np.maximum(p - tau, 0.0), p)  # wait left when eviction starts
    cache = tokens.astype(float) * kv_bytes_per_token
    swap_out_s = cache / rates.swap_out_bytes_per_s
    swap_in_ms = cache * 1000 / rates.swap_in_bytes_per_s
    prefill = prefill_rate_at(rates.prefill_points, rates.prefill_tok_s, tokens.astype(float))
    recompute_ms = tokens * 1000 / prefill
    swapped = evict == 1
    held = held + np.where(swapped, np.minimum(remaining, swap_out_s), 0.0)
    lag_ms = np.maximum(swap_out_s - remaining, 0.0) * 1000
    resume = np.where(swapped, lag_ms + swap_in_ms, np.where(evict == 2, recompute_ms, 0.0))
    resume = np.where(resumes, resume, np.nan)
    moved = np.where(swapped, cache * np.where(resumes, 2, 1), 0.0)
    recomputed = np.where((evict == 2) & resumes, tokens, 0)
    labels = [_label(d, bool(e)) for d, e in zip(decisions, expired, strict=True)]
    if len(labels) != n:
        raise ValueError("one decision per pause")
    return Costs(labels, [d.reason for d in decisions], resume, (cache / MIB) * held,
                 np.rint(moved).astype(np.int64), recomputed.astype(np.int64))


def _label(d: Any, expired: bool) -> str:
    if d.ttl_s is None:
        return str(d.action)
    return f"keep+{d.after}" if expired else "keep"


def evaluate(policies: Mapping[str, PausePolicy], pauses: Pauses, kv_bytes_per_token: float,
             rates: Rates, free_fraction: float = 1.0) -> dict[str, Costs]:
    """Every policy's costs over the pauses."""
    pauses.validate()
    rates.validate()
    if kv_bytes_per_token <= 0 or not np.isfinite(kv_bytes_per_token):
        raise InputError(f"KV bytes per token must be > 0, got {kv_bytes_per_token!r}")
    if not policies:
        raise InputError("no policy to price")
    srates = rates.server_rates(kv_bytes_per_token)
    return {name: price(decide_all(pol, pauses, srates, free_fraction), pauses,
                        kv_bytes_per_token, rates)
            for name, pol in policies.items()}


def report(costs: Mapping[str, Costs], pauses: Pauses, geometry: Mapping[str, Any],
           rates: Rates, per_pause: bool = True) -> dict[str, Any]:
    """The JSON document `harness model --json` prints."""
    bpt = float(geometry["kv_bytes_per_token"])
    out: dict[str, Any] = {"geometry": dict(geometry), "rates": rates.to_dict(),
                           "n_pauses": len(pauses)}
    if per_pause:
        rows = []
        for i in range(len(pauses)):
            cache = int(round(int(pauses.tokens[i]) * bpt))
            pol = {}
            for name, c in costs.items():
                r = float(c.resume_ms[i])
                pol[name] = {"action": c.action[i], "reason": c.reason[i],
                             "resume_ms": None if np.isnan(r) else _num(r),
                             "mib_s": _num(c.mib_s[i]), "bytes_moved": int(c.bytes_moved[i]),
                             "mib_moved": _num(int(c.bytes_moved[i]) / MIB),
                             "tokens_recomputed": int(c.tokens_recomputed[i])}
            rows.append({"tokens": int(pauses.tokens[i]), "pause_s": _num(pauses.pause_s[i]),
                         "resumes": bool(pauses.resumes[i]), "tool_class": pauses.tool_class[i],
                         "cache_bytes": cache, "cache_mib": _num(cache / MIB), "policies": pol})
        out["pauses"] = rows
    out["totals"] = {name: c.totals() for name, c in costs.items()}
    return out


def prediction(costs: Mapping[str, Costs]) -> dict[str, Any]:
    """{policy: {resume_ms|mib_s|bytes_moved|tokens_recomputed: {n, p50, p95, p99, total, mean}}}"""
    out: dict[str, Any] = {}
    for name, c in costs.items():
        t = c.totals()
        out[name] = {k: t[k] for k in ("resume_ms", "mib_s", "bytes_moved", "tokens_recomputed")}
        out[name]["actions"] = t["actions"]
    return out
