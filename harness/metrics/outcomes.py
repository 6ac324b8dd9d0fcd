"""Task outcomes: trajectory success, SLO violations, goodput, and cache reuse vs intent."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.limits import MAX_SLO
from harness.metrics.frames import NS_PER_S, Frames

# SLO keys: a trajectory violates an SLO when any of its calls (or the whole) exceeds the bound.
SLO_KEYS: dict[str, str] = {
    "ttft_ms": "time to first token of every call (ms)",
    "tpot_ms": "time per output token of every call (ms)",
    "e2e_ms": "end-to-end latency of every call (ms)",
    "resume_ms": "resume latency after every tool (ms)",
    "trajectory_s": "whole trajectory, first arrival to end (s)",
}
MISMATCH_ABS_TOKENS = 16
MISMATCH_REL = 0.02
MISMATCH_LIST_CAP = 50


def slo_pairs(items: Iterable[str], known: Collection[str], noun: str = "SLO",
              example: str = "ttft_ms=500") -> list[tuple[str, str]]:
    """The one grammar of `--slo`: `KEY=VALUE` items (blank ones skipped) as (key, value text)
    pairs in order; InputError (one line, naming --slo) for an item without '=', a key not in
    `known` (called a `noun`) or a key given twice. Both SLO flags read their terms with it:
    the capacity search's (`resume_p95=2s,success=0.99`, harness.capacity.slo) and the report
    commands' repeatable bounds (`--slo ttft_ms=500`, `parse_outcome_slo`)."""
    pairs: list[tuple[str, str]] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, eq, raw = (x.strip() for x in item.partition("="))
        if not eq:
            raise InputError(f"--slo {item!r}: expected {'TERM' if noun == 'term' else 'KEY'}"
                             f"=VALUE (e.g. {example})")
        if key not in known:
            raise InputError(f"--slo: unknown {noun} {key!r}; known: {', '.join(known)}")
        if any(k == key for k, _ in pairs):
            raise InputError(f"--slo: {key} is given twice")
        pairs.append((key, raw))
    return pairs


def parse_outcome_slo(items: Iterable[str]) -> dict[str, float]:
    """('ttft_ms=500', ...) -> {'ttft_ms': 500.0}: the report commands' bounds on outcomes;
    InputError on a malformed item, an unknown key or a bound out of range."""
    out: dict[str, float] = {}
    for key, value in slo_pairs(items, SLO_KEYS):
        try:
            out[key] = float(value)
        except ValueError:
            raise InputError(f"--slo {key}={value!r}: {value!r} is not a number") from None
    return check_slo(out)


def check_slo(slo: dict[str, float] | None) -> dict[str, float]:
    """The SLO bounds as floats; InputError on an unknown key or a bound that is not a number
    in (0, MAX_SLO]."""
    out: dict[str, float] = {}
    for key, value in (slo or {}).items():
        if key not in SLO_KEYS:
            raise InputError(f"unknown SLO {key!r}; known: {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise InputError(f"SLO {key!r} must be a number, got {value!r}") from None
        if not 0 < out[key] <= MAX_SLO:
            raise InputError(f"SLO {key!r} must be > 0 and <= {MAX_SLO:g}, got {value!r}")
    return out


def slo_violators(frames: Frames, slo: dict[str, float]) -> pd.Index:
    """Trajectory codes (index of frames.trajectories) that break any SLO bound."""
    calls = frames.calls[~frames.calls["bystander"]]
    bad = pd.Series(False, index=frames.trajectories.index)
    for key, bound in slo.items():
        if key == "trajectory_s":
            traj = frames.trajectories
            dur = (traj["end_ns"] - traj["start_ns"]) / NS_PER_S
            bad |= (dur > bound).fillna(False)
            continue
        worst = calls[key].groupby(calls["_code"]).max()
        over = worst[worst > bound].index
        bad |= bad.index.isin(over)
    return bad[bad].index


def _own_success(frames: Frames, slo: dict[str, float]) -> pd.DataFrame:
    """Agent trajectories (sub-agents included) with `completed`, `violating` and `ok` (completed
    within every SLO), and `root`: the code of the root trajectory each one belongs to."""
    traj = frames.trajectories[~frames.trajectories["bystander"]]
    completed = (traj["status"].astype(object) == "completed").to_numpy()
    violating = traj.index.isin(slo_violators(frames, slo)) & completed
    out = pd.DataFrame({"completed": completed, "violating": violating,
                        "ok": completed & ~violating}, index=traj.index)
    out["root"] = family_roots(traj)
    out["is_root"] = out.index.to_numpy() == out["root"].to_numpy()
    return out


def family_roots(traj: pd.DataFrame) -> list[int]:
    """For each trajectory (rows of Frames.trajectories), the code of the root trajectory of
    its task: its parent's root, up the chain of `parent_tid`, where a chain broken by a
    parent never seen stops."""
    parent = (traj["parent_tid"].astype(object) if "parent_tid" in traj.columns
              else pd.Series(None, index=traj.index, dtype=object))
    code_of: dict[str, int] = {}
    for c, t in zip(traj.index.to_numpy(dtype=np.int64), traj["tid"].astype(object),
                    strict=True):
        code_of.setdefault(str(t), int(c))
    up = {int(c): code_of[p] for c, p in zip(traj.index.to_numpy(dtype=np.int64),
                                              parent.to_numpy(), strict=True)
          if isinstance(p, str) and p in code_of}
    roots = []
    for c in traj.index:
        r, seen = int(c), set()
        while r in up and r not in seen:  # a broken chain stops where it breaks
            seen.add(r)
            r = up[r]
        roots.append(r)
    return roots


def trajectory_outcomes(frames: Frames, slo: dict[str, float]) -> dict[str, Any]:
    """Task counts over root trajectories: total, succeeded, cancelled, failed, interrupted,
    slo_violating, incomplete; and, when sub-agents ran, `subagents` with the same counts
    over them.

    succeeded = completed within every SLO, with every sub-agent under it succeeded;
    slo_violating = completed but it or a sub-agent broke an SLO; incomplete = no
    trajectory_end recorded. A root that completed while a sub-agent failed is neither:
    it counts as `subagent_failed`.
    """
    traj = frames.trajectories[~frames.trajectories["bystander"]]
    own = _own_success(frames, slo)
    family_ok = own["ok"].groupby(own["root"]).all()
    family_violating = own["violating"].groupby(own["root"]).any()
    family_done = own["completed"].groupby(own["root"]).all()

    def counts(rows: pd.DataFrame, root_level: bool) -> dict[str, Any]:
        status = traj["status"].astype(object).reindex(rows.index)
        completed = (status == "completed").to_numpy()
        if root_level:
            ok = family_ok.reindex(rows.index).fillna(False).to_numpy(dtype=bool)
            violating = completed & family_violating.reindex(rows.index).fillna(
                False).to_numpy(dtype=bool) & family_done.reindex(rows.index).fillna(
                False).to_numpy(dtype=bool)
        else:
            ok = rows["ok"].to_numpy(dtype=bool)
            violating = rows["violating"].to_numpy(dtype=bool)
        out: dict[str, Any] = {
            "total": int(len(rows)),
            "succeeded": int(ok.sum()),
            "cancelled": int((status == "cancelled").sum()),
            "failed": int((status == "failed").sum()),
            "interrupted": int((status == "interrupted").sum()),
            "slo_violating": int(violating.sum()),
            "incomplete": int(status.isna().sum()),
        }
        if root_level and (~own["is_root"]).any():
            out["subagent_failed"] = int((completed & ~ok & ~violating).sum())
        return out

    result = counts(own[own["is_root"]], True)
    children = own[~own["is_root"]]
    if len(children):
        result["subagents"] = counts(children, False)
    return result


def goodput_per_min(succeeded: int, duration_s: float) -> float | None:
    """Successful trajectories per minute of run time; None for a zero-length run."""
    return succeeded / (duration_s / 60.0) if duration_s > 0 else None


def judge_resumes(
    frames: Frames,
    abs_tokens: int = MISMATCH_ABS_TOKENS,
    rel: float = MISMATCH_REL,
    reuses_output: bool = True,
) -> pd.DataFrame:
    """Every resumed call with a server-reported cached count, judged against its pause's
    decision: `expected` is "reuse" (keep, swap, ttl kept or swapped out), "none" (recompute,
    ttl erased without a swap-out) or "either" (keep-evictable: the engine may evict it), and
    `reused` whether the server reused the retained tokens (cached >= retained - tol).

    Retained tokens are those the resumed prompt keeps (when it keeps only part); without
    `reuses_output` (a server that caches prompt blocks only) less what the call before the
    pause generated. tol = max(abs_tokens, rel x retained). A decision recorded unsupported
    is judged as keep (nothing was done)."""
    p = frames.pauses
    judged = p[p["resume_cached_tokens"].notna() & p["action"].notna()]
    action = judged["action"].astype(object)
    if "decision_status" in judged.columns:
        # an action the runtime could not do was not done: the context stayed, as if kept
        unsupported = judged["decision_status"].astype(object) == "unsupported"
        action = action.where(~unsupported, "keep")
    retained = judged["retained_tokens"].fillna(0.0)
    if "resume_reusable_tokens" in judged.columns:
        # a call that keeps only part of its context can reuse only that part
        retained = retained.clip(upper=judged["resume_reusable_tokens"].fillna(retained))
    if not reuses_output:
        retained = (retained - _output_before(frames.calls, judged)).clip(lower=0.0)
    cached = judged["resume_cached_tokens"]
    tol = np.maximum(float(abs_tokens), rel * retained)
    discarded = judged["erased"].astype(bool) & (judged["swap_in_bytes"] <= 0)
    expect_reuse = action.isin(["keep", "swap"]) | ((action == "ttl") & ~discarded)
    expect_none = (action == "recompute") | ((action == "ttl") & discarded)
    reused = cached >= retained - tol
    honoured = (expect_reuse & reused) | (expect_none & (cached <= tol))
    return pd.DataFrame({
        "trajectory_id": judged["tid"].astype(object),
        "step": judged["step"],
        "action": judged["action"].astype(object),
        "wait_s": judged["wait_s"],
        "retained_tokens": judged["retained_tokens"],
        "cached_tokens": cached,
        "expected": np.select([expect_reuse, expect_none], ["reuse", "none"], "either"),
        "reused": reused.to_numpy(dtype=bool),
        "honoured": honoured.to_numpy(dtype=bool),
    }, index=judged.index)


def cache_mismatches(
    frames: Frames,
    abs_tokens: int = MISMATCH_ABS_TOKENS,
    rel: float = MISMATCH_REL,
    reuses_output: bool = True,
) -> pd.DataFrame:
    """Resumed calls whose server-reported cached tokens contradict the pause decision
    (`judge_resumes`): a kept or swapped context not reused, a recomputed one reused.
    keep-evictable is never a mismatch: the engine may evict it."""
    return mismatches_of(judge_resumes(frames, abs_tokens, rel, reuses_output))


def mismatches_of(judged: pd.DataFrame) -> pd.DataFrame:
    """The mismatches among calls `judge_resumes` judged."""
    out = judged[(judged["expected"] != "either") & ~judged["honoured"]]
    return pd.DataFrame({
        "trajectory_id": out["trajectory_id"],
        "step": out["step"],
        "action": out["action"],
        "retained_tokens": out["retained_tokens"],
        "cached_tokens": out["cached_tokens"],
        "expected": np.where(out["expected"] == "reuse", "reuse", "recompute"),
    })


def _output_before(calls: pd.DataFrame, pauses: pd.DataFrame) -> pd.Series:
    """The tokens the call before each pause (its step - 1) generated; 0 where unknown."""
    agent = calls[~calls["bystander"]].dropna(subset=["step", "output_tokens"])
    lookup = {(str(t), int(s)): float(v) for t, s, v in zip(
        agent["tid"].astype(object), agent["step"], agent["output_tokens"], strict=True)}
    values = [lookup.get((str(t), int(s) - 1), 0.0) if s == s else 0.0
              for t, s in zip(pauses["tid"].astype(object), pauses["step"], strict=True)]
    return pd.Series(values, index=pauses.index, dtype="float64")


def mismatch_list(mismatches: pd.DataFrame, cap: int = MISMATCH_LIST_CAP) -> list[dict[str, Any]]:
    """The first `cap` mismatches as JSON-ready dicts."""
    rows = []
    for r in mismatches.head(cap).to_dict("records"):
        rows.append({
            "trajectory_id": str(r["trajectory_id"]),
            "step": _int_or_none(r["step"]),
            "action": str(r["action"]),
            "retained_tokens": _int_or_none(r["retained_tokens"]),
            "cached_tokens": _int_or_none(r["cached_tokens"]),
            "expected": str(r["expected"]),
        })
    return rows


def _int_or_none(value: Any) -> int | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(f) else int(f)


def trajectory_units(frames: Frames, slo: dict[str, float]) -> pd.DataFrame:
    """One row per task (a root trajectory with its sub-agents; the bootstrap's unit):
    `success` (1.0 when it and every sub-agent completed within every SLO) and
    `paused_token_s` (the device KV they held while paused)."""
    own = _own_success(frames, slo)
    kv = frames.kv
    if len(kv):
        paused = kv[kv["status"].astype(object) == "paused"]
        tok_s = (paused["kv_tokens"] * paused["dt_ns"] / NS_PER_S).groupby(paused["_code"]).sum()
    else:
        tok_s = pd.Series(dtype="float64")
    per_traj = tok_s.reindex(own.index).fillna(0.0)
    roots = own[own["is_root"]].index
    family_ok = own["ok"].groupby(own["root"]).all().reindex(roots).fillna(False)
    family_tok = per_traj.groupby(own["root"]).sum().reindex(roots).fillna(0.0)
    return pd.DataFrame({"success": family_ok.to_numpy(dtype="float64"),
                         "paused_token_s": family_tok.to_numpy(dtype="float64")}, index=roots)
