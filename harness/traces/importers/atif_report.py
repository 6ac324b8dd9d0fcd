"""What an ATIF import records about itself: per-file counts, totals, inferred fields, warnings."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from harness.traces.importers._common import share, summarize
from harness.traces.importers.atif_read import Doc
from harness.traces.importers.builder import ENDING_TOOLS
from harness.traces.schema import GAP_TOOL, Provenance
from harness.userfiles import TOKEN_RULE

# Every count of a file's entry (0 when nothing happened).
COUNTS = (
    "llm_calls", "tool_calls", "tool_results", "exact_latency", "approx_latency",
    "latency_inferred", "abandoned", "errors", "subagents", "subagents_missing",
    "subagents_before_first_call", "user_turns", "human_pauses", "human_latency_timed",
    "human_latency_inferred", "tool_pauses", "parallel_pauses", "gap_pauses", "subagent_steps",
    "trailing_tools_dropped", "tool_calls_before_first_call", "copied_steps", "continuations",
    "continuations_missing", "dispatch_steps", "aggregated_calls", "empty_trajectories",
    "context_cuts", "cuts_declared", "cuts_keep_cached", "cuts_keep_previous_prompt",
    "cuts_keep_none", "prompt_tokens", "cached_tokens", "calls_with_cached", "kept_tokens",
    "appended_tokens", "output_tokens", "prompt_estimated", "output_estimated", "zero_output",
)


def _entry(c: Counter[str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: int(c[k]) for k in COUNTS}
    if c["clock_skew"]:  # only where timestamps ran backwards: other entries stay as they were
        out["clock_skew"] = int(c["clock_skew"])
    out["exact_latency_share"] = share(c["exact_latency"], c["tool_calls"])
    out["cached_share"] = share(c["cached_tokens"], c["prompt_tokens"])
    return out


def warnings(counts: dict[Path, Counter[str]], skipped: list[str]) -> list[str]:
    """Lines to show after the import."""
    found = (
        ("files whose tool latencies are not in the log (no timestamps): set by the options "
         "tool_latency / tool_latencies",
         [f"{p}: {c['latency_inferred']}" for p, c in counts.items() if c["latency_inferred"]]),
        ("files with sub-agent references whose trajectory was not found (replayed as a plain "
         "tool step)",
         [f"{p}: {c['subagents_missing']}" for p, c in counts.items()
          if c["subagents_missing"]]),
        ("files with tool calls that have no result and nothing after them (abandoned)",
         [f"{p}: {c['abandoned']}" for p, c in counts.items() if c["abandoned"]]),
        ("files with timestamps that run backwards (clock skew): gaps timed from them taken "
         "as 0 s", [f"{p}: {c['clock_skew']}" for p, c in counts.items() if c["clock_skew"]]),
        ("JSON files of the folders that are not ATIF trajectories (skipped)", skipped),
        ("files with no model call (nothing replayed from them)",
         [str(p) for p, c in counts.items() if not c["llm_calls"]]),
    )
    return [summarize(what, items) for what, items in found if items]


def provenance(fmt: str, docs: list[Doc], counts: dict[Path, Counter[str]],
               opts: dict[str, str], skipped: list[str]) -> Provenance:
    """The import's provenance: one entry per file (files another references included)."""
    versions: dict[Path, str] = {d.path: d.version for d in docs}
    finals: dict[Path, dict[str, Any]] = {}
    for d in docs:
        fm = d.data.get("final_metrics")
        if isinstance(fm, dict):  # as the log states them (Harbor adds its sub-agents' in)
            finals[d.path] = {k: v for k, v in fm.items() if isinstance(v, int)
                              and not isinstance(v, bool)}
    per = [{"file": str(p), "version": versions.get(p, "ATIF (referenced)"), **_entry(c),
            "final_metrics": finals.get(p, {})} for p, c in counts.items()]
    total: Counter[str] = Counter()
    for c in counts.values():
        total.update(c)
    totals = {"files": len(counts), "skipped_files": len(skipped), **_entry(total)}
    return Provenance(
        source_format=fmt,
        source_files=[str(p) for p in counts],
        inferred={
            "input_tokens": "each agent step's metrics.prompt_tokens less the context before "
                            "it (previous prompt + output); a step without metrics: the context "
                            f"so far + the text appended since the last call, by {TOKEN_RULE} "
                            "(prompt_estimated)",
            "output_tokens": "metrics.completion_tokens (at least 1); without metrics, the token "
                             "rule on the step's message, reasoning and tool calls",
            "keep_tokens": "null while each prompt extends the one before; a smaller prompt (or "
                           "a system step whose extra.context_management boundary is replace or "
                           "truncate) is a cut keeping metrics.cached_tokens, or the previous "
                           "prompt when the new one is at least that long, else 0",
            "latency_s": "with step timestamps: the gap from the agent step to the next step "
                         "(approximate: it can include the next model call); without them: "
                         f"option tool_latency ({opts['tool_latency']} s) or tool_latencies "
                         "(latency_inferred); a user's turn: the gap, else option human_latency "
                         f"({opts['human_latency']} s); '{GAP_TOOL}' (a model call right after "
                         "another): the gap, else 0; a subagent step: from its last sub-"
                         "agent's last step to the step after the one that started them, else "
                         "the longest latency of the calls made with them; a call with no "
                         "result and nothing after it: never returns",
            "tool_name": "tool_calls[].function_name; several calls of one step joined with "
                         "'+'; a subagent step: the sub-agents' agent.name",
            "tool_class": "agent_tool_class of the name; 'subagent' where sub-agents start; "
                          f"'human' for a user's turn; 'local_read' for '{GAP_TOOL}'",
            "outcome": "'error' where a result's content starts with error/exception or holds a "
                       "traceback, or its extra.is_error is true (read, never stored)",
            "mutating": "the tool's class is 'mutating'", "deadline_s": "null",
            "trajectory_id": "trajectory_id, else session_id, else the file name; '/<file>' "
                             "added where several files share one; a sub-agent: "
                             "'<parent>/<its id>'",
            "prefix_group": "a sub-agent that starts with a copy of its parent's first steps "
                            "(is_copied_context) shares a prefix group with it: the parent's "
                            "first prompt, the child's prompt that held the copied steps",
            "start_s": "the first step's timestamp relative to the earliest of the import "
                       "(0 without timestamps); a sub-agent: its root's",
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            "each agent step is one model call (llm_call_count > 1: metrics of several calls, "
            "replayed as one; 0: a dispatch without a model call, its tools join the pause)",
            "a sub-agent's steps marked is_copied_context are its starting context (in its "
            "first prompt), not calls; a continued trajectory is read as one",
            "sub-agents named in one step start together (Harbor's summarisation runs its "
            "three one after another)",
            f"ending tools ({', '.join(sorted(ENDING_TOOLS))}) and results after the last "
            "model call are dropped (trailing_tools_dropped)",
        ],
        extra={"files": per, "totals": totals},
    )
