"""Which layout an OpenTelemetry GenAI trace file is in, and every span it holds (see
`otel_read` for the layouts; a file of one JSON document per line is read line by line)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers.otel_langfuse import is_obs, langfuse
from harness.traces.importers.otel_layouts import agent_trace, jaeger_trace
from harness.traces.importers.otel_read import (
    FileSpans,
    Span,
    fail,
    load_docs,
    obj,
    otlp,
)
from harness.userfiles import real_path


def _jaeger_list(items: list[Any], where: str, out: list[Span]) -> None:
    for i, t in enumerate(items):
        jaeger_trace(obj(t, f"{where}[{i}]"), f"{where}[{i}].", out)


LAYOUTS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("otlp", lambda d: isinstance(d, dict) and "resourceSpans" in d),
    ("tempo", lambda d: isinstance(d, dict) and "batches" in d),
    ("otlp-wrapped", lambda d: isinstance(d, dict) and any(
        isinstance(d.get(k), dict) and "resourceSpans" in d[k] for k in ("trace", "result"))),
    ("langfuse", lambda d: isinstance(d, dict) and isinstance(d.get("observations"), list)),
    ("jaeger", lambda d: isinstance(d, dict) and (
        ("traceID" in d and "spans" in d) or (isinstance(d.get("data"), list) and all(
            isinstance(t, dict) and "spans" in t for t in d["data"])))),
    ("langfuse", lambda d: isinstance(d, dict) and isinstance(d.get("data"), list)
     and all(is_obs(x) for x in d["data"])),
    ("any-agent", lambda d: isinstance(d, dict) and isinstance(d.get("spans"), list)),
    ("jaeger", lambda d: isinstance(d, list) and d != [] and all(
        isinstance(t, dict) and "traceID" in t and "spans" in t for t in d)),
    ("langfuse", lambda d: isinstance(d, list) and d != [] and all(
        isinstance(t, dict) and (isinstance(t.get("observations"), list) or is_obs(t))
        for t in d)),
)
EXPECTED = ("expected OTLP/JSON (resourceSpans), a Tempo export (batches), a Jaeger export "
            "(data[].spans), an any-agent AgentTrace (spans) or a Langfuse export "
            "({trace, observations})")


def _doc_spans(doc: Any, where: str, out: list[Span]) -> str:
    """Append the spans of one JSON document; its layout's name."""
    layout = next((name for name, test in LAYOUTS if test(doc)), None)
    if layout is None:
        raise fail(where.rstrip(": ") or "document", EXPECTED)
    if layout in ("otlp", "tempo"):
        otlp(doc, "resourceSpans" if layout == "otlp" else "batches", where, out)
    elif layout == "otlp-wrapped":
        k = "trace" if isinstance(doc.get("trace"), dict) else "result"
        otlp(doc[k], "resourceSpans", f"{where}{k}.", out)
        layout = "otlp"
    elif layout == "jaeger":
        if isinstance(doc, list):
            _jaeger_list(doc, where, out)
        elif "traceID" in doc:
            jaeger_trace(doc, where, out)
        else:
            _jaeger_list(doc["data"], f"{where}data", out)
    elif layout == "any-agent":
        agent_trace(doc, where, out)
    elif isinstance(doc, list):
        loose = [x for x in doc if is_obs(x)]
        if loose:
            langfuse(None, loose, f"{where}observations", out)
        for i, t in enumerate(doc):
            if isinstance(t, dict) and isinstance(t.get("observations"), list):
                _lf_trace(t, f"{where}[{i}].", out)
    elif "data" in doc and "observations" not in doc:
        langfuse(None, doc["data"], f"{where}data", out)
    else:
        _lf_trace(doc, where, out)
    return layout


def _lf_trace(doc: dict[str, Any], where: str, out: list[Span]) -> None:
    """`{trace, observations}` (the UI's download) or a trace holding its observations."""
    trace = doc.get("trace") if isinstance(doc.get("trace"), dict) else doc
    assert isinstance(trace, dict)
    langfuse(trace, doc["observations"], f"{where}observations", out)


def read_spans(path: Path) -> FileSpans:
    """Every span of a file, in any of the layouts above (one per line: JSON Lines)."""
    spans: list[Span] = []
    layouts: list[str] = []
    for where, doc in load_docs(path):
        layouts.append(_doc_spans(doc, f"{path}: {where}", spans))
    return FileSpans(path, "+".join(dict.fromkeys(layouts)), spans)


def files_in_tree(paths: Sequence[Path], suffixes: tuple[str, ...]) -> list[tuple[Path, bool]]:
    """The files named, a folder meaning every file under it (sub-folders too, sorted) whose
    name ends in one of `suffixes`, each once; with whether it came from a folder."""
    unique: dict[Path, tuple[Path, bool]] = {}
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: does not exist")
        if p.is_dir():
            # Every matching entry but a folder: the reader refuses one that is not a regular
            # file (a FIFO named a.json) rather than the import leaving it out in silence.
            found = sorted(q for q in p.rglob("*") if q.name.endswith(suffixes)
                           and not q.is_dir())
            if not found:
                raise InputError(f"{p}: no {' or '.join('*' + s for s in suffixes)} files "
                                 "(sub-folders included)")
            for q in found:
                unique.setdefault(real_path(q), (q, True))
        else:
            unique.setdefault(real_path(p), (p, False))
    return list(unique.values())
