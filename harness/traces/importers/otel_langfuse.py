"""Langfuse trace exports read as spans: `{trace, observations}` (the UI's download), a trace
holding its `observations` (the public API), or a list of observations. An observation's type
(GENERATION, SPAN, TOOL, AGENT, EVENT, ...) is kept; the OpenTelemetry span attributes Langfuse
received are under `metadata.attributes`; usage is in `usageDetails` (else `usage`, else
`promptTokens`/`completionTokens`)."""

from __future__ import annotations

import json
from typing import Any

from harness.traces.importers.form import Usage
from harness.traces.importers.otel_read import (
    Span,
    count,
    iso_ns,
    norm_id,
    obj,
    text_field,
)

# Keys of Langfuse's usageDetails that name the cached part of the prompt.
LF_CACHED = ("input_cached_tokens", "input_cache_read", "cache_read_input_tokens",
             "input_cached", "prompt_details.cache_read", "cached_tokens")


def _lf_usage(o: dict[str, Any], at: str) -> Usage | None:
    ud = o.get("usageDetails")
    if isinstance(ud, dict) and ud:
        vals = {k: count(v, at, f"usageDetails.{k}") for k, v in ud.items()
                if isinstance(v, int | float | str) and not isinstance(v, bool)}
        nums = {k: v for k, v in vals.items() if v is not None}
        inp, out, total = nums.get("input"), nums.get("output"), nums.get("total")
        in_parts = sum(v for k, v in nums.items() if k != "input" and k != "total"
                       and any(s in k for s in ("input", "prompt", "cache")))
        out_parts = sum(v for k, v in nums.items() if k != "output" and k != "total"
                        and any(s in k for s in ("output", "completion", "reasoning")))
        cached = next((nums[k] for k in LF_CACHED if k in nums), None)
        if inp is None and out is None:
            return None
        # Where the total is the sum of every part, the details are parts of their own (an
        # `input` that excludes its cached part), so the prompt is their sum.
        if (in_parts or out_parts) and total == (inp or 0) + (out or 0) + in_parts + out_parts:
            return Usage((inp or 0) + in_parts, (out or 0) + out_parts, cached)
        return Usage(inp, out, cached)
    u = o.get("usage")
    if isinstance(u, dict) and ("input" in u or "output" in u):
        return Usage(count(u.get("input"), at, "usage.input"),
                     count(u.get("output"), at, "usage.output"))
    for pk, ok in (("promptTokens", "completionTokens"), ("inputUsage", "outputUsage")):
        p, q = o.get(pk), o.get(ok)
        if p or q:
            return Usage(count(p, at, pk), count(q, at, ok))
    return None


def _lf_meta(o: dict[str, Any]) -> dict[str, Any]:
    md = o.get("metadata")
    if isinstance(md, str) and md[:1] == "{":
        try:
            md = json.loads(md)
        except (json.JSONDecodeError, RecursionError):
            md = None
    return md if isinstance(md, dict) else {}


def langfuse(trace: dict[str, Any] | None, obs: list[Any], where: str, out: list[Span]) -> None:
    tid = trace.get("id") if trace else None
    for k, o in enumerate(obs):
        at = f"{where}[{k}]"
        o = obj(o, at)
        md = _lf_meta(o)
        attrs = md.get("attributes")
        attrs = dict(attrs) if isinstance(attrs, dict) else {}
        scope = md.get("scope") if isinstance(md.get("scope"), dict) else {}
        assert isinstance(scope, dict)
        producer = " ".join(str(x) for x in (scope.get("name"), scope.get("version")) if x)
        end = o.get("endTime")
        parent = o.get("parentObservationId")
        out.append(Span(
            at, norm_id(o.get("traceId") or tid, at, "traceId", 32),
            norm_id(o.get("id"), at, "id", 16),
            norm_id(parent, at, "parentObservationId", 16) if parent else None,
            text_field(o, "name", at, "") if o.get("name") is not None else "",
            iso_ns(o.get("startTime"), at, "startTime"),
            None if end is None else iso_ns(end, at, "endTime"), attrs,
            obs_type=str(o.get("type") or "SPAN").upper(), error=o.get("level") == "ERROR",
            usage=_lf_usage(o, at), output=o.get("output"), inputs=o.get("input"),
            producer=producer))


def is_obs(x: Any) -> bool:
    return isinstance(x, dict) and "startTime" in x and "id" in x and (
        "traceId" in x or "type" in x)
