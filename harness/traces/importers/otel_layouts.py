"""Jaeger exports and any-agent `AgentTrace` JSON as spans (otel_read.Span)."""

from __future__ import annotations

from typing import Any

from harness.traces.importers._common import quote
from harness.traces.importers.otel_read import (
    CHOICE_EVENTS,
    MAX_NS,
    Span,
    fail,
    int_ns,
    list_field,
    norm_id,
    obj,
    text_field,
)

# ---------------------------------------------------------------- Jaeger


def _jaeger_tags(tags: Any, where: str) -> dict[str, Any]:
    if tags is None:
        return {}
    if not isinstance(tags, list):
        raise fail(where, "'tags' must be a list of {key, value}")
    out: dict[str, Any] = {}
    for i, t in enumerate(tags):
        t = obj(t, f"{where}.tags[{i}]")
        out[text_field(t, "key", f"{where}.tags[{i}]")] = t.get("value")
    return out


def jaeger_trace(t: dict[str, Any], where: str, out: list[Span]) -> None:
    procs = t.get("processes") or {}
    procs = obj(procs, where, "'processes' must be an object")
    for k, sp in enumerate(list_field(t, "spans", where)):
        at = f"{where}spans[{k}]"
        sp = obj(sp, at)
        tags = _jaeger_tags(sp.get("tags"), at)
        parent = sp.get("parentSpanID")
        refs = list_field(sp, "references", at)
        for kind in ("CHILD_OF", "FOLLOWS_FROM"):
            ref = next((r for r in refs if isinstance(r, dict) and r.get("refType") == kind),
                       None)
            if ref is not None and not parent:
                parent = ref.get("spanID")
        start = int_ns(sp.get("startTime"), at, "startTime", 1000)
        dur = sp.get("duration")
        end = None if dur is None else (start or 0) + (int_ns(dur, at, "duration", 1000) or 0)
        if end is not None and end > MAX_NS:
            raise fail(at, f"'startTime' + 'duration' is past 2262: {quote(sp.get('startTime'))}")
        pid = sp.get("processID")
        proc = procs.get(pid) if isinstance(pid, str) else None
        service = proc.get("serviceName") if isinstance(proc, dict) else None
        lib = " ".join(str(tags[k]) for k in ("otel.scope.name", "otel.scope.version")
                       if tags.get(k)) or " ".join(
            str(tags[k]) for k in ("otel.library.name", "otel.library.version") if tags.get(k))
        error = tags.get("error") in (True, "true") or tags.get("otel.status_code") == "ERROR"
        events = [f for f in (_jaeger_tags(obj(lg, f"{at}.logs[{i}]").get("fields"),
                                           f"{at}.logs[{i}]")
                              for i, lg in enumerate(list_field(sp, "logs", at)))
                  if str(f.get("event")) in CHOICE_EVENTS]
        out.append(Span(
            at, norm_id(sp.get("traceID") or t.get("traceID"), at, "traceID", 32),
            norm_id(sp.get("spanID"), at, "spanID", 16),
            norm_id(parent, at, "references", 16) if parent else None,
            text_field(sp, "operationName", at, ""), start, end,
            tags, error=error, events=events, producer=lib or str(service or "")))


# ---------------------------------------------------------------- any-agent AgentTrace


def agent_trace(doc: dict[str, Any], where: str, out: list[Span]) -> None:
    for k, sp in enumerate(list_field(doc, "spans", where)):
        at = f"{where}spans[{k}]"
        sp = obj(sp, at)
        ctx = obj(sp.get("context"), at, "'context' must be an object with trace_id, span_id")
        par = sp.get("parent")
        if par is not None:
            par = obj(par, at, "'parent' must be an object with span_id, or null")
        attrs = sp.get("attributes") or {}
        attrs = obj(attrs, at, "'attributes' must be an object")
        status = sp.get("status") or {}
        res = sp.get("resource") or {}
        rattrs = res.get("attributes") if isinstance(res, dict) else None
        producer = ""
        if attrs.get("any_agent.version"):
            producer = f"any-agent {attrs['any_agent.version']}"
        elif isinstance(rattrs, dict) and rattrs.get("telemetry.sdk.version"):
            producer = f"opentelemetry-sdk {rattrs['telemetry.sdk.version']}"
        events = [e.get("attributes") for e in list_field(sp, "events", at)
                  if isinstance(e, dict) and isinstance(e.get("attributes"), dict)
                  and str(e.get("name")) in CHOICE_EVENTS]
        out.append(Span(
            at, norm_id(ctx.get("trace_id"), at, "context.trace_id", 32),
            norm_id(ctx.get("span_id"), at, "context.span_id", 16),
            norm_id(par["span_id"], at, "parent.span_id", 16)
            if par and par.get("span_id") is not None else None,
            text_field(sp, "name", at, ""), int_ns(sp.get("start_time"), at, "start_time"),
            int_ns(sp.get("end_time"), at, "end_time", optional=True), attrs,
            error=isinstance(status, dict) and str(status.get("status_code")).lower() == "error",
            events=events, producer=producer))
