"""What the agent session logs (Codex rollouts, Claude Code transcripts) share on the way to
the intermediate form (form.py): their files' counts (`FileStats`), the checks of their fields,
how their tool calls and pauses are timed (`measure`: from the logged times, since the logs
state few durations) and the provenance they share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers._common import quote, summarize
from harness.traces.importers.agent_tools import UNLINKED_SPAWN_CLASS, call_class
from harness.traces.importers.form import (
    APPROXIMATE,
    EXACT,
    UNKNOWN,
    Call,
    Convo,
    Pause,
    Response,
)
from harness.userfiles import MAX_COUNT

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
                **{k: int(c[k]) for k in COUNTS}, **skew(c), **shares(c),
                "skipped_lines": dict(sorted(self.skipped.items()))}


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
    summed["clock_skew"] = sum(f.counts["clock_skew"] for f in files)
    return {**extra, **{k: int(summed[k]) for k in COUNTS}, **skew(summed), **shares(summed),
            "skipped_lines": dict(sorted(skipped.items()))}


def skew(c: Counter[str]) -> dict[str, int]:
    """{'clock_skew': n} where n > 0 pauses were timed from times that run backwards (taken
    as 0 s), else nothing: a log whose times run forward keeps its entry as it was."""
    return {"clock_skew": int(c["clock_skew"])} if c["clock_skew"] else {}


def skew_warning(files: Sequence[FileStats]) -> list[str]:
    """The warning line for the files whose times run backwards (none when no file's do)."""
    items = [f"{f.path}: {f.counts['clock_skew']}" for f in files if f.counts["clock_skew"]]
    return [summarize("files with times that run backwards (clock skew): pauses timed from "
                      "them taken as 0 s", items)] if items else []


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
    raise InputError(f"{where}: 'timestamp' must be an ISO 8601 time, got {quote(value)}")


def count_field(obj: dict[str, Any], key: str, where: str) -> int | None:
    """A token count (None when absent); InputError naming `where` and the field when bad."""
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < MAX_COUNT:
        raise InputError(f"{where}: {key!r} must be an integer >= 0, got {quote(v)}")
    return v


def seconds_field(v: Any, where: str, key: str, scale: float = 1.0) -> float | None:
    """A duration (None when absent), scaled to seconds; InputError when not a finite >= 0."""
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool):
        s = float(v) * scale
        if math.isfinite(s) and 0 <= s <= MAX_LOG_S:
            return s
    raise InputError(f"{where}: {key!r} must be a duration >= 0, got {quote(v)}")


def count_calls(calls: Iterable[Call], c: Counter[str]) -> None:
    """The counts of tool calls' fates: results, exact durations, abandoned, errors."""
    for k in calls:
        c["tool_results"] += k.has_result
        c["exact_durations"] += k.has_result and k.exact_s is not None
        c["abandoned_calls"] += k.abandoned or not k.has_result
        c["error_calls"] += k.error and not k.abandoned


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


def measure(convo: Convo, fmt: str) -> None:
    """Time each pause of `convo` and its sub-agents from the log's times (the builder replays
    what this writes into the form), and name their prefix groups ('<fmt>/<kind>')."""
    convo.prefix_group = f"{fmt}/{convo.kind}"
    rs = convo.responses
    for i, r in enumerate(rs):
        r.after = _pause(r, rs[i + 1] if i + 1 < len(rs) else None, convo.counts)
        for kid in (kid for k in r.calls for kid in k.children):
            measure(kid, fmt)


def _pause(prev: Response, nxt: Response | None, c: Counter[str]) -> Pause:
    """The pause after `prev` (`nxt`: the next response, None after the last); a time that
    runs backwards is taken as 0 s and counted in `c` ('clock_skew')."""
    if any(k.children for k in prev.calls):
        # Sub-agents: the time from the last one's end to the end of the pause.
        kids = [kid for k in prev.calls for kid in k.children]
        ends = [kid.last_ts for kid in kids if kid.last_ts is not None]
        end = nxt.user_ts if nxt is not None else None
        ends_at = [t for t in [end, *(k.result_ts for k in prev.calls)] if t is not None]
        wait = max(0.0, max(ends_at) - max(ends)) if ends and ends_at else 0.0
        return Pause(children=kids, names=[k.kind or k.name for k in prev.calls if k.children],
                     latency_s=wait)
    for k in prev.calls:
        _time_call(k, prev.end_ts, c)
    results = [k.result_ts for k in prev.calls if k.result_ts is not None]
    if nxt is not None and nxt.user_turn and (not results or nxt.user_ts is None
                                              or nxt.user_ts >= max(results)):
        # The user's prompt ended the pause (after any results came back).
        wait = 0.0
        if prev.end_ts is not None and nxt.user_ts is not None:
            wait = _elapsed(prev.end_ts, nxt.user_ts, c)
        return Pause(prev.calls, human=True, latency_s=wait)
    return Pause(prev.calls)


def _elapsed(start: float, end: float, c: Counter[str]) -> float:
    """Seconds from `start` to `end`; 0 when the log's times run backwards (counted)."""
    if end < start:
        c["clock_skew"] += 1
        return 0.0
    return end - start


def _time_call(call: Call, start: float | None, c: Counter[str]) -> None:
    """A call's latency: the duration the log states where it has one, else the wall time
    from the later of the call and its response's end (`start`) to its result."""
    call.cls = call_class(call.name)
    call.mutating = call.cls in MUTATING_CLASSES
    if call.abandoned or not call.has_result:
        call.latency_s = None
    elif call.exact_s is not None:
        call.latency_s, call.timing = round(call.exact_s, 6), EXACT
    elif call.result_ts is not None and (start is not None or call.ts is not None):
        begin = max(t for t in (start, call.ts) if t is not None)
        # A result logged before its call is clock skew; one logged while the response was
        # still being written (before its end, after the call) is not: both time as 0 s.
        made = call.ts if call.ts is not None else begin
        call.latency_s = round(max(0.0, call.result_ts - begin), 6)
        c["clock_skew"] += call.result_ts < made
        call.timing = APPROXIMATE
    else:  # a log without times: nothing says how long it took
        call.latency_s, call.timing = 0.0, UNKNOWN
