"""The intermediate form of agent session logs (Codex rollouts, Claude Code transcripts).

A format module reads its log into conversations (`Convo`): model responses in order
(`Response`, one LLM call each, with the usage the log reports), the tool calls each made and
what became of them (`Call`), what came between two responses (a user's prompt, a compaction,
a /clear), and its file's counts (`FileStats`). agent_log_steps.Builder turns them into
trajectories. Also here: the checks of the logs' fields and the provenance they share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.userfiles import MAX_COUNT

# A sub-agent call (Task, Agent) whose conversation is not in the input: the parent still waits
# for it, minutes at a time, so it is a long job rather than a pause of the `subagent` class.
UNLINKED_SPAWN_CLASS = "long_job"


# Classes whose tools may change the environment (the `mutating` column), as in mini-swe-agent.
MUTATING_CLASSES = frozenset({"mutating", "sandbox", "long_job"})


MAX_LOG_S = 1e10  # any duration or timestamp offset a log may hold (seconds)


# Per-file counts every agent-log importer fills (0 when nothing happened); shares are added.
COUNTS = (
    "llm_calls", "llm_calls_estimated", "tool_calls", "tool_results", "exact_durations",
    "error_calls", "abandoned_calls", "hosted_calls", "subagent_calls",
    "async_subagent_calls", "subagents",
    "subagents_unlinked", "warmups", "warmups_skipped", "user_turns", "llm_steps",
    "tool_steps", "exact_latency", "approximate_latency", "latency_unknown", "human_pauses",
    "subagent_steps", "back_to_back_calls", "trailing_tools_dropped", "continuations",
    "compactions", "clears", "cuts", "cut_tokens_dropped", "output_not_resent",
    "output_raised", "output_raised_tokens", "prompt_tokens", "cached_tokens",
    "output_tokens", "appended_tokens", "kept_tokens",
)


@dataclass
class Call:
    """A tool call a response made, and what became of it."""

    call_id: str
    name: str
    ts: float | None  # when the call was logged
    result_ts: float | None = None  # when its result was logged
    has_result: bool = False
    exact_s: float | None = None  # the duration the log states
    error: bool = False
    abandoned: bool = False  # interrupted or rejected: it never returned
    spawn: bool = False  # a sub-agent call (Task, Agent)
    kind: str = ""  # a sub-agent call's agent type
    prompt: str = ""  # a sub-agent call's task (matched against sub-agents' first prompts)
    agent_id: str = ""  # the sub-agent its result names
    result_tokens: int = 0  # tokens counted in its result
    children: list[Convo] = field(default_factory=list)


@dataclass
class Response:
    """One model response: one LLM call."""

    line: int
    prompt: int | None  # tokens of its prompt (None: the log has no usage for it)
    output: int  # output tokens the log reports
    cached: int | None  # prompt tokens the provider's cache served
    start_ts: float | None
    end_ts: float | None
    counted_in: int = 0  # tokens counted in what was appended before it (no usage: estimate)
    counted_out: int = 0  # tokens counted in its own output
    calls: list[Call] = field(default_factory=list)
    user_turn: bool = False  # the user's prompt came before it
    user_ts: float | None = None  # when (None: the log has no time)
    cut: str | None = None  # "compaction" or "clear" before it


@dataclass
class FileStats:
    """What one log file held, for the provenance."""

    path: Path
    ident: str = ""
    version: str = ""
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def entry(self) -> dict[str, Any]:
        """This file's provenance entry: its counts, the shares, lines skipped by type."""
        c = self.counts
        return {"file": str(self.path), "id": self.ident, "version": self.version,
                **{k: int(c[k]) for k in COUNTS}, **shares(c),
                "skipped_lines": dict(sorted(self.skipped.items()))}


@dataclass
class Convo:
    """A conversation: a session, a sub-agent's or a warm-up's, with its file's counts."""

    key: str
    stats: FileStats
    responses: list[Response] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None
    kind: str = "main"  # prefix group: main, a sub-agent type, warmup


def shares(c: Counter[str] | dict[str, int]) -> dict[str, float | None]:
    """The exact share of tool latencies and the cached share of prompt tokens."""
    steps = c["exact_latency"] + c["approximate_latency"] + c["latency_unknown"]
    return {"exact_latency_share": round(c["exact_latency"] / steps, 4) if steps else None,
            "cached_share": (round(c["cached_tokens"] / c["prompt_tokens"], 4)
                             if c["prompt_tokens"] else None)}


def totals(files: Sequence[FileStats], extra: dict[str, int]) -> dict[str, Any]:
    """The sums of the files' counts, their shares and skipped lines, with `extra` first."""
    summed: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for f in files:
        summed.update({k: f.counts[k] for k in COUNTS})
        skipped.update(f.skipped)
    return {**extra, **{k: int(summed[k]) for k in COUNTS}, **shares(summed),
            "skipped_lines": dict(sorted(skipped.items()))}


def parse_ts(value: Any, where: str) -> float | None:
    """An ISO 8601 timestamp as Unix seconds (None when absent); InputError when malformed."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if dt.tzinfo is None:  # no zone written: taken as UTC, like the logs' own
                dt = dt.replace(tzinfo=UTC)
            return dt.timestamp()
        except (ValueError, OverflowError, OSError):
            pass
    raise InputError(f"{where}: 'timestamp' must be an ISO 8601 time, got {value!r}")


def count_field(obj: dict[str, Any], key: str, where: str) -> int | None:
    """A token count (None when absent); InputError naming `where` and the field when bad."""
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < MAX_COUNT:
        raise InputError(f"{where}: {key!r} must be an integer >= 0, got {v!r}")
    return v


def seconds_field(v: Any, where: str, key: str, scale: float = 1.0) -> float | None:
    """A duration (None when absent), scaled to seconds; InputError when not a finite >= 0."""
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool):
        s = float(v) * scale
        if math.isfinite(s) and 0 <= s <= MAX_LOG_S:
            return s
    raise InputError(f"{where}: {key!r} must be a duration >= 0, got {v!r}")


def raise_outputs(responses: list[Response], stats: FileStats) -> None:
    """Raise a logged output that is less than half of what its own content counts (Claude
    Code often logs the output of the stream's first event, e.g. 1) to that count, but never
    past what the next prompt grew by less what came back in between: the context stays what
    the log says."""
    for i, r in enumerate(responses):
        if r.counted_out <= 2 * r.output or r.prompt is None:
            continue
        cap = r.counted_out
        nxt = responses[i + 1] if i + 1 < len(responses) else None
        if nxt is not None and nxt.prompt is not None and nxt.cut is None:
            cap = min(cap, max(r.output, nxt.prompt - r.prompt - nxt.counted_in))
        if cap > r.output:
            stats.counts["output_raised"] += 1
            stats.counts["output_raised_tokens"] += cap - r.output
            r.output = cap


def inferred_fields(fmt: str) -> dict[str, str]:
    """provenance.inferred entries both agent-log importers share."""
    return {
        "input_tokens": "the prompt the log reports less the previous call's prompt and "
                        "output; after a cut, less keep_tokens; a call without usage: the "
                        "tokens counted in what was appended before it (llm_calls_estimated)",
        "keep_tokens": "null while each prompt holds the previous prompt and output; a prompt "
                       "below that keeps the previous prompt when it still holds it (output "
                       "not sent back, e.g. thinking), else the call's cached tokens (what "
                       "the provider's cache reused); after a compaction or /clear: the "
                       "cached tokens",
        "latency_s": "the duration the log states where it has one (exact_latency), else the "
                     "wall time from the later of the call and the end of its response to "
                     "its result (approximate_latency); parallel calls: the slowest; a human "
                     "pause: from the last model output to the user's prompt; a subagent "
                     "step: from the last sub-agent's end to the end of the pause (>= 0); "
                     "null: the call never returned (no result, interrupted or rejected)",
        "tool_class": "agent_tool_class(tool name); a sub-agent call whose conversation is "
                      f"not in the input: {UNLINKED_SPAWN_CLASS!r}; several calls of one "
                      "response: the slowest call's",
        "mutating": f"the class is one of {', '.join(sorted(MUTATING_CLASSES))}",
        "outcome": "'abandoned' for a call that never returned, 'error' for a result the "
                   "log marks as failed, else 'ok'",
        "start_s": "the session's first logged time less the earliest in the import (0 "
                   "without times); a sub-agent: its root's; a continuation: its user's "
                   "prompt",
        "prefix_tokens": f"the first call's cached tokens (group '{fmt}/<kind>': main, a "
                         "sub-agent type or warmup); none when the first call had no cache "
                         "hit",
        "deadline_s": "null",
    }
