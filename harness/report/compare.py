"""Compare two runs metric by metric with a noise-aware verdict (asv-style).

For latency distributions the verdict needs both: the bootstrap 95% CI of the ratio of quantiles
NEW/BASE excludes 1 (significant), and the ratio is beyond the threshold in the bad (regressed) or
good (improved) direction. Success rate, goodput and memory-time are judged the same way with
a bootstrap over trajectories (their per-trajectory success and paused memory); bytes moved
and tokens recomputed, which have no such units, by the threshold alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.metrics.bootstrap import mean_ratio_ci, ratio_ci, sorted_finite
from harness.metrics.jobs import jct_samples
from harness.metrics.latency import resume_samples
from harness.metrics.outcomes import trajectory_units
from harness.metrics.registry import HEADLINE
from harness.report.comparable import check_comparable
from harness.report.data import RunData, load_run
from harness.report.fmt import fmt

REGRESSED, IMPROVED, SAME, NA = "regressed", "improved", "same", "n/a"
DEFAULT_THRESHOLD = 1.10


def run_samples(run: RunData) -> dict[str, np.ndarray]:
    """The samples behind the distribution metrics: per agent call, and per completed job."""
    calls = run.frames.calls
    agent = calls[~calls["bystander"]]
    return {"resume": resume_samples(calls), "ttft": agent["ttft_ms"].dropna().to_numpy(),
            "e2e": agent["e2e_ms"].dropna().to_numpy(), "jct": jct_samples(run.frames)}


def run_units(run: RunData) -> pd.DataFrame:
    """Per-trajectory success and paused memory (the units success, goodput and memory-time
    are bootstrapped over), judged with the SLO the run's summary used."""
    return trajectory_units(run.frames, run.summary.get("slo") or {})


def scalar_verdict(
    base: float | None, new: float | None, threshold: float, bigger_is_better: bool = False
) -> tuple[float | None, str]:
    """(NEW/BASE, verdict) by the threshold alone; a zero base compares by sign of the change."""
    if base is None or new is None:
        return None, NA
    if base == 0:
        if new == 0:
            return None, SAME
        worse = (new < 0) if bigger_is_better else (new > 0)
        return None, REGRESSED if worse else IMPROVED
    ratio = float(new) / float(base)
    bad, good = (ratio < 1 / threshold, ratio > threshold) if bigger_is_better else \
        (ratio > threshold, ratio < 1 / threshold)
    return ratio, REGRESSED if bad else IMPROVED if good else SAME


def unit_verdict(
    base_units: np.ndarray, new_units: np.ndarray, base: float | None, new: float | None,
    threshold: float, bigger_is_better: bool, seed: int = 0, n_resamples: int = 1000,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """(NEW/BASE, its bootstrap 95% CI over trajectories, verdict) of a metric that is a mean
    or sum of per-trajectory values (success, paused memory): a change counts when the CI
    excludes 1 and the ratio is beyond the threshold; threshold only where no CI exists."""
    mb = float(np.mean(base_units)) if len(base_units) else 0.0
    mn = float(np.mean(new_units)) if len(new_units) else 0.0
    if base is None or new is None or not base or not mb or not mn:
        ratio, verdict = scalar_verdict(base, new, threshold, bigger_is_better)
        return ratio, None, verdict
    ratio = float(new) / float(base)
    # the metric's ratio is the ratio of unit means times this (unit counts, durations, units)
    ci = mean_ratio_ci(base_units, new_units, ratio / (mn / mb), n_resamples=n_resamples,
                       seed=seed)
    if ci is None:
        ratio_only, verdict = scalar_verdict(base, new, threshold, bigger_is_better)
        return ratio_only, None, verdict
    up = ci[0] > 1.0 and ratio > threshold
    down = ci[1] < 1.0 and ratio < 1.0 / threshold
    if bigger_is_better:
        return ratio, ci, REGRESSED if down else IMPROVED if up else SAME
    return ratio, ci, REGRESSED if up else IMPROVED if down else SAME


def mean_verdict(
    base: np.ndarray, new: np.ndarray, threshold: float, seed: int = 0, n_resamples: int = 1000,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """(ratio of means NEW/BASE, its bootstrap 95% CI, verdict); smaller is better."""
    return _sample_verdict(base, new, None, threshold, seed, n_resamples)


def sample_verdict(
    base: np.ndarray, new: np.ndarray, q: float | None, threshold: float, seed: int = 0,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """quantile_verdict at percentile q, or mean_verdict when q is None."""
    return _sample_verdict(base, new, q, threshold, seed)


def quantile_verdict(
    base: np.ndarray, new: np.ndarray, q: float, threshold: float, seed: int = 0,
    n_resamples: int = 1000,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """(ratio of percentiles NEW/BASE, its bootstrap 95% CI, verdict); smaller is better."""
    return _sample_verdict(base, new, q, threshold, seed, n_resamples)


def _sample_verdict(
    base: np.ndarray, new: np.ndarray, q: float | None, threshold: float, seed: int,
    n_resamples: int = 1000,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """The ratio NEW/BASE of the samples' percentile q (their mean when q is None), its
    bootstrap 95% CI and the verdict: a change counts when the CI excludes 1 and the ratio
    is beyond the threshold; threshold only without a CI (too few samples, a zero base)."""
    xb, xn = sorted_finite(base), sorted_finite(new)
    if xb.size == 0 or xn.size == 0:
        return None, None, NA
    if q is None:
        vb, vn = float(xb.mean()), float(xn.mean())
        ci = mean_ratio_ci(xb, xn, n_resamples=n_resamples, seed=seed)
    else:
        vb, vn = float(np.percentile(xb, q)), float(np.percentile(xn, q))
        ci = ratio_ci(xb, xn, q, n_resamples=n_resamples, seed=seed)
    if ci is None:
        ratio, verdict = scalar_verdict(vb, vn, threshold)
        return ratio, None, verdict
    ratio = vn / vb
    if ci[0] > 1.0 and ratio > threshold:
        return ratio, ci, REGRESSED
    if ci[1] < 1.0 and ratio < 1.0 / threshold:
        return ratio, ci, IMPROVED
    return ratio, ci, SAME


def compare_runs(
    base: RunData, new: RunData, threshold: float = DEFAULT_THRESHOLD, seed: int = 0
) -> dict[str, Any]:
    """{'metrics': [{name, unit, base, new, ratio, ci95, verdict}], 'regressed', 'improved'}."""
    sb, sn = run_samples(base), run_samples(new)
    ub, un = run_units(base), run_units(new)
    rows = []
    for m in HEADLINE:
        vb, vn = m.value(base.summary), m.value(new.summary)
        if m.optional and vb is None and vn is None:
            continue  # neither run measures it
        ci: tuple[float, float] | None = None
        if m.sample is not None:
            ratio, ci, verdict = sample_verdict(sb[m.sample], sn[m.sample], m.q, threshold,
                                                seed)
        elif m.units is not None:
            ratio, ci, verdict = unit_verdict(ub[m.units].to_numpy(), un[m.units].to_numpy(),
                                              vb, vn, threshold, m.bigger_is_better, seed)
        else:
            ratio, verdict = scalar_verdict(vb, vn, threshold, m.bigger_is_better)
        rows.append({"name": m.name, "unit": m.unit, "base": vb, "new": vn, "ratio": ratio,
                     "ci95": list(ci) if ci else None, "verdict": verdict})
    return {
        "base": str(base.path), "new": str(new.path), "threshold": threshold,
        "metrics": rows,
        # the harness's own lag (how late it woke to tool ends), beside the resume figures:
        # not judged, it is the instrument's and not the server's
        "client_lag_ms_p99": {"base": _lag_p99(base), "new": _lag_p99(new)},
        "regressed": any(r["verdict"] == REGRESSED for r in rows),
        "improved": any(r["verdict"] == IMPROVED for r in rows),
    }


def _lag_p99(run: RunData) -> float | None:
    v = (run.summary["client_lag_ms"] or {}).get("p99")
    return None if v is None else float(v)


def compare_dirs(
    base: Path, new: Path, threshold: float = DEFAULT_THRESHOLD,
    slo: dict[str, float] | None = None, seed: int = 0, allow: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """compare_runs() of two results directories, refused (InputError) when they differ in an
    aspect `allow` does not name, or when either is unusable; the differences that stand are
    in the result's `differences`."""
    rb, rn = load_run(base, slo), load_run(new, slo)
    diffs = check_comparable(rb.run, rn.run, allow, f"{base} and {new}")
    result = compare_runs(rb, rn, threshold, seed)
    result["differences"] = [{"aspect": d.aspect, "base": d.base, "new": d.new,
                              "checked": not d.unknown} for d in diffs]
    return result


def format_text(result: dict[str, Any]) -> str:
    """A fixed-width table of the comparison and a final verdict line."""
    lines = [f"base: {result['base']}", f"new:  {result['new']}"]
    for d in result.get("differences", []):
        how = "allowed" if d["checked"] else "not checked (not recorded by one run)"
        lines.append(f"differs, {how}: {d['aspect']}: {d['base'] or '-'} vs {d['new'] or '-'}")
    # as wide as the longest name shown (the hint outcomes' are longer than the rest)
    w = max([24, *(len(r["name"]) for r in result["metrics"])])
    lines += [f"{'metric':<{w}} {'base':>12} {'new':>12} {'ratio':>8}  {'95% CI':<15} verdict"]
    for r in result["metrics"]:
        ci = f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" if r["ci95"] else ""
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        lines.append(f"{r['name']:<{w}} {fmt(r['base']):>12} {fmt(r['new']):>12} {ratio:>8}  "
                     f"{ci:<15} {r['verdict']}")
        if r["name"] == "resume_latency_ms.p99" and (lag := result.get("client_lag_ms_p99")):
            lines.append(f"{'client_lag_ms.p99':<{w}} {fmt(lag['base']):>12} "
                         f"{fmt(lag['new']):>12} {'-':>8}  {'':<15} not judged (the "
                         f"harness's own lag)")
    bad = [r["name"] for r in result["metrics"] if r["verdict"] == REGRESSED]
    lines.append(f"REGRESSED: {', '.join(bad)}" if bad else
                 f"no regression beyond x{result['threshold']:g}")
    return "\n".join(lines)
