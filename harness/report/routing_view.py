"""The report's routing section: for runtimes that say which worker served each call (Dynamo),
what the server decided at every resumed call (back to the worker holding the context, or
elsewhere) next to what the harness did at the pause, and the cached tokens each way."""

from __future__ import annotations

import html
from collections.abc import Callable

from harness.report.data import RunData
from harness.report.fmt import fmt, table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def routing_section(runs: list[RunData], run_label: Callable[[RunData], str]) -> str:
    """One row per run whose calls name their worker; '' when none does."""
    rows = []
    for r in runs:
        rt = r.summary.get("routing")
        if not rt:
            continue
        extra = r.run.server_extra or {}
        how = " + ".join(x for x in (
            f"router {extra['router_mode']}" if extra.get("router_mode") else "",
            "session affinity" if extra.get("session_affinity") else "") if x) or "-"
        per = ", ".join(fmt(v) for v in rt["calls_per_worker"].values())
        router = rt.get("router")
        said = "-" if not router else (
            f"{_pct(router['predicted_hit_rate'])}; {fmt(router['selected_prefix_tokens'])} of "
            f"{fmt(router['best_prefix_tokens'])}")
        rows.append([run_label(r), html.escape(how), html.escape(str(r.run.harness_policy
                                                                     or r.run.policy)),
                     fmt(rt["workers"]), per, fmt(rt["resumed"]),
                     _pct(rt["same_worker_share"]), fmt(rt["cached_same"]),
                     fmt(rt["cached_moved"]), said])
    if not rows:
        return ""
    heads = ["run", "server: routing", "harness: per pause", "workers", "calls per worker",
             "resumed calls", "back on their worker", "cached tokens (stayed)",
             "cached tokens (moved)", "router: predicted hit rate; cached prefix tokens chosen "
             "of the best"]
    note = ("<p class='note'>Each call's worker as the server reported it (Dynamo's "
            "nvext.worker_id). A resumed call that lands on another worker than the call "
            "before its pause finds none of its context cached there, whatever the pause "
            "policy kept (its mean cached tokens: 'moved'). The KV router's own account, from "
            "its /metrics over the run: the hit rate it predicted per routed request, and the "
            "cached prefix tokens on the workers it chose against the best it could have "
            "chosen (it weighs load against overlap).</p>")
    return "<h2 id='routing'>Where calls were served</h2>" + table(heads, rows, 3) + note
