"""OpenTelemetry GenAI traces in their file layouts, read as one list of spans: the shared
pieces, OTLP/JSON, Jaeger and any-agent (Langfuse: `otel_langfuse`; which layout: `otel_files`).

Layouts: OTLP/JSON (`resourceSpans` -> `scopeSpans` (or the older `instrumentationLibrarySpans`)
-> `spans`, attributes as `{key, value: {stringValue|intValue|...}}`), one such object per line
as the collector's file exporter writes, Tempo's `batches` (and `{trace: {...}}`), Jaeger's
query-API JSON (`data[].spans[]`, µs `startTime` and `duration`, `tags`, `references`) and its
v3 API's `{result: {resourceSpans}}`, any-agent's `AgentTrace` (`spans` with attributes as a
dict, ns `start_time`/`end_time`, `context`/`parent`) and Langfuse trace exports (`{trace,
observations}`, a trace object holding `observations`, a list of either, or a list of
observations), whose span attributes are under `metadata.attributes`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_TOKENS
from harness.traces.importers._common import quote
from harness.traces.importers.form import Usage
from harness.userfiles import read_bytes, read_lines

MAX_DEPTH = 48  # nesting of an attribute value; deeper is refused, never recursed into
MAX_NS = 2**63 - 1
NS = 1_000_000_000
# Names of JSON Lines files, read a line at a time.
LINE_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
# Span events that carry the model's response (older GenAI conventions); the other message
# events repeat the prompt, whose earlier tool calls are not this call's.
CHOICE_EVENTS = frozenset({"gen_ai.choice"})


@dataclass
class Span:
    """One span (or Langfuse observation), whatever layout it came in."""

    where: str  # file and JSON path, for messages
    trace: str
    sid: str
    parent: str | None
    name: str
    start: int | None  # ns since the epoch
    end: int | None
    attrs: dict[str, Any]
    obs_type: str | None = None  # Langfuse's observation type
    error: bool = False
    usage: Usage | None = None  # Langfuse's own usage fields
    output: Any = None  # Langfuse's observation output
    inputs: Any = None  # Langfuse's observation input
    events: list[Any] = field(default_factory=list)  # attributes of its gen_ai.choice events
    producer: str = ""  # instrumentation scope or service, with its version


@dataclass
class FileSpans:
    """What one file held."""

    path: Path
    layout: str
    spans: list[Span]
    skipped: Counter[str] = field(default_factory=Counter)


def fail(where: str, what: str) -> InputError:
    """A one-line error naming where (file and JSON path) and what."""
    return InputError(f"{where.rstrip(': ')}: {what}")


def load_docs(path: Path) -> list[tuple[str, Any]]:
    """The file's JSON documents: one, or one per non-blank line (JSON Lines). A file named as
    JSON Lines is read a line at a time (bounded by limits.MAX_LINE_BYTES), unless its first
    line is not JSON (one document over several lines)."""
    if path.name.endswith(LINE_SUFFIXES):
        lined = _line_docs(path)
        if lined is not None:
            return lined
    try:
        text = read_bytes(path).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise fail(str(path), f"cannot read: {exc}") from None
    try:
        return [("", json.loads(text))]
    except json.JSONDecodeError as exc:
        first = exc
    except RecursionError:
        raise fail(str(path), "JSON nested too deeply to be a trace") from None
    docs: list[tuple[str, Any]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            docs.append((f"line {n}: ", json.loads(line)))
        except json.JSONDecodeError as exc:
            if not docs:  # not JSON Lines either: the whole file's error
                raise fail(str(path), f"not valid JSON at line {first.lineno} column "
                                      f"{first.colno}: {first.msg}") from None
            raise fail(str(path), f"line {n}: not valid JSON: {exc.msg}") from None
        except RecursionError:
            raise fail(str(path), f"line {n}: JSON nested too deeply to be a trace") from None
    return docs


def _line_docs(path: Path) -> list[tuple[str, Any]] | None:
    """Each non-blank line's document, read a line at a time; None when the first is not JSON
    (the caller reads the file whole)."""
    docs: list[tuple[str, Any]] = []
    for n, line in read_lines(path):
        if not line.strip():
            continue
        try:
            docs.append((f"line {n}: ", json.loads(line.decode("utf-8"))))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if not docs:
                return None
            what = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
            raise fail(str(path), f"line {n}: not valid JSON: {what}") from None
        except RecursionError:
            raise fail(str(path), f"line {n}: JSON nested too deeply to be a trace") from None
    return docs


def count(v: Any, where: str, key: str) -> int | None:
    """A token count from a number or a numeric string (OpenInference writes '85')."""
    if v is None:
        return None
    n: Any = v
    if (isinstance(v, str) and re.fullmatch(r"\s*\d+\s*", v)) or (
            isinstance(v, float) and v.is_integer()):
        n = int(v)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKENS:
        raise fail(where, f"{key!r} must be a token count from 0 to {MAX_TOKENS}, got {quote(v)}")
    return n


_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?"
                  r"\s*(Z|z|[+-]\d\d:?\d\d)?")


def iso_ns(v: Any, where: str, key: str) -> int:
    """An ISO 8601 time as ns since the epoch (no zone: UTC)."""
    m = _ISO.fullmatch(v.strip()) if isinstance(v, str) else None
    try:
        if m is None:
            raise ValueError
        y, mo, d, h, mi, s = (int(m[i]) for i in range(1, 7))
        t = datetime(y, mo, d, h, mi, s, tzinfo=UTC)
        z = m[8]
        if z and z not in "Zz":
            sign = -1 if z[0] == "-" else 1
            hh, mm = int(z[1:3]), int(z[-2:])
            t -= sign * timedelta(hours=hh, minutes=mm)
        whole = int((t - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    except (ValueError, OverflowError):
        raise fail(where, f"{key!r} must be an ISO 8601 time, got {quote(v)}") from None
    ns = whole * 1_000_000_000 + int((m[7] or "0")[:9].ljust(9, "0"))
    if not 0 <= ns <= MAX_NS:
        raise fail(where, f"{key!r} must be a time between 1970 and 2262, got {quote(v)}")
    return ns


def int_ns(v: Any, where: str, key: str, scale: int = 1, optional: bool = False) -> int | None:
    """A time as an integer (or a string of one) in units of `scale` ns; 0 or null is unset
    when `optional`."""
    if v is None and optional:
        return None
    n: Any = v
    if isinstance(v, str) and re.fullmatch(r"\d+", v.strip()):
        n = int(v)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n * scale <= MAX_NS:
        raise fail(where, f"{key!r} must be a time in {'ns' if scale == 1 else 'µs'} since the "
                          f"epoch, got {quote(v)}")
    if optional and n == 0:
        return None
    return int(n * scale)


def norm_id(v: Any, where: str, key: str, width: int) -> str:
    """A trace or span id as lower-case hex: hex as is, an integer (any-agent) formatted, base64
    (Tempo's protobuf JSON) decoded."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return format(v, f"0{width}x")
    if isinstance(v, str) and v:
        if re.fullmatch(r"[0-9a-fA-F]+", v):
            return v.lower()
        try:
            raw = base64.b64decode(v, validate=True)
            if len(raw) in (8, 16):
                return raw.hex()
        except (binascii.Error, ValueError):
            pass
        return v
    raise fail(where, f"{key!r} must be a non-empty id, got {quote(v)}")


def text_field(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str):
        raise fail(where, f"{key!r} must be a string, got {quote(v)}")
    return v


def obj(v: Any, where: str, what: str = "expected a JSON object") -> dict[str, Any]:
    if not isinstance(v, dict):
        raise fail(where, what)
    return v


def list_field(d: dict[str, Any], key: str, where: str) -> list[Any]:
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise fail(where, f"{key!r} must be a list")
    return v


# ---------------------------------------------------------------- OTLP/JSON (and Tempo)


def any_value(v: Any, where: str, depth: int = 0) -> Any:
    """An OTLP AnyValue as a plain value."""
    if depth > MAX_DEPTH:
        raise fail(where, "attribute value nested too deeply")
    if not isinstance(v, dict):
        raise fail(where, "an attribute value must be an object like {\"stringValue\": ...}")
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        x = v["intValue"]
        try:
            return int(x) if isinstance(x, str | int) and not isinstance(x, bool) else x
        except ValueError:
            raise fail(where, f"'intValue' must be an integer, got {quote(x)}") from None
    for k in ("doubleValue", "boolValue", "bytesValue"):
        if k in v:
            return v[k]
    if "arrayValue" in v:
        arr = obj(v["arrayValue"], where, "'arrayValue' must be an object")
        return [any_value(x, where, depth + 1) for x in list_field(arr, "values", where)]
    if "kvlistValue" in v:
        kv = obj(v["kvlistValue"], where, "'kvlistValue' must be an object")
        return kvlist_field(list_field(kv, "values", where), where, depth + 1)
    return None


def kvlist_field(items: Any, where: str, depth: int = 0) -> dict[str, Any]:
    """OTLP attributes (a list of {key, value}) as a dict."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise fail(where, "'attributes' must be a list of {key, value}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(items):
        at = f"{where}.attributes[{i}]"
        kv = obj(kv, at)
        out[text_field(kv, "key", at)] = any_value(kv.get("value", {}), at, depth)
    return out


def _otlp_error(status: Any) -> bool:
    if not isinstance(status, dict):
        return False
    code = status.get("code")
    return code in (2, "2", "STATUS_CODE_ERROR", "ERROR")


def otlp(doc: dict[str, Any], key: str, where: str, out: list[Span]) -> None:
    for i, rs in enumerate(list_field(doc, key, where)):
        at = f"{where}{key}[{i}]"
        rs = obj(rs, at)
        res = obj(rs.get("resource") or {}, f"{at}.resource", "'resource' must be an object")
        service = kvlist_field(res.get("attributes"), f"{at}.resource").get("service.name")
        skey = "scopeSpans" if "scopeSpans" in rs else "instrumentationLibrarySpans"
        for j, ss in enumerate(list_field(rs, skey, at)):
            sat = f"{at}.{skey}[{j}]"
            ss = obj(ss, sat)
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
            scope = obj(scope, sat, "'scope' must be an object")
            producer = " ".join(str(x) for x in (scope.get("name") or service,
                                                 scope.get("version")) if x)
            for k, sp in enumerate(list_field(ss, "spans", sat)):
                out.append(_otlp_span(obj(sp, f"{sat}.spans[{k}]"), f"{sat}.spans[{k}]",
                                      producer))


def _otlp_span(sp: dict[str, Any], at: str, producer: str) -> Span:
    parent = sp.get("parentSpanId")
    events = [kvlist_field(obj(e, f"{at}.events[{i}]").get("attributes"), f"{at}.events[{i}]")
              for i, e in enumerate(list_field(sp, "events", at))
              if isinstance(e, dict) and str(e.get("name")) in CHOICE_EVENTS]
    return Span(
        at, norm_id(sp.get("traceId"), at, "traceId", 32),
        norm_id(sp.get("spanId"), at, "spanId", 16),
        norm_id(parent, at, "parentSpanId", 16) if parent else None,
        text_field(sp, "name", at, ""),
        int_ns(sp.get("startTimeUnixNano"), at, "startTimeUnixNano"),
        int_ns(sp.get("endTimeUnixNano"), at, "endTimeUnixNano", optional=True),
        kvlist_field(sp.get("attributes"), at), error=_otlp_error(sp.get("status")),
        events=events, producer=producer)
