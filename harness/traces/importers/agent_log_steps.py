"""Agent session logs (Codex rollouts, Claude Code transcripts) as trajectories.

Both importers parse their log into conversations (agent_log.py): model responses in order
(one LLM call each, with the usage the log reports), the tool calls each response made and what
became of them, and what came between two responses (a user's prompt, a compaction, a /clear).
This module turns such a conversation into trajectory steps, the same way for both formats:

- LLM step i appends P_i - (P_{i-1} + O_{i-1}) tokens (P the prompt the log reports, O the
  output). A prompt below that sum is a context cut: it keeps the previous prompt when it still
  holds it (output that was not sent back, e.g. thinking), else what the provider's cache reused
  (the cached-token count: the part of the context that survived); after a compaction or a
  /clear always the cached count.
- the calls of one response are one pause (merge_parallel); a Task-like call whose sub-agent
  conversation is in the input is a `subagent` step starting the children; the user's prompt
  is a `human` pause; a call that never returned ends its trajectory (the replay cancels a
  trajectory at a tool that never returns), and what the session did next is a continuation
  trajectory of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from harness.traces.importers._common import LLM, Tool, Trajectory
from harness.traces.importers.agent_log import (
    MUTATING_CLASSES,
    UNLINKED_SPAWN_CLASS,
    Call,
    Convo,
    Response,
)
from harness.traces.importers.agent_tools import agent_tool_class, merge_parallel
from harness.traces.importers.prompts import cut_keep, prompt_step
from harness.traces.schema import TOOL_SUBAGENT


@dataclass
class _Piece:
    tid: str
    steps: list[LLM | Tool]
    start_ts: float | None
    cached0: int | None = None


@dataclass
class Built:
    """Trajectories made from one root conversation (its continuations and sub-agents)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    start_ts: dict[str, float | None] = field(default_factory=dict)  # roots' first times


class Builder:
    """Turns conversations into trajectories; `fmt` names prefix groups ('codex/main')."""

    def __init__(self, fmt: str, taken: set[str]) -> None:
        self.fmt = fmt
        self.taken = taken
        self.timing: dict[int, str] = {}  # id(tool step) -> exact, approximate or unknown

    def unique(self, tid: str) -> str:
        """`tid`, or `tid-2`, `tid-3`, ... when an earlier trajectory took it."""
        out, k = tid, 2
        while out in self.taken:
            out, k = f"{tid}-{k}", k + 1
        self.taken.add(out)
        return out

    def build(self, convo: Convo, out: Built, parent: tuple[Tool, dict[int, tuple[str, int]]]
              | None = None) -> None:
        """Append `convo`'s trajectories to `out`: the conversation, its continuations after
        calls that never returned, then its sub-agents (each after its parent)."""
        c = convo.stats.counts
        pieces: list[_Piece] = [_Piece(self.unique(convo.key), [], convo.first_ts)]
        spawns: list[tuple[Tool, list[Convo]]] = []
        prev: Response | None = None
        ctx: tuple[int, int] | None = None  # the previous call's prompt and output
        for r in convo.responses:
            if prev is not None:
                pause = self._pause(prev, r, c, spawns)
                pieces[-1].steps.append(pause)
                if pause.latency_s is None:  # never returned: the trajectory ends here
                    c["continuations"] += 1
                    base = pieces[0].tid
                    pieces.append(_Piece(self.unique(f"{base}~{len(pieces) + 1}"), [],
                                         r.user_ts if r.user_ts is not None else r.start_ts))
                    ctx = None
            step, ctx = self._llm(r, ctx, c)
            if not pieces[-1].steps:
                pieces[-1].cached0 = r.cached
            pieces[-1].steps.append(step)
            prev = r
        if prev is not None and prev.calls:
            last = self._trailing(prev, c, spawns)
            if last is not None:
                pieces[-1].steps.append(last)
        where: dict[int, tuple[str, int]] = {}
        for p in pieces:
            for i, s in enumerate(p.steps):
                where[id(s)] = (p.tid, i)
        for k, p in enumerate(pieces):
            if not p.steps:
                continue
            first = p.steps[0]
            assert isinstance(first, LLM)
            pre = min(p.cached0 or 0, first.input_tokens)
            child = parent is not None and k == 0
            group = f"{self.fmt}/{convo.kind}"
            t = Trajectory(p.tid, p.steps, prefix_group=group if pre else None,
                           prefix_tokens=pre or None)
            if child:
                assert parent is not None
                t.parent_id, t.spawn_step = parent[1][id(parent[0])]
            else:
                out.start_ts[p.tid] = p.start_ts
            out.trajectories.append(t)
        for tool, kids in spawns:
            for kid in kids:
                self.build(kid, out, (tool, where))

    def _llm(self, r: Response, ctx: tuple[int, int] | None, c: Counter[str]
             ) -> tuple[LLM, tuple[int, int]]:
        out = max(r.output, 1)
        c["llm_steps"] += 1
        c["output_tokens"] += out
        if r.prompt is None:  # no usage: what was appended, counted from the text
            c["llm_calls_estimated"] += 1
            prompt = (sum(ctx) if ctx else 0) + r.counted_in
            c["appended_tokens"] += r.counted_in
            c["kept_tokens"] += prompt - r.counted_in
            return LLM(r.counted_in, out), (prompt, out)
        p = r.prompt
        c["prompt_tokens"] += p
        c["cached_tokens"] += min(r.cached or 0, p)
        keep: int | None = None
        whole = sum(ctx) if ctx else 0
        if ctx is not None and (r.cut is not None or p < whole):
            if r.cut is not None:  # what stays is what the provider found cached
                c["compactions" if r.cut == "compaction" else "clears"] += 1
            else:
                c["output_not_resent" if p >= ctx[0] else "cuts"] += 1
            keep, _ = cut_keep(p, 0 if r.cut is not None else ctx[0], whole, r.cached)
            c["cut_tokens_dropped"] += whole - keep
        step = prompt_step(p, out, whole, keep)
        c["appended_tokens"] += step.input_tokens
        c["kept_tokens"] += p - step.input_tokens
        return step, (p, out)

    def _call_tool(self, call: Call, start: float | None, c: Counter[str]) -> Tool:
        """One call as a tool step: the exact duration where the log states one, else the
        wall time from the later of the call and its response's end to its result."""
        cls = agent_tool_class(call.name)
        if cls == TOOL_SUBAGENT:  # its sub-agent is not in the input
            cls = UNLINKED_SPAWN_CLASS
        outcome = "error" if call.error else "ok"
        latency: float | None
        if call.abandoned or not call.has_result:
            latency, timing, outcome = None, "never", "abandoned"
        elif call.exact_s is not None:
            latency, timing = call.exact_s, "exact"
        elif call.result_ts is not None and (start is not None or call.ts is not None):
            begin = max(t for t in (start, call.ts) if t is not None)
            latency, timing = max(0.0, call.result_ts - begin), "approximate"
        else:  # a log without times: nothing says how long it took
            latency, timing = 0.0, "unknown"
        tool = Tool(call.name, cls, None if latency is None else round(latency, 6), outcome,
                    cls in MUTATING_CLASSES)
        self.timing[id(tool)] = timing
        return tool

    def _calls_step(self, prev: Response, c: Counter[str]) -> Tool:
        tools = [self._call_tool(k, prev.end_ts, c) for k in prev.calls]
        merged = merge_parallel(tools)
        c["tool_steps"] += 1
        timings = {self.timing[id(t)] for t in tools}
        if merged.latency_s is not None:  # a step that never returns has no latency to count
            c["exact_latency" if timings == {"exact"} else "latency_unknown"
              if "unknown" in timings else "approximate_latency"] += 1
        return merged

    def _spawn_step(self, prev: Response, end: float | None, c: Counter[str],
                    spawns: list[tuple[Tool, list[Convo]]]) -> Tool:
        """The calls of a response that started sub-agents: one `subagent` step, whose
        latency is the time from the last child's end to the end of the pause."""
        kids = [k for call in prev.calls for k in call.children]
        ends = [k.last_ts for k in kids if k.last_ts is not None]
        ends_at = [t for t in [end, *(k.result_ts for k in prev.calls)] if t is not None]
        wait = max(0.0, max(ends_at) - max(ends)) if ends and ends_at else 0.0
        names = [k.kind or k.name for k in prev.calls if k.children]
        tool = Tool("+".join(dict.fromkeys(names)), TOOL_SUBAGENT, round(wait, 6))
        c["subagent_steps"] += 1
        spawns.append((tool, kids))
        return tool

    def _pause(self, prev: Response, r: Response, c: Counter[str],
               spawns: list[tuple[Tool, list[Convo]]]) -> Tool:
        """The pause between two responses."""
        if any(k.children for k in prev.calls):
            return self._spawn_step(prev, r.user_ts, c, spawns)
        if prev.calls and any(k.abandoned or not k.has_result for k in prev.calls):
            return self._calls_step(prev, c)
        results = [k.result_ts for k in prev.calls if k.result_ts is not None]
        if r.user_turn and (not results or r.user_ts is None or r.user_ts >= max(results)):
            # The user's prompt ended the pause (after any results came back).
            c["human_pauses"] += 1
            wait = 0.0
            if prev.end_ts is not None and r.user_ts is not None:
                wait = max(0.0, r.user_ts - prev.end_ts)
            return Tool("user", "human", round(wait, 6))
        if prev.calls:
            return self._calls_step(prev, c)
        # Nothing logged between two calls (a retried or continued response): an instant step
        # keeps LLM and tool steps alternating.
        c["back_to_back_calls"] += 1
        return Tool("none", "local_read", 0.0)

    def _trailing(self, prev: Response, c: Counter[str],
                  spawns: list[tuple[Tool, list[Convo]]]) -> Tool | None:
        """The last response's calls: kept when they started sub-agents or never returned;
        calls whose results nobody read are dropped."""
        if any(k.children for k in prev.calls):
            return self._spawn_step(prev, None, c, spawns)
        if any(k.abandoned or not k.has_result for k in prev.calls):
            return self._calls_step(prev, c)
        c["trailing_tools_dropped"] += len(prev.calls)
        return None


def assign_starts(built: Built, priority: str, tenant: str) -> None:
    """start_s of every root from its first logged time, relative to the earliest root of the
    import (0 where a log has no times); a sub-agent takes its parent's."""
    known = [t for t in built.start_ts.values() if t is not None]
    t0 = min(known) if known else 0.0
    start: dict[str, float] = {}
    for t in built.trajectories:
        if t.parent_id is None:
            ts = built.start_ts.get(t.trajectory_id)
            t.start_s = 0.0 if ts is None else round(max(0.0, ts - t0), 6)
        else:
            t.start_s = start[t.parent_id]
        start[t.trajectory_id] = t.start_s
        t.priority, t.tenant = priority, tenant


