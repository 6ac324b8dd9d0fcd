"""A capacity search as a report section: capacity.json (`harness capacity`) as an HTML
fragment, and the cells the advice's section (harness.advise.view) shares with it.

Pure functions of the typed result (harness.capacity.result): any field may be missing or None
(shown '-'), and every text taken from the document is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.capacity.result import (
    CapacityPoint,
    CapacityResult,
    Confirmation,
    JudgedTerm,
    PointLength,
    PolicyResult,
)
from harness.metrics.summary_types import Quantiles
from harness.report import plots
from harness.report.fmt import fmt, table

REASONS = {"resolved": "resolved", "max-agents": "max agents reached",
           "budget": "time budget spent", "none-pass": "no count met the SLO",
           "in-progress": "still in progress"}
RESUME = [(f"resume {q.upper()} ms", q) for q in ("p50", "p95", "p99")]


def resume_at(p: CapacityPoint, q: str) -> float | None:
    """The point's resume latency percentile `q` (p50, p95, p99)."""
    return (p.resume_latency_ms or Quantiles()).at(q)


# A point's figures in its row: (column head, the figure of the point)
POINT_FIGURES: tuple[tuple[str, Callable[[CapacityPoint], Any]], ...] = (
    *((h, lambda p, q=q: resume_at(p, q)) for h, q in RESUME),
    ("TTFT P95 ms", lambda p: (p.ttft_ms or Quantiles()).p95))
Row = tuple[float, float | None, float | None, float | None, bool]  # agents, p95, p99, goodput
Term = tuple[str, float | None, str]  # name, bound, kind ('latency' or 'fraction')


def finite(x: Any) -> float | None:
    """A finite number, else None (bools and strings are not numbers)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(float(x)) else None


def esc(x: Any) -> str:
    """Text from the document, escaped ('-' for None or empty)."""
    return "-" if x is None or x == "" else html.escape(str(x))


def esc_num(x: Any) -> str:
    """A number as fmt shows it, escaped (a string in a number's place is text too)."""
    return html.escape(fmt(x))


def percent(x: Any) -> str:
    """A fraction as a percentage ('-' for no number)."""
    return "-" if (v := finite(x)) is None else f"{100 * v:.1f}%"


def yes_no(x: Any) -> str:
    """'yes', 'no', or '-' for anything but a boolean."""
    return "yes" if x is True else "no" if x is False else "-"


def _ci(ci: Any) -> str:
    """A bootstrap interval under a cell's value, as render.py shows one ('' without one)."""
    pair = ci if isinstance(ci, list) else []
    if len(pair) != 2 or any(finite(v) is None for v in pair):
        return ""
    return f"<span class='ci'>[{esc_num(pair[0])}, {esc_num(pair[1])}]</span>"


def _img(uri: str | None, alt: str) -> str:
    # render.py's _img; importing render.py would be circular once it imports this module
    return f"<img src='{uri}' alt='{html.escape(alt)}'>" if uri else ""


def _kind(term: str, kinds: dict[str, str]) -> str:
    """'latency' or 'fraction': as the doc's slo_terms say, else as the term's name says."""
    return kinds.get(term) or ("latency" if term.startswith(("resume_", "ttft_")) else "fraction")


def _terms(result: CapacityResult) -> list[Term]:
    """(term, bound, kind) of each SLO term in the result's slo_terms."""
    return [(t.term, finite(t.bound), t.kind or _kind(t.term, {}))
            for t in result.slo_terms or [] if t.term]


def _bound(b: float | None, kind: str) -> str:
    """'<= 2,000' or '>= 0.99'."""
    shown = "-" if b is None else f"{b:,.0f}" if kind == "latency" else f"{b:g}"
    return ("<= " if kind == "latency" else ">= ") + shown


def _term_value(row: JudgedTerm, kind: str, bold_missed: bool = False) -> str:
    """A judgement row's value against its bound (escaped): '2,100 ms (<= 2,000)'."""
    v = finite(row.value)
    shown = "-" if v is None else f"{v:,.0f} ms" if kind == "latency" else f"{v:.2f}"
    text = html.escape(f"{shown} ({_bound(finite(row.bound), kind)})")
    return f"<b>{text}</b>" if bold_missed and row.met is False else text


def _outcome(p: CapacityPoint, kinds: dict[str, str]) -> str:
    """'met the SLO', or 'missed: ' and each term it missed with its value and bound."""
    ok = p.verdict()
    if ok is None or ok:
        return "has no verdict" if ok is None else "met the SLO"
    missed = [f"{esc(r.term)} {_term_value(r, _kind(str(r.term), kinds))}"
              for r in p.terms() if r.met is not True]
    missed += ["saturated"] if p.saturated is True else []
    return "missed: " + ", ".join(missed) if missed else "failed"


def _given(p: CapacityPoint | None) -> CapacityPoint | None:
    """The point, unless it is missing or has nothing in it."""
    return p if p is not None and p.to_json() else None


def _confirmation(c: Confirmation | None, kinds: dict[str, str]) -> str:
    """'re-run at 3 met the SLO; 4 did not', or what the re-runs missed; '-' without one."""
    c = c or Confirmation()
    at, above = _given(c.at), _given(c.above)
    if at is None and above is None:
        ok = c.confirmed
        return "-" if ok is None else "confirmed" if ok else "not confirmed"
    first = at or above
    assert first is not None
    words = [f"re-run at {esc_num(first.agents)} {_outcome(first, kinds)}"]
    if at is not None and above is not None:
        n, ok, at_ok = esc_num(above.agents), above.verdict(), at.verdict()
        words.append(f"{n} has no verdict" if ok is None
                     else (f"{n} met it too" if at_ok else f"{n} met it") if ok
                     else (f"{n} did not" if at_ok else f"{n} missed too"))
    return "; ".join(words)


def _interval(pol: PolicyResult) -> str:
    """'3 - 3': the capacity lies in [capacity, failing_above - 1]."""
    cap, above = finite(pol.capacity), finite(pol.failing_above)
    if cap is None:
        return "-"
    if above is None:
        why = ("no failing count yet" if pol.reason in ("budget", "in-progress")
               else "max agents reached")
        return f"&gt;= {esc_num(pol.capacity)} ({why})"
    top = int(above) - 1 if above.is_integer() else above - 1
    return f"{esc_num(pol.capacity)} - {esc_num(top)}"


def _policy_row(name: str, pol: PolicyResult, kinds: dict[str, str]) -> list[str]:
    at = pol.at_capacity or CapacityPoint()
    lat = at.resume_latency_ms or Quantiles()
    reason, cap = pol.reason, pol.capacity
    return [esc(name), "none" if finite(cap) == 0 and reason == "none-pass" else esc_num(cap),
            _interval(pol), "-" if reason is None else esc(REASONS.get(reason, reason)),
            esc_num(lat.p50), esc_num(lat.p95) + _ci(lat.ci_at("p95")),
            esc_num(lat.p99), percent(at.success_rate), esc_num(at.goodput_per_min),
            esc_num(at.jobs_per_hour), _confirmation(pol.confirm, kinds)]


def _series(points: list[CapacityPoint]) -> list[Row]:
    """The search points by agent count (repeats averaged); failed: any repeat failed."""
    by: dict[float, list[CapacityPoint]] = {}
    for p in points:
        n = finite(p.agents)
        if n is not None and p.phase in (None, "search"):
            by.setdefault(n, []).append(p)

    def mean(ps: list[CapacityPoint], figure: Callable[[CapacityPoint], Any]) -> float | None:
        vs = [v for v in (finite(figure(p)) for p in ps) if v is not None]
        return sum(vs) / len(vs) if vs else None

    return [(n, mean(ps, lambda p: resume_at(p, "p95")), mean(ps, lambda p: resume_at(p, "p99")),
             mean(ps, lambda p: p.goodput_per_min), any(p.verdict() is False for p in ps))
            for n, ps in sorted(by.items())]


def _draw(ax: Axes, rows: list[Row], k: int, colour: str, ls: str, label: str,
          marker: bool) -> None:
    """One policy's figure `k` of each row against agents (failed counts as 'x')."""
    got = [(r[0], v, r[4]) for r in rows if isinstance(v := r[k], float)]
    if not got:
        return
    ax.plot([g[0] for g in got], [g[1] for g in got], color=colour, ls=ls, lw=1.6,
            label=label.replace("$", r"\$"))  # '$' would start mathtext
    for failed, mk in ((False, "o"), (True, "x")):
        sel = [g for g in got if g[2] is failed]
        if sel and (failed or marker):
            ax.scatter([g[0] for g in sel], [g[1] for g in sel], marker=mk, s=40 if failed else 22,
                       color=colour, zorder=3)


def _figure(policies: list[tuple[str, PolicyResult]], terms: list[Term]) -> str | None:
    """Resume latency P95/P99 and goodput against agents, one colour per policy."""
    series = [(name, _series(pol.measured())) for name, pol in policies]
    if all(v is None for _, rows in series for r in rows for v in r[1:4]):
        return None
    fig = Figure(figsize=(11, 4.2))
    lat, put = fig.subplots(1, 2)
    for i, (name, rows) in enumerate(series):
        c = plots.color(i)
        _draw(lat, rows, 1, c, "-", f"{name} P95", True)
        _draw(lat, rows, 2, c, "--", f"{name} P99", False)
        _draw(put, rows, 3, c, "-", name, True)
    for term, bound, kind in terms:
        if kind == "latency" and term.startswith("resume_") and bound is not None:
            lat.axhline(bound, color="#555", lw=1.0, ls=":")
            lat.text(0.01, bound, f"SLO {term} {bound:,.0f} ms".replace("$", r"\$"),
                     va="bottom", fontsize=8, color="#555", transform=lat.get_yaxis_transform())
    if any(r[4] for _, rows in series for r in rows):
        lat.plot([], [], "x", color="#444", label="x: count failed")
    lat.set_ylabel("resume latency (ms)")
    put.set_ylabel("goodput (successful tasks / min)")
    for ax in (lat, put):
        ax.set_xlabel("concurrent agents")
        ax.set_ylim(bottom=0.0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, frameon=False)
        plots.style_axes(ax)
    return plots.to_data_uri(fig)


def _points_block(name: str, pol: PolicyResult, terms: list[str],
                  kinds: dict[str, str]) -> str:
    """Every point of a policy in a collapsed table (a missed term in bold)."""
    pts = pol.measured()
    rows = []
    for p in pts:
        judged = {str(r.term): r for r in p.terms()}
        cells = ["-" if t not in judged else _term_value(judged[t], _kind(t, kinds), True)
                 for t in terms]
        ok = p.verdict()
        verdict = ("fail (saturated)" if p.saturated is True else "-" if ok is None
                   else "pass" if ok else "fail")
        rows.append([esc_num(p.agents), esc_num(p.repeat), esc(p.phase), verdict,
                     *cells, *(esc_num(figure(p)) for _, figure in POINT_FIGURES),
                     percent(p.success_rate), esc_num(p.goodput_per_min),
                     esc_num(p.queue_growth), esc(p.dir)])
    heads = ["agents", "repeat", "phase", "verdict", *(f"SLO: {html.escape(t)}" for t in terms),
             *(h for h, _ in POINT_FIGURES), "success", "goodput / min", "queue growth",
             "results dir"]
    return "" if not pts else (f"<details><summary>{esc(name)}: {len(pts)} "
                               f"point{'s' * (len(pts) != 1)}</summary>"
                               + table(heads, rows, 0) + "</details>")


def capacity_section(result: CapacityResult) -> str:
    """The 'Capacity under the SLO' section of a capacity search's result (capacity.json)."""
    head = "<h2>Capacity under the SLO</h2>"
    policies = result.searched()
    if not policies:
        return head + "<p class='note'>No capacity was measured (no policy searched).</p>"
    terms = _terms(result)
    kinds = {t: k for t, _, k in terms}
    slo = ", ".join(html.escape(f"{t} {_bound(b, k)}" + " ms" * (k == "latency"))
                    for t, b, k in terms) or esc(result.slo)
    point = result.point or PointLength()
    copies = result.extra.get("copies")  # an older search's trace copies
    copies = f" ({esc_num(copies)} copies)" if copies is not None else ""
    note = (f"<p class='note'>SLO: {slo} (a count passes when every term holds). Trace "
            f"{esc(result.trace)}{copies}; runtime {esc(result.runtime)}; each point "
            f"{esc_num(point.duration_s)} s, its first {esc_num(point.warmup_s)} s dropped "
            f"as warm-up; budget {esc_num(result.budget_s)} s, {esc_num(result.elapsed_s)} s "
            "used.</p>")
    heads = ["policy", "capacity (agents)", "interval", "stopped", "resume P50 ms",
             "resume P95 ms", "resume P99 ms", "success", "goodput / min", "jobs / hour",
             "confirmation"]
    explain = ("<p class='note'>Capacity: the most concurrent agents meeting every term (a count "
               "fails if any of its measurements failed or saturated); interval: from it to one "
               "below the smallest failing count; brackets: bootstrap 95% CI of P95. "
               "Confirmation: the capacity and the count above it measured again.</p>")
    names = [t for t, _, _ in terms]
    names += list(dict.fromkeys(r.term for _, pol in policies for p in pol.measured()
                                for r in p.terms()
                                if r.term is not None and r.term not in names))
    img = _img(_figure(policies, terms), "resume latency P95 and P99, and goodput, against "
               "concurrent agents, per policy")
    return (head + note + table(heads, [_policy_row(n, p, kinds) for n, p in policies])
            + explain + img + "".join(_points_block(n, p, names, kinds) for n, p in policies))
