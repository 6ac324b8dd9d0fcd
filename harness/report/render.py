"""One self-contained HTML report of one or more results directories (inline PNGs, no JS).

`render_runs(runs)` is a pure function of loaded runs; `render_report(paths)` loads them (and
rewrites each directory's summary.json) first.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from harness.metrics.latency import resume_samples
from harness.metrics.registry import Metric, metric
from harness.metrics.reuse import reuse_rows
from harness.metrics.summary_types import Summary
from harness.report import plots
from harness.report.data import RunData, load_runs
from harness.report.differences import CSS as DIFF_CSS
from harness.report.differences import differences_section
from harness.report.fidelity import fidelity_section
from harness.report.fmt import fmt, fmt_bytes, table
from harness.report.health_view import HEALTH_CSS, health_section
from harness.report.hints_view import hints_section
from harness.report.routing_view import routing_section
from harness.report.turns import turns
from harness.traces.buckets import PAUSE_BUCKETS

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;
 margin:24px auto;max-width:1320px;padding:0 16px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:32px;
 border-bottom:2px solid #e5e5e5;padding-bottom:4px} h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;margin:8px 0 4px;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f4f6f8;font-weight:600} .t{text-align:left}
tr:nth-child(even) td{background:#fafbfc}
.ci{color:#888;font-size:11px;display:block}
.note{color:#666;font-size:12px;margin:2px 0 8px}
.badge{background:#fff3cd;border:1px solid #e0c36a;border-radius:3px;padding:0 5px;
 font-size:11px;margin-left:4px}
.grid{display:flex;flex-wrap:wrap;gap:16px}
.grid>div{flex:1 1 560px;min-width:0}
img{max-width:100%;height:auto;border:1px solid #eee}
.banner{background:#fff3cd;border:1px solid #e0c36a;padding:6px 10px;border-radius:4px}
"""


def render_report(
    paths: list[Path], slo: dict[str, float] | None = None, write_summary: bool = True,
    baseline: int = 0,
) -> str:
    """Load the results directories, rewrite their summary.json, and render the HTML; the
    differences are against `paths[baseline]`."""
    return render_runs(load_runs(paths, slo, write_summary), baseline)


def render_runs(runs: list[RunData], baseline: int = 0, lead: str = "",
                title: str | None = None) -> str:
    """The HTML document for these runs (side by side when several; the others' differences
    against `runs[baseline]`). `lead`: an HTML section placed first (a capacity search's or
    an advice's), under `title`."""
    title = title or ("Tool-pause replay report" if len(runs) == 1
                      else "Tool-pause replay comparison")
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{html.escape(title)}</title><style>{CSS}{HEALTH_CSS}{DIFF_CSS}</style>"
             "</head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<p class='note'>" + html.escape(", ".join(str(r.path) for r in runs)) + "</p>"]
    if any(r.simulated for r in runs):
        parts.append("<p class='banner'>Runs marked <span class='badge'>simulated</span> come "
                     "from the simulator, not a live server.</p>")
        parts += [_calibration_note(r) for r in runs if r.simulated]
    parts += [lead, health_section(runs, _label), headline(runs),
              differences_section(runs, _label, baseline), instrument_section(runs),
              cdf_section(runs), bucket_grid(runs),
              parts_section(runs), reuse_section(runs), hints_section(runs, _label),
              routing_section(runs, _label),
              occupancy_section(runs),
              timeline_section(runs),
              tools_section(runs), by_class_section(runs), prediction_section(runs),
              fidelity_section(runs), metadata_section(runs)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def _calibration_note(r: RunData) -> str:
    """Where a simulated run's rates came from, when not from this project's own measurement:
    the calibration's sources and the fields no one measured ('' for a measured one)."""
    cal = r.run.calibration or {}
    if not cal.get("declared"):
        return ""
    declared = [f for f, e in (cal.get("provenance") or {}).items()
                if isinstance(e, dict) and e.get("status") == "declared"]
    fields = (f" Fields measured by no one: {', '.join(declared)}." if declared else "")
    return (f"<p class='note'>{_label(r)}: calibration {html.escape(str(cal.get('model')))}, "
            f"declared, not measured here ({html.escape(str(cal['declared']))}).{fields}</p>")


def _label(r: RunData) -> str:
    badge = " <span class='badge'>simulated</span>" if r.simulated else ""
    return html.escape(r.label) + badge


def _ci(ci: list[float] | None) -> str:
    """A bootstrap interval under a cell's value ('' without one)."""
    return f"<span class='ci'>[{fmt(ci[0])}, {fmt(ci[1])}]</span>" if ci else ""


# The headline table's metrics, in order (the registry's labels, units and intervals).
HEADLINE_COLUMNS = ("success_rate", "goodput_per_min", "resume_latency_ms.p50",
                    "resume_latency_ms.p95", "resume_latency_ms.p99", "ttft_ms.p50",
                    "job_completion_s.mean", "job_completion_s.p95", "makespan_s",
                    "memory_time_mib_s", "bytes_moved", "tokens_recomputed", "cache_mismatches")
_UNITLESS = ("fraction", "bytes", "tokens", "calls")
_AFTER_RESUME = HEADLINE_COLUMNS.index("resume_latency_ms.p99") + 1


def _head(m: Metric) -> str:
    return html.escape(m.label if m.unit in _UNITLESS else f"{m.label} {m.unit}")


def _cell(m: Metric, s: Summary) -> str:
    """One metric's value in a summary, as its unit shows it, with its interval if any."""
    v = m.value(s)
    if v is None:
        return "-"
    text = (f"{100 * float(v):.1f}%" if m.unit == "fraction"
            else fmt_bytes(v) if m.unit == "bytes" else fmt(v))
    if m.unit_in(s) != m.unit:
        text += f" {html.escape(m.unit_in(s))}"
    return text + _ci(m.ci(s) if m.ci else None)


def headline(runs: list[RunData]) -> str:
    """The headline table: one row per run, the registry's headline metrics."""
    cols = [metric(name) for name in HEADLINE_COLUMNS]
    heads = ["run", "succeeded / total"] + [_head(m) for m in cols]
    heads.insert(2 + _AFTER_RESUME, "client lag P99 ms")
    rows = []
    for r in runs:
        s = r.summary
        tr = s["trajectories"]
        stopped = f", {tr['interrupted']} interrupted" if tr.get("interrupted") else ""
        bad = f" ({tr['cancelled']} cancelled, {tr['failed']} failed{stopped}, " \
              f"{tr['slo_violating']} over SLO)" if tr["total"] else ""
        cells = [_cell(m, s) for m in cols]
        cells[0] += f"<span class='ci'>{html.escape(bad)}</span>"  # success: why not
        # the harness's own lag beside the resume figures: how late it woke to tool ends
        cells.insert(_AFTER_RESUME, fmt(s["client_lag_ms"]["p99"]))
        rows.append([_label(r), f"{tr['succeeded']}/{tr['total']}", *cells])
    note = ("<p class='note'>Resume latency: tool result available to the first token of the "
            "next call (tool wait excluded); brackets: bootstrap 95% CI; client lag: how late "
            "the harness itself woke to tool results, its own error beside them. Memory-time: "
            "device KV held by paused trajectories (its interval and goodput's: bootstrap over "
            "trajectories). Success: completed within deadlines and SLOs. JCT: a task (a root "
            "trajectory with its sub-agents) from its arrival to its last end, over completed "
            "tasks; makespan: first arrival to last end.</p>")
    warnings = "".join(f"<p class='note'><b>warning</b> ({html.escape(_label(r))}): "
                       f"{html.escape(w)}</p>" for r in runs for w in r.summary["warnings"])
    return ("<h2 id='headline'>Headline</h2>" + table(heads, rows) + note + workload_note(runs)
            + warnings)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def reuse_section(runs: list[RunData]) -> str:
    """Measured prefix reuse beside the trace's ideal (an infinite cache) and the run's policy's
    with unlimited memory, by the pause before each call."""
    blocks = []
    for r in runs:
        ideal = r.run.trace.ideal_reuse if r.run.trace else None
        rows = reuse_rows(r.summary.get("reuse"), ideal, r.run.policy)
        if not rows:
            continue
        blocks.append(f"<h3>{_label(r)}</h3>" + table(
            ["pause before the call", "calls", "measured (server's cached tokens)",
             "ideal (infinite cache)", f"{html.escape(str(r.run.policy))}, unlimited memory"],
            [[html.escape(x["bucket"]), fmt(x["calls"]), _pct(x["measured"]),
              _pct(x["ideal"]), _pct(x["policy_ideal"])] for x in rows], 1))
    if not blocks:
        return ""
    return ("<h2 id='reuse'>Prefix reuse vs the ideal</h2><p class='note'>Share of prompt "
            "tokens served from cache. Ideal: what the trace allows with an infinite cache "
            "(everything a call keeps of its context, and a prefix group's shared prefix after "
            "its first sender), bucketed by the trace's pause lengths; measured: bucketed by "
            "the pause as it ran (a parent's includes its sub-agents).</p>" + "".join(blocks))


def workload_note(runs: list[RunData]) -> str:
    """What the headline counts when a trace has sub-agents, and a token-scaled trace said."""
    lines = []
    for r in runs:
        scale = r.run.trace.token_scale if r.run.trace else 1.0
        if scale != 1.0:
            lines.append(f"{_label(r)}: every token count of the trace was scaled by "
                         f"{scale:g} (rounded up) to fit the model's context")
        sub = r.summary["trajectories"].get("subagents")
        if sub:
            failed = r.summary["trajectories"].get("subagent_failed", 0)
            lines.append(f"{_label(r)}: each task counts with its sub-agents (it succeeds only "
                         f"if they all do): {sub['succeeded']}/{sub['total']} sub-agents "
                         f"succeeded; {failed} task(s) completed but lost a sub-agent")
    return "".join(f"<p class='note'>{line}</p>" for line in lines)


def _err_cell(err: dict[str, Any], key: str, stat: str) -> str:
    """One signed figure of run.json's instrument_error ('-' where absent: hand-written)."""
    stats = err.get(key)
    value = stats.get(stat) if isinstance(stats, dict) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return f"{value:+.2f}" if ok else "-"


def instrument_section(runs: list[RunData]) -> str:
    """The client's own error on the machine that ran each replay (run.json
    `instrument_error`, from `harness selftest` via --selftest), or that it was not measured.
    Simulated runs have no client to err and are left out."""
    live = [r for r in runs if not r.simulated]
    if not live:
        return ""
    rows: list[list[str]] = []
    missing: list[str] = []
    for r in live:
        err = r.run.instrument_error
        if not isinstance(err, dict):
            missing.append(_label(r))
            continue
        rows.append([_label(r)] + [_err_cell(err, k, q) for k in
                                   ("ttft_ms", "resume_ms", "client_lag_ms")
                                   for q in ("mean", "p99")]
                    + [html.escape(str(err.get("measured_at") or "-")),
                       fmt(err.get("agents")), fmt(err.get("stub_ttft_ms"))])
    absent = "" if not missing else (
        "<p class='note'>" + (", ".join(missing) + ": " if rows or len(live) > 1 else "")
        + "instrument error not measured (harness selftest)</p>")
    if not rows:
        return "<h2 id='instrument'>Instrument error</h2>" + absent
    heads = ["run", "TTFT error mean", "TTFT error P99", "resume error mean",
             "resume error P99", "client lag mean", "client lag P99", "measured at", "agents",
             "stub TTFT"]
    note = ("<p class='note'>The harness's own error (ms) on the machine measured, by "
            "<code>harness selftest</code> against a server of known delays and recorded with "
            "<code>--selftest</code>: TTFT and resume latency above include about this much "
            "of the client's own time; client lag is how late it woke to tool ends.</p>")
    return "<h2 id='instrument'>Instrument error</h2>" + table(heads, rows) + note + absent


def cdf_section(runs: list[RunData]) -> str:
    img = plots.resume_cdf([(r.label, resume_samples(r.frames.calls)) for r in runs])
    body = _img(img, "resume latency CDF") if img else "<p class='note'>No resumed calls.</p>"
    return "<h2 id='cdf'>Resume latency CDF</h2>" + body


def bucket_grid(runs: list[RunData]) -> str:
    """Run x pause-length bucket grid of P95 resume latency (pauses counted)."""
    heads = ["run \\ actual tool wait"] + [b[0] for b in PAUSE_BUCKETS]
    rows = []
    for r in runs:
        cells = [_label(r)]
        for b, _, _ in PAUSE_BUCKETS:
            g = r.summary["by_pause_bucket"].get(b, {})
            q = g.get("resume_latency_ms") or {}
            n = int(g.get("pauses", 0))
            cells.append(f"{fmt(q.get('p95'))}<span class='ci'>{n} pause{'s' * (n != 1)}, "
                         f"{fmt(g.get('memory_time_mib_s'))} MiB·s</span>" if g.get("pauses")
                         else "-")
        rows.append(cells)
    return ("<h2 id='grid'>Policy x pause length: P95 resume latency (ms)</h2>"
            + table(heads, rows))


def parts_section(runs: list[RunData]) -> str:
    heads = ["run", "restore P50", "restore P95", "queue P50", "queue P95", "prefill P50",
             "prefill P95", "server wait P50", "server wait P95", "TTFT P95", "TPOT P50",
             "ITL P50", "ITL P99", "E2E P50", "bystander TTFT P50", "bystander TTFT P95",
             "client lag P50", "client lag P99"]
    rows = []
    for r in runs:
        s = r.summary
        p = s["resume_parts_ms"]
        parts = ("restore", "queue", "prefill", "server_wait")
        rows.append([_label(r)] + [fmt((p.get(k) or {}).get(q)) for k in parts
                                   for q in ("p50", "p95")]
                    + [fmt(s["ttft_ms"]["p95"]), fmt(s["tpot_ms"]["p50"]),
                       fmt(s["itl_ms"]["p50"]), fmt(s["itl_ms"].get("p99")),
                       fmt(s["e2e_ms"]["p50"]),
                       fmt(s["bystander_ttft_ms"]["p50"]), fmt(s["bystander_ttft_ms"]["p95"]),
                       fmt(s["client_lag_ms"]["p50"]), fmt(s["client_lag_ms"]["p99"])])
    return ("<h2 id='parts'>Resume latency parts and call latency (ms)</h2>" + table(heads, rows)
            + "<p class='note'>restore = swap-in or re-prefill of the retained context; queue = "
              "the harness's wait for a slot before the call was sent; prefill = the server's "
              "own prompt time where it reports one (llama.cpp timings), else the rest up to "
              "the first token; server wait = that rest beyond the reported prefill (the "
              "server's queue and the first token's delivery), '-' where the server reports no "
              "prompt time; client lag = how late the harness woke to a tool's end (not part "
              "of resume latency); ITL = " + _itl_sources(runs) + ".</p>"
            + _server_times(runs))


def _server_times(runs: list[RunData]) -> str:
    """The server's own mean queue and prefill time per request, where its metrics have them."""
    lines = []
    for r in runs:
        times = r.summary.get("server_times_ms") or {}
        if times:
            said = "; ".join(f"{part} {fmt(t['mean_ms'])} ms mean over {t['requests']:,} "
                             f"requests ({html.escape(str(t['source']))})"
                             for part, t in times.items())
            lines.append(f"<p class='note'><b>the server's own account</b> "
                         f"({_label(r)}): {said}; every request it finished during the run, "
                         "from its metrics' histograms, not split per call</p>")
    return "".join(lines)


def _itl_sources(runs: list[RunData]) -> str:
    """Where each run's ITL came from, said once when all agree."""
    words = {"client chunk times": "the gaps between streamed chunks of tokens as the client "
                                   "received them",
             "server decode per token": "each call's server decode time per token (no chunk "
                                        "times recorded)"}
    sources = [str(r.summary.get("itl_source") or "server decode per token") for r in runs]
    if len(set(sources)) == 1:
        return words.get(sources[0], sources[0])
    return "; ".join(f"{html.escape(_label(r))}: {words.get(s, s)}"
                     for r, s in zip(runs, sources, strict=True))


def occupancy_section(runs: list[RunData]) -> str:
    cells = []
    # One y axis (and time axis) for every run's plot, so heights compare at a glance; each in
    # its own unit (MiB where the bytes per token are known, else tokens), shared per unit.
    units = {r.path: bool(r.summary.get("kv_bytes_per_token")) for r in runs}
    peaks = {r.path: plots.occupancy_peak(r.frames, r.summary.get("kv_bytes_per_token"),
                                          r.server_kv) for r in runs}
    tmax = max((r.frames.duration_s for r in runs), default=0.0)
    for r in runs:
        s = r.summary
        ymax = max(v for p, v in peaks.items() if units[p] == units[r.path])
        img = plots.occupancy(r.frames, s.get("kv_bytes_per_token"), r.server_kv, ymax, tmax)
        stats = (f"<p class='note'>paused: peak {fmt(s['kv_paused_peak_tokens'])} tokens, mean "
                 f"{fmt(s['kv_paused_mean_tokens'])}; active: peak "
                 f"{fmt(s['kv_active_peak_tokens'])}, mean {fmt(s['kv_active_mean_tokens'])}; "
                 f"memory-time {fmt(s['memory_time_mib_s'])} MiB·s "
                 f"({fmt(s['memory_time_token_s'])} token·s)</p>")
        occ = s.get("server_occupancy")
        if occ:
            stats += table(["server gauge", "samples", "mean", "max", "last"],
                           [[html.escape(k), fmt(v["n"]), fmt(v["mean"]), fmt(v["max"]),
                             fmt(v["last"])] for k, v in occ.items()])
        body = _img(img, "KV occupancy") if img else "<p class='note'>No kv_state events.</p>"
        cells.append(f"<div><h3>{_label(r)}</h3>{body}{stats}</div>")
    return ("<h2 id='occupancy'>KV occupancy and memory-time</h2><div class='grid'>"
            + "".join(cells) + "</div>")


def timeline_section(runs: list[RunData]) -> str:
    cells = []
    for r in runs:
        img = plots.timeline(r.frames)
        n = int((~r.frames.trajectories["bystander"]).sum())
        shown = min(n, plots.TIMELINE_CAP)
        body = _img(img, "trajectory timeline") if img else \
            "<p class='note'>No agent trajectories.</p>"
        by_turn = turns(r.frames)
        if by_turn:
            body += ("<p class='note'>turn by turn, the trajectories with the most calls: each "
                     "call one bar (the tool wait before it, its time to first token, its "
                     "decode), so long trajectories read call by call</p>"
                     + _img(by_turn, "turn by turn"))
        cells.append(f"<div><h3>{_label(r)}</h3><p class='note'>first {shown} of {n} "
                     f"trajectories by arrival</p>{body}</div>")
    return "<h2 id='timeline'>Per-trajectory timeline</h2>" + "".join(cells)


def tools_section(runs: list[RunData]) -> str:
    """Tool waits by class: one box per run, or one for all when every run waited the same
    (one trace, no injection differences: the policy does not change how long tools take)."""
    series = [(r.label, r.frames.pauses) for r in runs]
    note = ""
    if len(runs) > 1 and same_tool_waits(runs):
        series = [(f"every run (as waited in {runs[0].label})", runs[0].frames.pauses)]
        note = ("<p class='note'>Every run planned the same tool latencies (one trace and "
                "injection): one box per class stands for all.</p>")
    img = plots.tool_latency(series)
    body = _img(img, "tool latency by class") if img else "<p class='note'>No tool calls.</p>"
    return "<h2 id='tools'>Tool latency by class</h2>" + body + note


def same_tool_waits(runs: list[RunData]) -> bool:
    """Whether every run planned the same tool latencies by class (sorted; a tool that never
    returns counts as one): their actual waits then differ only by the client's jitter."""
    def waits(r: RunData) -> dict[str, list[float]]:
        p = r.frames.pauses
        cls = p["tool_class"].astype(object)
        return {str(c): sorted(round(float(w), 6) if w == w else -1.0
                               for w in p.loc[cls == c, "planned_s"])
                for c in cls.dropna().unique()}

    first = waits(runs[0])
    return all(waits(r) == first for r in runs[1:])


def by_class_section(runs: list[RunData]) -> str:
    heads = ["run", "tool class", "pauses", "actions taken", "wait P50 s", "wait P95 s",
             "resume P50 ms", "resume P95 ms", "paused KV MiB·s"]
    rows = []
    for r in runs:
        p = r.frames.pauses
        cls_of = p["tool_class"].astype(object)
        for cls, g in r.summary["by_tool_class"].items():
            acts = p.loc[cls_of == cls, "action"].astype(object).fillna("none").value_counts()
            mix = ", ".join(f"{a} {n}" for a, n in sorted(acts.items(), key=lambda x: -x[1]))
            rows.append([_label(r), html.escape(cls), fmt(g["pauses"]), html.escape(mix),
                         fmt(g["wait_s"]["p50"]), fmt(g["wait_s"]["p95"]),
                         fmt(g["resume_latency_ms"]["p50"]), fmt(g["resume_latency_ms"]["p95"]),
                         fmt(g["memory_time_mib_s"])])
    if not rows:
        return ""
    return "<h2 id='by-class'>By tool class</h2>" + table(heads, rows, 4)


def _measured(summary: Summary, key: str) -> Any:
    if key.startswith("resume_ms_"):
        return (summary.get("resume_latency_ms") or {}).get(key[len("resume_ms_"):])
    if key.startswith("restore_ms_"):
        restore = (summary.get("resume_parts_ms") or {}).get("restore") or {}
        return restore.get(key[len("restore_ms_"):])
    if key in summary and not isinstance(summary[key], dict):
        return summary[key]
    m = re.fullmatch(r"(.+)_(p\d+)", key)
    if m and isinstance(summary.get(m.group(1)), dict):
        return summary[m.group(1)].get(m.group(2))
    return None


def prediction_section(runs: list[RunData]) -> str:
    """Predicted (prediction.json) vs measured, where a directory has a prediction."""
    rows = []
    for r in runs:
        if not r.prediction:
            continue
        pred = r.prediction.get(str(r.summary.get("policy")))
        if not isinstance(pred, dict):
            continue
        for key, value in pred.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            got = _measured(r.summary, key)
            ratio = got / value if isinstance(got, int | float) and isinstance(
                value, int | float) and value else None
            rows.append([_label(r), html.escape(key), fmt(value), fmt(got), fmt(ratio)])
    if not rows:
        return ""
    return ("<h2 id='prediction'>Predicted vs measured</h2>"
            + table(["run", "metric", "predicted", "measured", "measured / predicted"], rows, 2))


META_KEYS = ("run_id", "runtime", "server_version", "server_build", "host", "model", "policy",
             "policy_args", "trace", "seed", "harness_version", "git_commit", "started_at",
             "slots", "ctx_per_slot", "server_flags", "injection", "arrivals")


def _meta_value(value: Any) -> str:
    if isinstance(value, dict):
        return "<br>".join(f"{html.escape(str(k))}: {_meta_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return html.escape(" ".join(str(v) for v in value))
    return html.escape(str(value)) if value is not None else "-"


def metadata_section(runs: list[RunData]) -> str:
    metas = [r.run.to_dict() for r in runs]
    keys = [k for k in META_KEYS if any(m.get(k) is not None for m in metas)]
    rows = [[html.escape(k)] + [_meta_value(m.get(k)) for m in metas] for k in keys]
    rows.append(["duration (s)"] + [fmt(r.summary["duration_s"]) for r in runs])
    rows.append(["records dir"] + [html.escape(str(r.path)) for r in runs])
    heads = ["run.json"] + [_label(r) for r in runs]
    return ("<h2 id='metadata'>Run metadata</h2><div style='overflow-x:auto'>"
            + table(heads, rows, text_cols=len(heads)) + "</div>")


def _img(uri: str | None, alt: str) -> str:
    return f"<img src='{uri}' alt='{html.escape(alt)}'>" if uri else ""
