"""OpenTelemetry GenAI traces: spans of LLM calls, tool executions and agents, in any layout.

Files, or folders (sub-folders included) of `*.json`, `*.jsonl`, `*.ndjson` (gzipped or not), in
OTLP/JSON (one object, or one per line as the collector's file exporter writes), Tempo and
Jaeger exports, any-agent `AgentTrace` JSON or Langfuse trace exports (`otel_read`). Spans are
grouped by trace id over the whole import: one trace is one root trajectory, an agent nested in
a tool or in an agent that made calls of its own is a sub-agent (`otel_trace`). Each LLM span is
an LLM step with the span's usage; the tool spans between two LLM spans are one pause timed by
their exact start and end; `otel_trace` reads a trace into the intermediate form (form.py)
and `builder` turns it into steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers._common import build_frame, share, summarize, take_options
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import ENDING_TOOLS, Builder, Built, assign_starts, publish
from harness.traces.importers.otel_files import files_in_tree, read_spans
from harness.traces.importers.otel_read import NS, FileSpans, Span
from harness.traces.importers.otel_trace import read_trace
from harness.traces.schema import GAP_TOOL, Provenance

FORMAT = "otel-genai"
OPTIONS: dict[str, str] = {}
SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
# Every count of a file's provenance entry (0 when nothing happened).
COUNTS = (
    "traces", "trajectories", "subagents", "user_turns", "llm_calls", "tool_calls",
    "tool_results", "exact_latency", "approx_latency", "abandoned", "errors",
    "tool_calls_without_span", "tool_pauses", "parallel_pauses", "human_pauses", "gap_pauses",
    "subagent_steps", "trailing_tools_dropped", "tools_before_first_call",
    "subagents_before_first_call", "subagents_promoted", "context_cuts", "cuts_keep_cached",
    "cuts_keep_previous_prompt", "cuts_keep_none", "prompt_tokens", "cached_tokens",
    "calls_with_cached", "kept_tokens", "appended_tokens", "output_tokens", "prompt_estimated",
    "output_estimated", "zero_output", "prompt_plus_cached", "nested_llm_spans",
    "nested_tool_spans", "llm_in_tool", "duplicate_spans", "orphan_spans", "clock_skew",
)
# The counts of the OTel and ATIF importers that the builder counts under other names.
PUBLISHED = {
    "llm_calls": ("llm_steps",), "prompt_estimated": ("llm_calls_estimated",),
    "prompt_tokens": ("prompt_tokens", "prompt_tokens_estimated"), "tool_calls": ("acts",),
    "tool_results": ("acts_answered",), "exact_latency": ("acts_exact",),
    "approx_latency": ("acts_approximate",), "latency_inferred": ("acts_inferred",),
    "abandoned": ("acts_abandoned",), "errors": ("acts_error",), "tool_pauses": ("tool_steps",),
    "gap_pauses": ("back_to_back_calls",), "subagents": ("subagents_built",),
}


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one trace file, or a folder of them."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import trace files and folders; spans of one trace id form one trajectory family."""
    opts = take_options(options, FORMAT, OPTIONS)
    files = [read_spans(p) for p, _ in files_in_tree(paths, SUFFIXES)]
    traces: dict[str, tuple[int, list[Span]]] = {}
    for i, f in enumerate(files):
        for s in f.spans:
            traces.setdefault(s.trace, (i, []))[1].append(s)
    counts = [Counter[str]() for _ in files]
    builder, built = Builder(ENDING_TOOLS), Built()
    for trace, (i, spans) in traces.items():
        c = counts[i]
        c["traces"] += 1
        before = len(built.trajectories)
        for root in read_trace(spans, trace, c):
            builder.build(root, built)
        c["trajectories"] += len(built.trajectories) - before
    for c in counts:
        publish(c, PUBLISHED)
    if not built.trajectories:
        named = ", ".join(str(f.path) for f in files[:3]) + (", ..." if len(files) > 3 else "")
        raise InputError(f"{FORMAT} import: no LLM call in {len(files)} file(s) "
                         f"({sum(len(f.spans) for f in files)} spans): nothing to replay "
                         f"({named})")
    assign_starts(built, opts["priority"], opts["tenant"], NS)
    return Imported(build_frame(built.trajectories), _provenance(files, counts, opts),
                    _warnings(files, counts))


def _entry(c: Counter[str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: int(c[k]) for k in COUNTS}
    out["exact_latency_share"] = share(c["exact_latency"], c["tool_calls"])
    out["cached_share"] = share(c["cached_tokens"], c["prompt_tokens"])
    skipped = {k.split(".", 1)[1]: int(v) for k, v in sorted(c.items())
               if k.startswith("skipped.") and v}
    out["skipped_spans"] = skipped
    return out


def _warnings(files: list[FileSpans], counts: list[Counter[str]]) -> list[str]:
    found = (
        ("files with no LLM call (nothing replayed from them)",
         [str(f.path) for f, c in zip(files, counts, strict=True) if not c["llm_calls"]]),
        ("files with tool calls the model asked for but no tool span: timed by the gap to the "
         "next call", [f"{f.path}: {c['tool_calls_without_span']}"
                       for f, c in zip(files, counts, strict=True)
                       if c["tool_calls_without_span"]]),
        ("files with tool spans that never ended and no call after them (abandoned)",
         [f"{f.path}: {c['abandoned']}" for f, c in zip(files, counts, strict=True)
          if c["abandoned"]]),
        ("files with spans that end before they start (clock skew; taken as 0 s)",
         [f"{f.path}: {c['clock_skew']}" for f, c in zip(files, counts, strict=True)
          if c["clock_skew"]]),
    )
    return [summarize(what, items) for what, items in found if items]


def _provenance(files: list[FileSpans], counts: list[Counter[str]],
                opts: dict[str, str]) -> Provenance:
    per = []
    for f, c in zip(files, counts, strict=True):
        producers = sorted({s.producer for s in f.spans if s.producer})
        per.append({"file": str(f.path), "layout": f.layout,
                    "producers": ", ".join(producers), **_entry(c)})
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    totals = {"files": len(files), **_entry(total)}
    return Provenance(
        source_format=FORMAT,
        source_files=[str(f.path) for f in files],
        inferred={
            "input_tokens": "from each LLM span's usage (gen_ai.usage.input_tokens, OpenInference "
                            "llm.token_count.prompt, Langfuse usageDetails): the prompt less the "
                            "context before the call (previous prompt + output); a span without "
                            "usage: the token rule on its input messages (prompt_estimated)",
            "keep_tokens": "null while each prompt extends the one before; a smaller prompt is a "
                           "context cut keeping the call's cached tokens, or the previous prompt "
                           "when the new one is at least that long, else 0",
            "output_tokens": "the span's output usage (at least 1); without usage, the token rule "
                             "on its output (output_estimated)",
            "latency_s": "a tool span's end - start (exact_latency); a tool span with no end that "
                         "the agent went on after: until the next LLM span's start (approx_"
                         "latency), with no call after: never returns (abandoned); several tool "
                         "spans between two LLM spans: one pause from the first start to the "
                         "last end; a tool call the model asked for with no span: the gap from "
                         "its LLM span's end to the next one's start; a 'user' or "
                         f"'{GAP_TOOL}' step: that gap; a subagent step: the time from its "
                         "last sub-agent's end to the end of the pause's tool spans (>= 0)",
            "tool_name": "gen_ai.tool.name (else tool.name, else the span's name); a step of "
                         "parallel calls joins them with '+'; a subagent step: the agents' "
                         f"names; '{GAP_TOOL}' between two LLM spans with nothing between them",
            "tool_class": "agent_tool_class of the tool's name; 'subagent' where sub-agents "
                          f"start; 'human' for a user's message; 'local_read' for '{GAP_TOOL}'",
            "outcome": "'error' for a span with error status (OTLP status code 2, Jaeger "
                       "error tag, Langfuse level ERROR); 'abandoned' when it never returns",
            "mutating": "the tool's class is 'mutating'", "deadline_s": "null",
            "trajectory_id": "the trace id (hex); a sub-agent: '<parent>/<its span id>'",
            "start_s": "the first LLM span's start, relative to the earliest trace of the "
                       "import; a sub-agent: its root's",
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            "spans are grouped by trace id over every file of the import; one trace is one "
            "root trajectory",
            "an agent span (invoke_agent, create_agent, OpenInference AGENT, Langfuse AGENT) "
            "inside a tool span, or inside an agent that made LLM calls of its own, is a "
            "sub-agent; an agent that only wraps others is the same conversation",
            "tool calls after the last LLM span whose results nobody read are dropped "
            f"(trailing_tools_dropped); so are ending tools ({', '.join(sorted(ENDING_TOOLS))})"
            " with no call after them",
            "cached_share: the log's cached prompt tokens over all prompt tokens",
        ],
        extra={"files": per, "totals": totals},
    )


IMPORTER = Format("otel-genai", import_paths, many=True)
