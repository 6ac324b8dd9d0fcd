"""What an OpenTelemetry GenAI span says, whatever convention wrote it: its class (LLM call,
tool, agent or structure), the names of tools and agents, a call's usage, the tool calls its
response asked for, its input messages' roles and the text used to estimate tokens."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from harness.traces.importers.form import Usage
from harness.traces.importers.otel_read import Span, count

LLM_OPS = frozenset({"chat", "text_completion", "generate_content", "call_llm"})
AGENT_OPS = frozenset({"invoke_agent", "create_agent"})
OI_KINDS = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent"}
TRACELOOP_KINDS = {"tool": "tool", "agent": "agent"}
LANGFUSE_TYPES = {"GENERATION": "llm", "TOOL": "tool", "AGENT": "agent"}
TOOL_PREFIXES = ("execute_tool ", "tool.", "tool:")
AGENT_PREFIXES = ("invoke_agent ", "create_agent ", "agent.")

PROMPT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
               "llm.token_count.prompt", "llm.usage.prompt_tokens")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
               "llm.token_count.completion", "llm.usage.completion_tokens")
CACHED_KEYS = ("gen_ai.usage.cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens",
               "gen_ai.usage.cached_tokens", "gen_ai.usage.input_tokens_details.cached_tokens",
               "gen_ai.usage.prompt_tokens_details.cached_tokens",
               "llm.token_count.prompt_details.cache_read")
# Where a call's output (and the tool calls it asked for) and its input messages are found.
OUTPUT_ATTRS = ("gen_ai.output.messages", "gen_ai.output", "output.value",
                "gen_ai.response.tool_calls")
INPUT_ATTRS = ("gen_ai.input.messages", "input.value", "gen_ai.prompt")
NOT_CALLS = frozenset({"tools", "tool_definitions", "functions", "tool_choice"})
_OI_CALL = re.compile(r"llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\."
                      r"tool_call\.function\.name")
_TL_CALL = re.compile(r"gen_ai\.completion\.(\d+)\.tool_calls\.(\d+)\.name")
_ROLE = re.compile(r"(?:llm\.input_messages|gen_ai\.prompt)\.(\d+)(?:\.message)?\.role")
MAX_WALK = 20_000  # nodes of one attribute value searched for tool calls


def _op(s: Span) -> str | None:
    v = s.attrs.get("gen_ai.operation.name")
    return v if isinstance(v, str) else None


def classify(s: Span, requested: set[str]) -> str | None:
    """'llm', 'tool', 'agent' or None (structure)."""
    op = _op(s)
    if op in LLM_OPS:
        return "llm"
    if op == "execute_tool":
        return "tool"
    if op in AGENT_OPS:
        return "agent"
    for key, table in (("openinference.span.kind", OI_KINDS),
                       ("traceloop.span.kind", TRACELOOP_KINDS)):
        v = s.attrs.get(key)
        if isinstance(v, str) and v in table:
            return table[v]
    if s.attrs.get("llm.request.type") in ("chat", "completion"):
        return "llm"
    if s.obs_type in LANGFUSE_TYPES:
        return LANGFUSE_TYPES[s.obs_type]
    if s.name.startswith(TOOL_PREFIXES) or (s.name and s.name in requested):
        return "tool"
    return None


def skip_kind(s: Span) -> str:
    """What an unclassified span is, for the skipped counts."""
    for key in ("openinference.span.kind", "traceloop.span.kind", "gen_ai.operation.name"):
        v = s.attrs.get(key)
        if isinstance(v, str) and v:
            return v
    return s.obs_type or "span"


def tool_name(s: Span) -> str:
    for key in ("gen_ai.tool.name", "tool.name"):
        v = s.attrs.get(key)
        if isinstance(v, str) and v:
            return v
    for p in TOOL_PREFIXES:
        if s.name.startswith(p) and len(s.name) > len(p):
            return s.name[len(p):]
    return s.name or "tool"


def agent_name(s: Span) -> str:
    for key in ("gen_ai.agent.name", "agent.name"):
        v = s.attrs.get(key)
        if isinstance(v, str) and v:
            return v
    for p in AGENT_PREFIXES:
        if s.name.startswith(p) and len(s.name) > len(p):
            return s.name[len(p):]
    return s.name or "agent"


def call_ids(s: Span) -> set[str]:
    v = s.attrs.get("gen_ai.tool.call.id", s.attrs.get("tool_call.id"))
    items = v if isinstance(v, list) else [v]
    return {x for x in items if isinstance(x, str) and x}


def parsed(v: Any) -> Any:
    if isinstance(v, str) and v[:1] in "[{" and len(v) < 4_000_000:
        try:
            return json.loads(v)
        except (json.JSONDecodeError, RecursionError):
            return v
    return v


def walk(v: Any) -> Iterator[Any]:
    """Every dict and list in a value (JSON strings parsed), breadth first and bounded."""
    todo, seen = [parsed(v)], 0
    while todo and seen < MAX_WALK:
        x = todo.pop()
        seen += 1
        if isinstance(x, dict):
            yield x
            todo.extend(parsed(y) for k, y in x.items() if k not in NOT_CALLS)
        elif isinstance(x, list):
            todo.extend(parsed(y) for y in x)


def _calls_in(v: Any) -> list[tuple[str | None, str]]:
    """Tool calls (id, name) in a call's output, in any of the shapes instrumentations use."""
    out: list[tuple[str | None, str]] = []
    for d in walk(v):
        fn = d.get("function")
        name: Any = None
        if isinstance(d.get("tool.name"), str):  # any-agent
            name = d["tool.name"]
        elif d.get("type") in ("tool_call", "function_call", "tool_use"):
            name = d.get("name")
        elif isinstance(fn, dict) and "parameters" not in fn and (
                "arguments" in fn or "id" in d):
            name = fn.get("name")
        if isinstance(name, str) and name:
            cid = next((d[k] for k in ("call_id", "tool_call_id", "id")
                        if isinstance(d.get(k), str) and d[k]), None)
            out.append((cid, name))
    return out


def requested_calls(s: Span) -> list[tuple[str | None, str]]:
    """The tool calls an LLM span's response asked for (several sources, de-duplicated)."""
    sources = [s.attrs.get(k) for k in OUTPUT_ATTRS] + [s.output] + s.events
    sources += [v for k, v in s.attrs.items() if k.startswith("gen_ai.completion.")
                and k.endswith(".content")]
    lists = [_calls_in(v) for v in sources if v is not None]
    flat: dict[tuple[int, int], list[str | None]] = {}
    for k, v in s.attrs.items():
        m = _OI_CALL.fullmatch(k) or _TL_CALL.fullmatch(k)
        if m and isinstance(v, str):
            base = k[: k.rfind(".name")]
            cid = s.attrs.get(base.replace(".function", "") + ".id", s.attrs.get(base + ".id"))
            flat[(int(m[1]), int(m[2]))] = [cid if isinstance(cid, str) else None, v]
    lists.append([(x[0], str(x[1])) for _, x in sorted(flat.items())])
    by_id: dict[str, str] = {}
    anon: Counter[str] = Counter()
    for calls in lists:
        here: Counter[str] = Counter()
        for cid, name in calls:
            if cid:
                by_id.setdefault(cid, name)
            else:
                here[name] += 1
        anon |= here  # the same call found in two sources is one call
    named = Counter(by_id.values())
    return [(cid, n) for cid, n in by_id.items()] + [
        (None, n) for n, k in anon.items() for _ in range(max(0, k - named[n]))]


def texts(v: Any) -> str:
    parts = [x for d in walk(v) for k, x in d.items()
             if isinstance(x, str) and k not in ("role", "type", "id", "name", "call_id")]
    if isinstance(parsed(v), str):
        parts.append(str(v))
    return " ".join(parts)


def usage_of(s: Span) -> Usage | None:
    if s.usage is not None and (s.usage.prompt is not None or s.usage.output is not None):
        return s.usage
    got = [next((count(s.attrs[k], s.where, k) for k in keys if k in s.attrs), None)
           for keys in (PROMPT_KEYS, OUTPUT_KEYS, CACHED_KEYS)]
    if got[0] is None and got[1] is None:
        return None
    return Usage(*got)


def input_roles(s: Span) -> list[str] | None:
    flat = {int(m[1]): v for k, v in s.attrs.items() if (m := _ROLE.fullmatch(k))}
    if flat:
        return [str(flat[i]) for i in sorted(flat)]
    for v in (s.attrs.get("gen_ai.input.messages"), s.inputs):
        v = parsed(v)
        if isinstance(v, dict) and isinstance(v.get("messages"), list):
            v = v["messages"]
        if isinstance(v, list) and v and all(isinstance(m, dict) for m in v):
            return [str(m.get("role", m.get("type", ""))) for m in v]
    return None
