"""Capacity and advice as report sections: capacity.json (`harness capacity`) and advice.json
(`harness advise`) as HTML fragments.

Pure functions of the parsed JSON: any key may be missing or None (shown '-'), and every text
taken from the document is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.report import plots
from harness.report.fmt import fmt, table

REASONS = {"resolved": "resolved", "max-agents": "max agents reached",
           "budget": "time budget spent", "none-pass": "no count met the SLO",
           "in-progress": "still in progress"}
OBJECTIVES = {"capacity": "agents under the SLO", "memory-time": "paused KV memory-time",
              "goodput": "successful tasks per minute under the SLO"}
RESUME = [(f"resume {q.upper()} ms", f"resume_latency_ms.{q}", q) for q in ("p50", "p95", "p99")]
# A point's figures in its row: (column head, path in the point)
POINT_FIGURES = (*((h, path) for h, path, _ in RESUME), ("TTFT P95 ms", "ttft_ms.p95"))
# Predicted vs measured: (column head, path in predicted / measured, keys of its error)
COMPARED = (*((h, path, (f"resume_{q}",)) for h, path, q in RESUME),
            ("success", "success_rate", ("success_rate", "success")),
            ("goodput / min", "goodput_per_min", ("goodput_per_min", "goodput")),
            ("paused KV MiB (mean)", "kv_paused_mean_mib", ("kv_paused_mean_mib",)),
            ("objective", "objective", ("objective",)))
Row = tuple[float, float | None, float | None, float | None, bool]  # agents, p95, p99, goodput
Term = tuple[str, float | None, str]  # name, bound, kind ('latency' or 'fraction')


def _d(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _l(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _num(x: Any) -> float | None:
    """A finite number, else None (bools and strings are not numbers)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(float(x)) else None


def _get(d: dict[str, Any], path: str) -> Any:
    """`a.b` of nested dicts (None where any level is missing)."""
    value: Any = d
    for key in path.split("."):
        value = _d(value).get(key)
    return value


def _t(x: Any) -> str:
    """Text from the document, escaped ('-' for None or empty)."""
    return "-" if x is None or x == "" else html.escape(str(x))


def _n(x: Any) -> str:
    """A number as fmt shows it, escaped (a string in a number's place is text too)."""
    return html.escape(fmt(x))


def _pct(x: Any) -> str:
    return "-" if (v := _num(x)) is None else f"{100 * v:.1f}%"


def _yes(x: Any) -> str:
    return "yes" if x is True else "no" if x is False else "-"


def _ci(ci: Any) -> str:
    """A bootstrap interval under a cell's value, as render.py shows one ('' without one)."""
    pair = _l(ci)
    if len(pair) != 2 or any(_num(v) is None for v in pair):
        return ""
    return f"<span class='ci'>[{_n(pair[0])}, {_n(pair[1])}]</span>"


def _img(uri: str | None, alt: str) -> str:
    # render.py's _img; importing render.py would be circular once it imports this module
    return f"<img src='{uri}' alt='{html.escape(alt)}'>" if uri else ""


def _kind(term: str, kinds: dict[str, str]) -> str:
    """'latency' or 'fraction': as the doc's slo_terms say, else as the term's name says."""
    return kinds.get(term) or ("latency" if term.startswith(("resume_", "ttft_")) else "fraction")


def _terms(doc: dict[str, Any]) -> list[Term]:
    """(term, bound, kind) of each SLO term in the doc's slo_terms."""
    rows = [t for t in (_d(x) for x in _l(doc.get("slo_terms"))) if t.get("term")]
    return [(str(t["term"]), _num(t.get("bound")), str(t.get("kind") or _kind(str(t["term"]), {})))
            for t in rows]


def _bound(b: float | None, kind: str) -> str:
    """'<= 2,000' or '>= 0.99'."""
    shown = "-" if b is None else f"{b:,.0f}" if kind == "latency" else f"{b:g}"
    return ("<= " if kind == "latency" else ">= ") + shown


def _term_value(row: dict[str, Any], kind: str, bold_missed: bool = False) -> str:
    """A judgement row's value against its bound (escaped): '2,100 ms (<= 2,000)'."""
    v = _num(row.get("value"))
    shown = "-" if v is None else f"{v:,.0f} ms" if kind == "latency" else f"{v:.2f}"
    text = html.escape(f"{shown} ({_bound(_num(row.get('bound')), kind)})")
    return f"<b>{text}</b>" if bold_missed and row.get("met") is False else text


def _passed(p: dict[str, Any]) -> bool | None:
    """A point's verdict: saturated fails; else `passed`, else every term met (None: unknown)."""
    if p.get("saturated") is True:
        return False
    if isinstance(p.get("passed"), bool):
        return bool(p["passed"])
    rows = [_d(r) for r in _l(p.get("judgement"))]
    return all(r.get("met") is True for r in rows) if rows else None


def _outcome(p: dict[str, Any], kinds: dict[str, str]) -> str:
    """'met the SLO', or 'missed: ' and each term it missed with its value and bound."""
    ok = _passed(p)
    if ok is None or ok:
        return "has no verdict" if ok is None else "met the SLO"
    missed = [f"{_t(r.get('term'))} {_term_value(r, _kind(str(r.get('term')), kinds))}"
              for r in (_d(x) for x in _l(p.get("judgement"))) if r.get("met") is not True]
    missed += ["saturated"] if p.get("saturated") is True else []
    return "missed: " + ", ".join(missed) if missed else "failed"


def _confirmation(confirm: Any, kinds: dict[str, str]) -> str:
    """'re-run at 3 met the SLO; 4 did not', or what the re-runs missed; '-' without one."""
    c = _d(confirm)
    at, above = _d(c.get("at")), _d(c.get("above"))
    if not at and not above:
        ok = c.get("confirmed")
        return "-" if not isinstance(ok, bool) else "confirmed" if ok else "not confirmed"
    first = at or above
    words = [f"re-run at {_n(first.get('agents'))} {_outcome(first, kinds)}"]
    if at and above:
        n, ok, at_ok = _n(above.get("agents")), _passed(above), _passed(at)
        words.append(f"{n} has no verdict" if ok is None
                     else (f"{n} met it too" if at_ok else f"{n} met it") if ok
                     else (f"{n} did not" if at_ok else f"{n} missed too"))
    return "; ".join(words)


def _interval(pol: dict[str, Any]) -> str:
    """'3 - 3': the capacity lies in [capacity, failing_above - 1]."""
    cap, above = _num(pol.get("capacity")), _num(pol.get("failing_above"))
    if cap is None:
        return "-"
    if above is None:
        why = ("no failing count yet" if pol.get("reason") in ("budget", "in-progress")
               else "max agents reached")
        return f"&gt;= {_n(pol.get('capacity'))} ({why})"
    return f"{_n(pol.get('capacity'))} - {_n(int(above) - 1 if above.is_integer() else above - 1)}"


def _policy_row(name: str, pol: dict[str, Any], kinds: dict[str, str]) -> list[str]:
    at = _d(pol.get("at_capacity"))
    lat = _d(at.get("resume_latency_ms"))
    reason, cap = pol.get("reason"), pol.get("capacity")
    return [_t(name), "none" if _num(cap) == 0 and reason == "none-pass" else _n(cap),
            _interval(pol), "-" if reason is None else _t(REASONS.get(str(reason), reason)),
            _n(lat.get("p50")), _n(lat.get("p95")) + _ci(_d(lat.get("ci95")).get("p95")),
            _n(lat.get("p99")), _pct(at.get("success_rate")), _n(at.get("goodput_per_min")),
            _n(at.get("jobs_per_hour")), _confirmation(pol.get("confirm"), kinds)]


def _series(points: list[Any]) -> list[Row]:
    """The search points by agent count (repeats averaged); failed: any repeat failed."""
    by: dict[float, list[dict[str, Any]]] = {}
    for p in (_d(x) for x in points):
        n = _num(p.get("agents"))
        if n is not None and p.get("phase") in (None, "search"):
            by.setdefault(n, []).append(p)

    def mean(ps: list[dict[str, Any]], path: str) -> float | None:
        vs = [v for v in (_num(_get(p, path)) for p in ps) if v is not None]
        return sum(vs) / len(vs) if vs else None

    return [(n, mean(ps, "resume_latency_ms.p95"), mean(ps, "resume_latency_ms.p99"),
             mean(ps, "goodput_per_min"), any(_passed(p) is False for p in ps))
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


def _figure(policies: list[tuple[str, dict[str, Any]]], terms: list[Term]) -> str | None:
    """Resume latency P95/P99 and goodput against agents, one colour per policy."""
    series = [(name, _series(_l(pol.get("points")))) for name, pol in policies]
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


def _points_block(name: str, pol: dict[str, Any], terms: list[str],
                  kinds: dict[str, str]) -> str:
    """Every point of a policy in a collapsed table (a missed term in bold)."""
    pts = [_d(p) for p in _l(pol.get("points"))]
    rows = []
    for p in pts:
        judged = {str(r.get("term")): r for r in (_d(x) for x in _l(p.get("judgement")))}
        cells = ["-" if t not in judged else _term_value(judged[t], _kind(t, kinds), True)
                 for t in terms]
        ok = _passed(p)
        verdict = ("fail (saturated)" if p.get("saturated") is True else "-" if ok is None
                   else "pass" if ok else "fail")
        rows.append([_n(p.get("agents")), _n(p.get("repeat")), _t(p.get("phase")), verdict,
                     *cells, *(_n(_get(p, path)) for _, path in POINT_FIGURES),
                     _pct(p.get("success_rate")), _n(p.get("goodput_per_min")),
                     _n(p.get("queue_growth")), _t(p.get("dir"))])
    heads = ["agents", "repeat", "phase", "verdict", *(f"SLO: {html.escape(t)}" for t in terms),
             *(h for h, _ in POINT_FIGURES), "success", "goodput / min", "queue growth",
             "results dir"]
    return "" if not pts else (f"<details><summary>{_t(name)}: {len(pts)} "
                               f"point{'s' * (len(pts) != 1)}</summary>"
                               + table(heads, rows, 0) + "</details>")


def capacity_section(doc: dict[str, Any]) -> str:
    """The 'Capacity under the SLO' section of a capacity search's capacity.json."""
    d = _d(doc)
    head = "<h2>Capacity under the SLO</h2>"
    policies = [(str(k), _d(v)) for k, v in _d(d.get("policies")).items()]
    if not policies:
        return head + "<p class='note'>No capacity was measured (no policy searched).</p>"
    terms = _terms(d)
    kinds = {t: k for t, _, k in terms}
    slo = ", ".join(html.escape(f"{t} {_bound(b, k)}" + " ms" * (k == "latency"))
                    for t, b, k in terms) or _t(d.get("slo"))
    point = _d(d.get("point"))
    copies = f" ({_n(d['copies'])} copies)" if d.get("copies") is not None else ""
    note = (f"<p class='note'>SLO: {slo} (a count passes when every term holds). Trace "
            f"{_t(d.get('trace'))}{copies}; runtime {_t(d.get('runtime'))}; each point "
            f"{_n(point.get('duration_s'))} s, its first {_n(point.get('warmup_s'))} s dropped "
            f"as warm-up; budget {_n(d.get('budget_s'))} s, {_n(d.get('elapsed_s'))} s "
            "used.</p>")
    heads = ["policy", "capacity (agents)", "interval", "stopped", "resume P50 ms",
             "resume P95 ms", "resume P99 ms", "success", "goodput / min", "jobs / hour",
             "confirmation"]
    explain = ("<p class='note'>Capacity: the most concurrent agents meeting every term (a count "
               "fails if any of its measurements failed or saturated); interval: from it to one "
               "below the smallest failing count; brackets: bootstrap 95% CI of P95. "
               "Confirmation: the capacity and the count above it measured again.</p>")
    names = [t for t, _, _ in terms]
    names += list(dict.fromkeys(str(r["term"]) for _, pol in policies
                                for p in (_d(x) for x in _l(pol.get("points")))
                                for r in (_d(x) for x in _l(p.get("judgement")))
                                if r.get("term") is not None and str(r["term"]) not in names))
    img = _img(_figure(policies, terms), "resume latency P95 and P99, and goodput, against "
               "concurrent agents, per policy")
    return (head + note + table(heads, [_policy_row(n, p, kinds) for n, p in policies])
            + explain + img + "".join(_points_block(n, p, names, kinds) for n, p in policies))


def _recommendation(d: dict[str, Any]) -> str:
    """The banner: the recommended policy, its objective and what it rests on; the best fixed."""
    rec, fixed = _d(d.get("recommendation")), _d(d.get("best_fixed"))
    obj = _t(d.get("objective"))

    def figures(x: dict[str, Any]) -> str:
        return (f"<b>{_t(x.get('label'))}</b> ({obj} {_n(x.get('measured_objective'))} "
                f"measured, {_n(x.get('predicted_objective'))} predicted)")

    why = str(rec.get("why") or "").strip()
    why = f" {_t(why)}{'' if why.endswith(('.', '!', '?')) else '.'}" if why else ""
    text = (f"Recommendation: {figures(rec)}; it rests on {_t(rec.get('rests_on'))}.{why}"
            + (f" Best fixed policy: {figures(fixed)}." if fixed else ""))
    return f"<p class='banner'>{text}</p>" if rec else ""


def _label(c: dict[str, Any], recommended: Any = None) -> str:
    chosen = recommended is not None and c.get("label") == recommended
    return (_t(c.get("label")) + " <span class='badge'>fixed</span>" * (c.get("fixed") is True)
            + " <span class='badge'>recommended</span>" * chosen)


def _compared(c: dict[str, Any]) -> list[str]:
    """Predicted / measured of each figure, the advisor's relative error beneath."""
    pred, meas, err = _d(c.get("predicted")), _d(c.get("measured")), _d(c.get("error"))
    cells = []
    for _, path, keys in COMPARED:
        show: Callable[[Any], str] = _pct if path == "success_rate" else _n
        e = next((_num(err.get(k)) for k in keys if _num(err.get(k)) is not None), None)
        below = "" if e is None else f"<span class='ci'>error {100 * e:.1f}%</span>"
        cells.append(f"{show(_get(pred, path))} / {show(_get(meas, path))}{below}")
    return cells


def _candidate_row(c: dict[str, Any], recommended: Any) -> list[str]:
    p = _d(c.get("predicted"))
    shape = (f"{_n(c.get('kv_tokens'))} tokens" if c.get("kv_tokens") is not None
             else "-" if c.get("slots") is None and c.get("ctx_per_slot") is None
             else f"{_n(c.get('slots'))} x {_n(c.get('ctx_per_slot'))}")
    return [_n(c.get("rank")), _label(c, recommended), shape, _yes(c.get("fixed")),
            _n(p.get("capacity")), _n(p.get("agents")), _n(_get(p, "resume_latency_ms.p95")),
            _n(p.get("goodput_per_min")), _n(p.get("kv_paused_mean_mib")), _n(p.get("objective"))]


def _explain_row(x: dict[str, Any]) -> list[str]:
    acts = sorted(((str(a), n) for a, n in _d(x.get("actions")).items()),
                  key=lambda an: -(_num(an[1]) or 0.0))
    return [_t(x.get("tool_class")), _n(x.get("pauses")),
            *(_n(_get(x, f"{k}.{q}")) for k in ("wait_s", "retained_tokens")
              for q in ("p50", "p95")),
            _n(_get(x, "restore_ms.swap")), _n(_get(x, "restore_ms.recompute")),
            ", ".join(f"{html.escape(a)} {_n(n)}" for a, n in acts) or "-"]


def advice_section(doc: dict[str, Any]) -> str:
    """The 'Advice' section of `harness advise`'s advice.json."""
    d = _d(doc)
    cands = [_d(c) for c in _l(d.get("candidates"))]
    confirmed = [_d(c) for c in _l(d.get("confirmed"))]
    explain = [_d(x) for x in _l(d.get("explain"))]
    rec = _d(d.get("recommendation"))
    parts = ["<h2>Advice</h2>"]
    if not (rec or cands or confirmed or explain):
        return parts[0] + ("<p class='note'>No advice was computed (no candidate measured or "
                           "simulated).</p>")
    obj = d.get("objective")
    words = f" ({html.escape(OBJECTIVES[obj])})" if obj in OBJECTIVES else ""
    parts += [f"<p class='note'>SLO {_t(d.get('slo'))}; objective {_t(obj)}{words}; simulator "
              f"calibration {_t(d.get('calibration'))}; a prediction is confirmed when within "
              f"{_pct(d.get('tolerance'))} of the measurement.</p>", _recommendation(d)]
    if d.get("disagreement"):
        parts.append(f"<p class='banner'>{_t(d['disagreement'])}</p>")
    if confirmed:
        rows = [[_label(c), _n(c.get("agents")), *_compared(c), _yes(c.get("within_tolerance"))]
                for c in confirmed]
        parts += ["<h3>Predicted and measured</h3>",
                  table(["candidate", "agents", *(h for h, _, _ in COMPARED), "within tolerance"],
                        rows),
                  "<p class='note'>Cells: simulated / measured at the candidate's operating "
                  "point; beneath, the advisor's relative error.</p>"]
    if cands:
        order = sorted(cands, key=lambda c: (_num(c.get("rank")) is None,
                                             _num(c.get("rank")) or 0.0))
        heads = ["rank", "candidate", "server (slots x ctx, KV pool)", "fixed",
                 "predicted capacity", "operating point (agents)", "resume P95 ms", "goodput / min",
                 "paused KV MiB (mean)", "objective"]
        parts += ["<h3>Candidates (simulated)</h3>",
                  table(heads, [_candidate_row(c, rec.get("label")) for c in order], 2)]
    if explain:
        heads = ["tool class", "pauses", "wait P50 s", "wait P95 s", "retained tokens P50",
                 "retained tokens P95", "restore by swap ms", "restore by recompute ms",
                 f"actions of {_t(rec.get('label'))}"]
        parts += ["<h3>Why, per tool class</h3>", table(heads, [_explain_row(x) for x in explain]),
                  "<p class='note'>Per tool class of the trace: its pauses, how long they wait, "
                  "the context a pause retains, what restoring it costs by swap-in and by "
                  "recompute, and what the recommended policy chose to do with it.</p>"]
    return "".join(p for p in parts if p)
