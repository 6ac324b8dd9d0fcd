"""The model's answer to `harness model`: every pause priced under every policy, as a document
(per pause, and totals per policy) and as the readable table of it."""

from __future__ import annotations

from typing import Any

from harness.model.analytical import evaluate, prediction, report
from harness.model.inputs import resolve

PER_PAUSE_AUTO = 50  # pauses listed one by one when there are at most this many


def price(flags: dict[str, Any], per_pause: bool | None = None
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's inputs resolved from `flags` (harness.model.inputs.resolve: geometry,
    rates, pauses, policies), priced: (the report document, prediction.json's content).
    `per_pause` None: list every pause when there are at most PER_PAUSE_AUTO."""
    req = resolve(flags)
    costs = evaluate(req.policies, req.pauses, req.kv_bytes_per_token, req.rates,
                     req.free_fraction)
    if per_pause is None:
        per_pause = len(req.pauses) <= PER_PAUSE_AUTO
    return report(costs, req.pauses, req.geometry, req.rates, per_pause), prediction(costs)


def _g(v: Any, digits: int = 10) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}g}"


def render(doc: dict[str, Any]) -> str:
    """The readable table: geometry, rates, each pause by policy, then totals by policy."""
    g, r = doc["geometry"], doc["rates"]
    bpt = g["kv_bytes_per_token"]
    lines = []
    if "layers" in g:
        lines.append(f"KV geometry {g['name']} ({g['source']}): {g['layers']} layers x 2 x "
                     f"{g['kv_heads']} KV heads x head dim {g['head_dim']} x "
                     f"{g['dtype_bytes']} B = {_g(bpt / 1024)} KiB per token ({_g(bpt)} B)")
    else:
        lines.append(f"KV bytes per token {_g(bpt)} ({g['source']})")
    lines.append(f"rates ({r['source']}): swap out {_g(r['swap_out_gib_s'])} GiB/s, swap in "
                 f"{_g(r['swap_in_gib_s'])} GiB/s, prefill {_g(r['prefill_tok_s'])} tok/s")
    head = (f"  {'policy':<10} {'action':<15} {'resume ms':>12} {'MiB·s':>12} "
            f"{'moved MiB':>10} {'recomputed':>10}")
    for i, p in enumerate(doc.get("pauses", []), 1):
        end = "" if p["resumes"] else " (no resume: priced until it ends)"
        lines += ["", f"pause {i}: {p['tokens']} tokens ({_g(p['cache_mib'])} MiB), "
                      f"{_g(p['pause_s'])} s, {p['tool_class']}{end}", head]
        for name, c in p["policies"].items():
            lines.append(f"  {name:<10} {c['action']:<15} {_g(c['resume_ms']):>12} "
                         f"{_g(c['mib_s']):>12} {_g(c['mib_moved']):>10} "
                         f"{c['tokens_recomputed']:>10}")
    lines += ["", f"totals over {doc['n_pauses']} pauses",
              f"  {'policy':<10} {'resume ms p50 / p95 / p99':>30} {'MiB·s':>14} "
              f"{'moved MiB':>12} {'recomputed':>12}"]
    for name, t in doc["totals"].items():
        q = t["resume_ms"]
        res = " / ".join(_g(q[k], 6) for k in ("p50", "p95", "p99"))
        lines.append(f"  {name:<10} {res:>30} {_g(t['mib_s']['total']):>14} "
                     f"{_g(t['mib_moved']):>12} {_g(t['tokens_recomputed']['total']):>12}")
    return "\n".join(lines)
