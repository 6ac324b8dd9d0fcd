"""What importing a recording counts and reports: each folder's record (`Rec`), its
conversations (`Conv`), the counts, the warnings and the provenance of the import."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.proxy.events import Call
from harness.traces.importers._common import summarize, summed
from harness.traces.importers.agent_tools import UNLINKED_SPAWN_CLASS
from harness.traces.importers.form import Convo
from harness.traces.schema import Provenance
from harness.userfiles import TOKEN_RULE

FORMAT = "recording"


# A Task/agent tool whose sub-agent is not in the recording: an ordinary (long) tool.
UNSPAWNED_CLASS = UNLINKED_SPAWN_CLASS
# The counts the builder counts under other names (human_pauses: less the client's own).
PUBLISHED = {
    "llm_steps": ("llm_steps",), "subagent_steps": ("subagent_steps",),
    "human_pauses": ("human_pauses",), "zero_output": ("zero_output",),
    "prompt_tokens": ("prompt_tokens",), "output_tokens": ("output_tokens",),
    "cached_tokens": ("cached_tokens",), "appended_tokens": ("appended_tokens",),
    "kept_tokens": ("kept_tokens_given",), "tool_calls": ("acts",),
    "tool_results": ("acts_answered",), "exact_latency": ("acts_exact",),
    "abandoned_tool_calls": ("acts_abandoned",), "results_missing": ("acts_approximate",),
    "tool_pauses": ("tool_steps",), "subagents": ("subagents_built",),
}


DEFAULT_DEADLINE_S = 30.0  # the injection profiles' default, which long tools would outlive


COUNTS = (
    "calls", "calls_ok", "calls_http_error", "calls_unreachable", "calls_cut",
    "calls_aborted", "calls_stopped", "calls_unfinished", "unparsed", "other_requests",
    "conversations", "conversations_without_answer", "trajectories", "subagents",
    "subagents_orphaned", "subagents_after_last_call", "llm_steps", "tool_calls",
    "tool_results", "exact_latency", "client_tool_calls", "subagents_linked",
    "abandoned_tool_calls", "results_missing", "tool_pauses", "subagent_steps",
    "subagent_waits_clipped", "human_pauses", "other_pauses", "failed_calls_between",
    "extends", "cut", "cut_tokens_dropped", "shorter_than_context", "usage_exact",
    "usage_estimated", "zero_output", "prompt_tokens", "kept_tokens", "appended_tokens",
    "output_tokens", "cached_tokens", "prefix_groups", "long_tools", "subagents_by_agent_id",
    "subagents_guessed",
)


@dataclass
class Conv:
    id: str
    calls: list[Call]  # all, by arrival
    llm: list[Call] = field(default_factory=list)  # those replayed (ended ok, with usage)
    parent: tuple[str, int] | None = None
    guessed: bool = False  # its parent guessed (from the times), not linked by its agent id
    children: dict[int, list[Conv]] = field(default_factory=dict)  # parent call -> children


@dataclass
class Rec:
    """One recording folder: its trajectories and counts."""

    path: Path
    rid: str
    started: float
    closed: bool
    truncated: bool
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    built: Counter[str] = field(default_factory=Counter)  # what the builder counted
    roots: list[Convo] = field(default_factory=list)  # its root conversations, as read
    firsts: list[tuple[Convo, Call]] = field(default_factory=list)  # each one's first call


def file_entry(r: Rec) -> dict[str, Any]:
    c = r.counts
    return {"file": str(r.path), "id": r.rid, "closed": r.closed,
            "truncated_last_line": r.truncated, "skipped_lines": dict(r.skipped),
            **{k: int(c[k]) for k in COUNTS}, **shares(c)}


def shares(c: Counter[str] | dict[str, Any]) -> dict[str, float | None]:
    return {"exact_latency_share": round(c["exact_latency"] / c["tool_calls"], 4)
            if c["tool_calls"] else None,
            "cached_share": round(c["cached_tokens"] / c["prompt_tokens"], 4)
            if c["prompt_tokens"] else None}


def recording_warnings(recs: list[Rec]) -> list[str]:
    found = (
        ("recordings not closed (the proxy was killed; what it wrote is imported)",
         [str(r.path) for r in recs if not r.closed]),
        ("recordings whose last line was cut short (left out)",
         [str(r.path) for r in recs if r.truncated]),
        ("recordings with usage estimated by the token rule (the server sent none)",
         [f"{r.path}: {r.counts['usage_estimated']}" for r in recs
          if r.counts["usage_estimated"]]),
        (f"recordings with tools slower than the default {DEFAULT_DEADLINE_S:g} s deadline "
         "(replay with an injection profile whose default_deadline_s is longer)",
         [f"{r.path}: {r.counts['long_tools']}" for r in recs if r.counts["long_tools"]]),
        ("recordings with sub-agents whose parents come back to themselves (a cycle): "
         "imported as trajectories of their own (counted in subagents_orphaned)",
         [f"{r.path}: {r.counts['subagents_cyclic']}" for r in recs
          if r.counts["subagents_cyclic"]]),
    )
    return [summarize(what, items) for what, items in found if items]


def recording_provenance(recs: list[Rec], opts: dict[str, str]) -> Provenance:
    totals: dict[str, Any] = {"files": len(recs), **summed((r.counts for r in recs), COUNTS)}
    totals.update(shares(totals))
    return Provenance(
        source_format=FORMAT,
        source_files=[str(r.path) for r in recs],
        inferred={
            "input_tokens": "the call's prompt (usage) less the previous call's prompt + "
                            "output when its blocks extend that context; else less keep_tokens",
            "keep_tokens": "where the blocks do not extend the previous context: the tokens of "
                           "the blocks both share (block estimates by the token rule, scaled to "
                           "the call's prompt); null when they do",
            "output_tokens": "the call's usage (at least 1)",
            "latency_s": "measured by the proxy: a tool's result came back in a request that "
                         "arrived latency_s after the answer ended (parallel calls: the "
                         "slowest); a user turn or other pause: the next request's arrival less "
                         "the answer's end; a subagent step: that less its last sub-agent's "
                         "end, >= 0 (0 when the parent never went on); null: never answered (the "
                         "conversation ended waiting)",
            "tool_class": "agent_tool_class(tool name); 'human' for user turns, 'subagent' "
                          f"where sub-agents started ({UNSPAWNED_CLASS!r} for a Task/agent tool "
                          "whose sub-agent is not in the recording)",
            "outcome": "'error' for a result the client marked is_error (Anthropic), "
                       "'abandoned' for a tool call never answered, else 'ok'",
            "mutating": "the tool's class is 'mutating'", "deadline_s": "null",
            "parent_id/spawn_step": "the agent id's link the proxy recorded (a new agent id "
                                    "while its session waited on an Agent or Task call: "
                                    "subagents_by_agent_id), else a conversation started while "
                                    "another waited on tool calls (subagents_guessed; "
                                    "harness.proxy.conversations)",
            "prefix_group": "trajectories whose first calls start with the same block; "
                            "prefix_tokens the estimate of the most blocks shared",
            "start_s": "the first call's arrival, relative to the earliest in the import; a "
                       "sub-agent: its root's",
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            f"block token estimates by the rule: {TOKEN_RULE}",
            "calls that did not end ok (error status, unreachable upstream, cut stream, client "
            "gone, proxy stopped) are not replayed; a tool's latency is its own, without them",
        ],
        extra={"files": [file_entry(r) for r in recs], "totals": totals},
    )
