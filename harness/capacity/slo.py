"""Service-level objectives for a capacity search: `resume_p95=2000ms,ttft_p99=10s,success=0.99`.

An SLO is a set of terms, each a bound on one figure of a point's measurement window
(harness.metrics.window): a latency percentile at most a bound, or the task success rate at
least one. A point meets the SLO when every term holds; a term within CLOSE_MARGIN of its bound
is close (worth measuring again), as is one whose bound lies inside the figure's bootstrap
95% interval; a term with nothing to judge it on (no resumes in the window)
fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from harness.errors import InputError
from harness.metrics.outcomes import slo_pairs

# term -> (figure in window.json, percentile key or None, kind)
TERMS: dict[str, tuple[str, str | None, str]] = {
    **{f"resume_p{q}": ("resume_latency_ms", f"p{q}", "latency") for q in (50, 95, 99)},
    **{f"ttft_p{q}": ("ttft_ms", f"p{q}", "latency") for q in (50, 95, 99)},
    "success": ("success_rate", None, "fraction"),
}
CLOSE_MARGIN = 0.10  # within 10% of a bound: measure again before judging
# The harness's own resume-latency error is about a millisecond (docs/results.md): a bound
# below this cannot be decided by measurement.
MIN_LATENCY_MS = 5.0
MAX_LATENCY_MS = 86_400_000.0
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|%)?\s*$")


@dataclass(frozen=True)
class Term:
    """One bound: `name` (a TERMS key) at most `bound` (ms) for latency, at least for success."""

    name: str
    bound: float

    @property
    def kind(self) -> str:
        return TERMS[self.name][2]

    def value(self, window: dict[str, Any]) -> float | None:
        """This term's figure in a window's figures (None when it has none)."""
        key, pct, _ = TERMS[self.name]
        v = window.get(key)
        if pct is not None:
            v = (v or {}).get(pct)
        return None if v is None or not math.isfinite(float(v)) else float(v)

    def interval(self, window: dict[str, Any]) -> list[float] | None:
        """The bootstrap 95% interval of this term's figure, where the window has one."""
        key, pct, _ = TERMS[self.name]
        ci = ((window.get(key) or {}).get("ci95") or {}).get(pct) if pct else None
        if not isinstance(ci, list | tuple) or len(ci) != 2 or None in ci:
            return None
        return [float(ci[0]), float(ci[1])]

    def margin(self, value: float) -> float:
        """How far inside its bound `value` is, as a fraction of the bound (negative: broken)."""
        if self.kind == "latency":
            return (self.bound - value) / self.bound
        return (value - self.bound) / max(self.bound, 1e-9)

    def label(self) -> str:
        if self.kind == "latency":
            return f"{self.name} <= {self.bound:,.0f} ms"
        return f"{self.name} >= {self.bound:g}"


@dataclass(frozen=True)
class Slo:
    terms: tuple[Term, ...]

    def spec(self) -> str:
        """The SLO as the flag gives it (latency in ms)."""
        return ",".join(f"{t.name}={t.bound:g}ms" if t.kind == "latency" else
                        f"{t.name}={t.bound:g}" for t in self.terms)

    def judge(self, window: dict[str, Any]) -> Judgement:
        """Every term against a window's figures."""
        rows = []
        for t in self.terms:
            v = t.value(window)
            m = None if v is None else t.margin(v)
            ci = t.interval(window)
            rows.append({"term": t.name, "bound": t.bound, "value": v, "margin": m,
                         "met": m is not None and m >= 0, "ci95": ci,
                         "bound_in_ci": ci is not None and ci[0] <= t.bound <= ci[1]})
        return Judgement(tuple(rows))


@dataclass(frozen=True)
class Judgement:
    """Each term's value, margin and whether it was met."""

    rows: tuple[dict[str, Any], ...]

    @property
    def passed(self) -> bool:
        return all(r["met"] for r in self.rows)

    @property
    def close(self) -> bool:
        """Some term is too near its bound to be sure of: within CLOSE_MARGIN of it, or the
        bound inside the figure's bootstrap 95% interval (few samples)."""
        return any(r["margin"] is not None and (abs(r["margin"]) < CLOSE_MARGIN
                                                or r.get("bound_in_ci", False))
                   for r in self.rows)

    def text(self) -> str:
        """'resume_p95 1,830 ms (<= 2,000) success 1.00 (>= 0.99)'."""
        parts = []
        for r in self.rows:
            v, b = r["value"], r["bound"]
            if TERMS[r["term"]][2] == "latency":
                shown = "-" if v is None else f"{v:,.0f} ms"
                parts.append(f"{r['term']} {shown} (<= {b:,.0f})")
            else:
                shown = "-" if v is None else f"{v:.2f}"
                parts.append(f"{r['term']} {shown} (>= {b:g})")
        return " ".join(parts)


def _latency_ms(term: str, raw: str, number: float, unit: str | None) -> float:
    if unit == "%":
        raise InputError(f"--slo {term}={raw}: a latency takes ms, s or m, not %")
    ms = number * {"ms": 1.0, None: 1.0, "s": 1e3, "m": 60e3}[unit]
    if not MIN_LATENCY_MS <= ms <= MAX_LATENCY_MS:
        raise InputError(f"--slo {term}={raw}: impossible bound; a latency bound must be in "
                         f"[{MIN_LATENCY_MS:g} ms, 24 h] (below {MIN_LATENCY_MS:g} ms the "
                         "harness's own error decides it)")
    return ms


def _fraction(term: str, raw: str, number: float, unit: str | None) -> float:
    if unit not in (None, "%"):
        raise InputError(f"--slo {term}={raw}: a success rate is a fraction (0.99) or a "
                         "percentage (99%)")
    f = number / 100 if unit == "%" else number
    if not 0 < f <= 1:
        raise InputError(f"--slo {term}={raw}: impossible bound; a success rate must be in "
                         "(0, 1] (or (0%, 100%])")
    return f


def parse_slo(spec: str) -> Slo:
    """`TERM=VALUE[,TERM=VALUE...]` as an Slo; InputError (one line) for an unknown term, a
    term given twice, a value that is not a number with a unit, or an impossible bound."""
    terms: list[Term] = []
    for name, raw in slo_pairs(spec.split(","), TERMS, "term", "resume_p95=2000ms"):
        m = _VALUE.match(raw)
        if m is None:
            raise InputError(f"--slo {name}={raw!r}: not a number with a unit (e.g. 2000ms, "
                             "2s, 0.99)")
        number, unit = float(m.group(1)), m.group(2)
        parse = _latency_ms if TERMS[name][2] == "latency" else _fraction
        terms.append(Term(name, parse(name, raw, number, unit)))
    if not terms:
        raise InputError("--slo: no term given (e.g. --slo resume_p95=2000ms,success=0.99)")
    return Slo(tuple(terms))
