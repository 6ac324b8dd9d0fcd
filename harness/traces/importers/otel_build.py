"""Agent-log events as trajectory steps; shared by the OpenTelemetry GenAI and ATIF importers.

Both formats reduce a run to model calls (`Call`: the log's usage, or an estimate) and, after
each call, what the agent waited for before the next one (`Pause`: the tool calls it made, the
sub-agents it started, or the user's message). `assemble` turns them into alternating LLM and
tool steps and counts what it did in a Counter:

- Tokens. The first call appends its whole prompt. A later call whose prompt P is at least the
  context before it (the previous prompt + output) appends P minus that context. A smaller P is
  a context cut: the call keeps `keep_tokens` leading tokens, estimated as the most of (its
  cached tokens, when the log records them; the previous prompt, when P is at least that: the
  previous output was not sent back) that fits, else 0; it appends the rest, so the replayed
  prompt is exactly P.
- Pauses. Several tool calls of one pause are one tool step (`merge_parallel`); its latency is
  the wall time from the first call's start to the last one's end where every call has both,
  else the slowest call's. A pause that starts sub-agents is one `subagent` step. A pause after
  the last call is kept only when the run stopped inside it (a call that never returned, or
  sub-agents the parent waited for); results nobody read are dropped (counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.traces.importers._common import LLM, Tool
from harness.traces.importers.agent_tools import agent_tool_class, merge_parallel
from harness.traces.importers.prompts import cut_keep, prompt_step
from harness.traces.schema import TOOL_SUBAGENT

# Tools whose call ends the run by design: with no model call after them nothing waits for
# their result, so a trailing one is dropped rather than replayed as never returning.
TERMINAL_TOOLS = frozenset({
    "finish", "final_answer", "final_output", "mark_task_complete", "task_complete",
    "submit", "attempt_completion", "complete_task", "done",
})
# A tool named like a sub-agent launcher whose sub-agent is not in the input is timed as one
# long job; the `subagent` class is for steps that start a child trajectory.
UNSPAWNED_CLASS = "long_job"
GAP_TOOL = "no_tool"  # the agent called the model again with no tool or user message between
GAP_CLASS = "local_read"
NS = 1_000_000_000


@dataclass
class Call:
    """One model response: the log's usage (prompt: every prompt token, cached included), or
    estimates by the token rule where the log has none."""

    prompt: int | None
    output: int | None
    cached: int | None = None
    prompt_est: int | None = None  # an estimate of the whole prompt (None: unknown)
    output_est: int = 1
    start_ns: int | None = None
    end_ns: int | None = None
    append_est: int = 0  # without any prompt: an estimate of what was appended since
    cut: bool = False  # the log says the context was replaced before this call


@dataclass
class Act:
    """One tool call: latency None when it never returned."""

    name: str
    latency_s: float | None
    exact: bool
    has_result: bool
    outcome: str = "ok"
    start_ns: int | None = None
    end_ns: int | None = None
    inferred: bool = False  # the latency is a default or an option, not from the log


@dataclass
class Child:
    """A sub-agent started in a pause; its trajectory is built by the caller."""

    key: str  # the caller's handle for it
    name: str
    start_ns: int | None = None
    end_ns: int | None = None


@dataclass
class Pause:
    """What the agent waited for after a call."""

    acts: list[Act] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    human: bool = False
    latency_s: float | None = None  # a user's or a gap's wall time; None: unknown
    latency_exact: bool = False
    # When it starts sub-agents: when the pause ended (None: when the last child ended).
    end_ns: int | None = None


def tool_class(name: str) -> str:
    """The class of an agent's tool; a launcher without its sub-agent is a long job."""
    cls = agent_tool_class(name)
    return UNSPAWNED_CLASS if cls == TOOL_SUBAGENT else cls


def _act_tool(a: Act) -> Tool:
    cls = tool_class(a.name)
    outcome = a.outcome if a.latency_s is not None else "abandoned"
    return Tool(a.name, cls, a.latency_s, outcome, cls == "mutating")


def _wall(acts: Sequence[Act]) -> float | None:
    """From the first call's start to the last one's end, when every call has both."""
    if not acts or any(a.start_ns is None or a.end_ns is None for a in acts):
        return None
    first = min(a.start_ns for a in acts if a.start_ns is not None)
    last = max(a.end_ns for a in acts if a.end_ns is not None)
    return max(0.0, (last - first) / NS)


def count_acts(acts: Sequence[Act], c: Counter[str], replayed: bool = True) -> None:
    """Tool calls, those with a result, and how their latency is known (`replayed`: not a
    trailing call that was dropped)."""
    for a in acts:
        c["tool_calls"] += 1
        c["tool_results"] += a.has_result
        if a.latency_s is None and not replayed:  # an ending call nobody waited for
            continue
        if a.latency_s is None:
            c["abandoned"] += 1
        elif a.inferred:
            c["latency_inferred"] += 1
        elif a.exact:
            c["exact_latency"] += 1
        else:
            c["approx_latency"] += 1
        c["errors"] += a.outcome == "error"


def pause_step(p: Pause, c: Counter[str], last: bool) -> Tool | None:
    """The tool step of a pause (None: nothing to replay after the last call)."""
    if p.children:
        ends = [ch.end_ns for ch in p.children]
        done = max(e for e in ends if e is not None) if all(e is not None for e in ends) else None
        if done is not None and p.end_ns is not None:
            wait = max(0.0, (p.end_ns - done) / NS)
        else:  # the children's times are not known: the pause's own calls come on top
            wait = max((a.latency_s or 0.0 for a in p.acts), default=0.0)
        c["subagent_steps"] += 1
        names = [ch.name for ch in p.children] + [a.name for a in p.acts]
        return Tool("+".join(dict.fromkeys(names)), TOOL_SUBAGENT, round(wait, 6),
                    "error" if any(a.outcome == "error" for a in p.acts) else "ok",
                    any(tool_class(a.name) == "mutating" for a in p.acts))
    if p.acts:
        if last and all(a.latency_s is not None or a.name.lower() in TERMINAL_TOOLS
                        for a in p.acts):
            c["trailing_tools_dropped"] += len(p.acts)
            return None
        c["tool_pauses"] += 1
        c["parallel_pauses"] += len(p.acts) > 1
        merged = merge_parallel([_act_tool(a) for a in p.acts])
        wall = _wall(p.acts)
        if merged.latency_s is not None and wall is not None:
            merged.latency_s = wall
        if merged.latency_s is not None:
            merged.latency_s = round(merged.latency_s, 6)
        return merged
    if last:
        return None
    if p.human:
        c["human_pauses"] += 1
        return Tool("user", "human", round(p.latency_s or 0.0, 6))
    c["gap_pauses"] += 1
    return Tool(GAP_TOOL, GAP_CLASS, round(p.latency_s or 0.0, 6))


def _cut_keep(prev_prompt: int, before: int, prompt: int, cached: int | None,
              c: Counter[str]) -> int:
    """Leading tokens a call whose prompt is below the context before it keeps."""
    c["context_cuts"] += 1
    keep, how = cut_keep(prompt, prev_prompt, before, cached)
    c[f"cuts_keep_{how}"] += 1
    return keep


def llm_steps(calls: Sequence[Call], c: Counter[str]) -> list[LLM]:
    """Each call as an LLM step (see the module's docstring)."""
    steps: list[LLM] = []
    before = prev_prompt = 0  # the context after the previous call; its prompt
    counted = False  # the previous prompt is the log's count, not an estimate
    for k, call in enumerate(calls):
        out = call.output if call.output is not None else call.output_est
        if call.output is None:
            c["output_estimated"] += 1
        if out < 1:
            c["zero_output"] += 1
        out = max(out, 1)
        prompt = call.prompt if call.prompt is not None else call.prompt_est
        if call.prompt is None:
            c["prompt_estimated"] += 1
        if prompt is None:  # no prompt at all: the context so far and what was appended
            prompt = before + call.append_est
        elif call.prompt is None and counted:
            # An estimate is in other units than the counts before it: it never cuts them.
            prompt = max(prompt, before)
        counted = call.prompt is not None
        c["llm_calls"] += 1
        c["prompt_tokens"] += prompt
        c["output_tokens"] += out
        if call.cached is not None:
            c["calls_with_cached"] += 1
            c["cached_tokens"] += call.cached
        if k == 0 or (prompt >= before and not call.cut):
            steps.append(prompt_step(prompt, out, before if k else 0))
            c["kept_tokens"] += before if k else 0
        else:
            if call.cut:  # declared: what stays is what the provider found cached, if any
                c["cuts_declared"] += 1
            keep = _cut_keep(0 if call.cut else prev_prompt, before, prompt, call.cached, c)
            steps.append(prompt_step(prompt, out, before, keep))
            c["kept_tokens"] += keep
        before, prev_prompt = prompt + out, prompt
    c["appended_tokens"] = c["prompt_tokens"] - c["kept_tokens"]
    return steps


def assemble(calls: Sequence[Call], pauses: Sequence[Pause], c: Counter[str]
             ) -> tuple[list[LLM | Tool], dict[str, int]]:
    """Alternating steps of calls and the pause after each (`pauses[i]` follows `calls[i]`),
    and the step index of the `subagent` step that starts each child (by its key)."""
    if len(pauses) != len(calls):
        raise ValueError("one pause per call")
    steps: list[LLM | Tool] = []
    spawned: dict[str, int] = {}
    for i, (call, p) in enumerate(zip(llm_steps(calls, c), pauses, strict=True)):
        steps.append(call)
        tool = pause_step(p, c, i == len(calls) - 1)
        count_acts(p.acts, c, tool is not None)
        if tool is None:
            continue
        for ch in p.children:
            spawned[ch.key] = len(steps)
        steps.append(tool)
    return steps, spawned


def share(exact: int, total: int) -> float:
    """exact / total, rounded; 0 when there is nothing to share."""
    return round(exact / total, 4) if total else 0.0
