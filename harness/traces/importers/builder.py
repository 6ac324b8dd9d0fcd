"""Conversations (form.py) as trajectories: the one builder of the agent-trace importers.

- LLM step i appends P_i - (P_{i-1} + O_{i-1}) tokens (P the prompt, O the output; prompts.py).
  A prompt below that sum, or one after a compaction or /clear the source declares, is a cut:
  it keeps the previous prompt when it still holds it (output that was not sent back, e.g.
  thinking), else what the provider's cache reused; after a declared cut only the cache says
  what stayed. Where the source says what a prompt keeps (`Response.keep`: shared hash
  blocks), the step keeps that and appends the rest, cut or not. A response without a prompt
  count takes its estimate (never cutting a counted context), else the context so far plus
  what was appended since.
- The calls of one response are one pause (`merge_parallel`; its wall time where the source
  has one); sub-agents started in a pause are one `subagent` step starting the children; the
  user's prompt is a `human` pause; nothing between two responses is an instant gap step.
- A call that never returned ends its trajectory (the replay cancels a trajectory at a tool
  that never returns); what the conversation did next is a continuation trajectory (`~2`).
  After the last response, a pause is kept only when it started sub-agents or a call never
  returned (ending tools excepted), or, for a source that saw the agent wait on them
  (`keep_trailing`), when it made calls; results nobody read are dropped (counted).

What the builder does is counted in each conversation's `counts` under the names of `COUNTED`;
a format publishing other names for them maps them with `publish`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.traces.importers._common import LLM, Tool, Trajectory
from harness.traces.importers.agent_tools import merge_parallel
from harness.traces.importers.form import EXACT, INFERRED, UNKNOWN, Convo, Pause, Response
from harness.traces.importers.prompts import cut_keep, prompt_step
from harness.traces.schema import GAP_TOOL, TOOL_SUBAGENT

# Tools whose call ends the run by design: with no model call after them nothing waits for
# their result, so a trailing one is dropped rather than replayed as never returning.
ENDING_TOOLS = frozenset({
    "finish", "final_answer", "final_output", "mark_task_complete", "task_complete",
    "submit", "attempt_completion", "complete_task", "done",
})

COUNTED = {
    "llm_steps": "LLM steps", "llm_calls_estimated": "responses without a prompt count",
    "prompt_tokens": "counted prompts' tokens", "prompt_tokens_estimated": "estimated prompts'",
    "output_tokens": "output tokens (at least 1 a step)", "zero_output": "outputs of 0",
    "cached_tokens": "cached tokens (at most the prompt)", "calls_with_cached": "with a count",
    "appended_tokens": "tokens the steps append", "kept_tokens": "tokens they keep",
    "compactions": "declared cuts: compactions", "clears": "declared cuts: /clear",
    "cuts_declared": "declared cuts", "context_cuts": "cuts, declared or not",
    "cuts": "undeclared cuts below the previous prompt",
    "output_not_resent": "undeclared cuts that keep the previous prompt",
    "cuts_keep_cached": "cuts keeping the cached tokens",
    "cuts_keep_previous_prompt": "cuts keeping the previous prompt",
    "cuts_keep_none": "cuts keeping nothing", "cut_tokens_dropped": "tokens cuts dropped",
    "kept_tokens_given": "tokens kept where the source says what stays (Response.keep)",
    "tool_steps": "steps of tool calls", "parallel_pauses": "of several calls",
    "exact_latency": "tool steps all of whose calls are timed exactly",
    "approximate_latency": "tool steps timed approximately",
    "latency_unknown": "tool steps with a call of unknown latency",
    "subagent_steps": "steps starting sub-agents", "subagents_built": "child trajectories",
    "human_pauses": "user's turns", "back_to_back_calls": "gaps: nothing between two calls",
    "trailing_tools_dropped": "calls after the last response nobody waited for",
    "continuations": "calls that never returned mid-conversation",
    "acts": "tool calls", "acts_answered": "with a result", "acts_exact": "timed exactly",
    "acts_approximate": "timed approximately", "acts_inferred": "timed by an option",
    "acts_unknown": "of unknown latency", "acts_abandoned": "never returned",
    "acts_error": "failed",
}


def publish(c: Counter[str], names: Mapping[str, tuple[str, ...]],
            built: Counter[str] | None = None) -> None:
    """Set each published count `name` to the sum of the builder's counts it names (in
    `built`, else in `c` itself)."""
    src = c if built is None else built
    for name, sources in names.items():
        c[name] = sum(src[s] for s in sources)


@dataclass
class _Piece:
    tid: str
    steps: list[LLM | Tool]
    start_ts: float | None
    first: Response | None = None


@dataclass
class Built:
    """Trajectories made from root conversations (with their continuations and sub-agents),
    each root's first time, and each trajectory's root."""

    trajectories: list[Trajectory] = field(default_factory=list)
    start_ts: dict[str, float | None] = field(default_factory=dict)  # roots' first times
    root: dict[str, str] = field(default_factory=dict)
    convo: dict[str, Convo] = field(default_factory=dict)  # each trajectory's conversation


class Builder:
    """Turns conversations into trajectories (a call right after a call gets a GAP_TOOL step);
    `ending` names the tools a run ends with (lower case); `keep_trailing`: a trailing step of
    calls is kept even when every call returned (the source saw the agent wait on them)."""

    def __init__(self, ending: frozenset[str] = frozenset(),
                 keep_trailing: bool = False) -> None:
        self.ending, self.keep_trailing = ending, keep_trailing
        self.taken: set[str] = set()

    def unique(self, tid: str) -> str:
        """`tid`, or `tid-2`, `tid-3`, ... when an earlier trajectory took it."""
        out, k = tid, 2
        while out in self.taken:
            out, k = f"{tid}-{k}", k + 1
        self.taken.add(out)
        return out

    def build(self, convo: Convo, out: Built,
              parent: tuple[Tool, dict[int, tuple[str, int]], Convo] | None = None) -> None:
        """Append `convo`'s trajectories to `out`: the conversation, its continuations after
        calls that never returned, then its sub-agents (each after its parent)."""
        c = convo.counts
        key = convo.key
        if parent is not None and convo.under_parent:
            key = f"{parent[1][id(parent[0])][0]}/{key}"
        pieces = [_Piece(self.unique(key), [], convo.first_ts)]
        spawns: list[tuple[Tool, list[Convo]]] = []
        ctx: _Ctx | None = None
        rs = convo.responses
        for i, r in enumerate(rs):
            if i:
                step = self._pause(rs[i - 1].after, c, False, spawns)
                assert step is not None
                pieces[-1].steps.append(step)
                if step.latency_s is None:  # never returned: the trajectory ends here
                    c["continuations"] += 1
                    pieces.append(_Piece(self.unique(f"{pieces[0].tid}~{len(pieces) + 1}"), [],
                                         r.user_ts if r.user_ts is not None else r.start_ts))
                    ctx = None
            llm, ctx = _llm(r, ctx, c)
            pieces[-1].first = pieces[-1].first or r
            pieces[-1].steps.append(llm)
        if rs:
            last = self._pause(rs[-1].after, c, True, spawns)
            if last is not None:
                pieces[-1].steps.append(last)
        where = {id(s): (p.tid, i) for p in pieces for i, s in enumerate(p.steps)}
        for k, p in enumerate(pieces):
            if not p.steps or p.first is None:
                continue
            first = p.steps[0]
            assert isinstance(first, LLM)
            t = Trajectory(p.tid, p.steps)
            if convo.prefix_group is not None:
                given = convo.prefix_tokens
                pre = min((p.first.cached if given is None else given) or 0, first.input_tokens)
                t.prefix_group, t.prefix_tokens = (convo.prefix_group, pre) if pre else (None,
                                                                                         None)
            if parent is not None and k == 0:
                t.parent_id, t.spawn_step = parent[1][id(parent[0])]
                out.root[p.tid] = out.root[t.parent_id]
                parent[2].counts["subagents_built"] += 1
            else:
                out.start_ts[p.tid] = p.start_ts
                out.root[p.tid] = p.tid
            out.convo[p.tid] = convo
            out.trajectories.append(t)
        for tool, kids in spawns:
            for kid in kids:
                self.build(kid, out, (tool, where, convo))

    def _pause(self, p: Pause, c: Counter[str], last: bool,
               spawns: list[tuple[Tool, list[Convo]]]) -> Tool | None:
        """The step of pause `p` (`last`: after the last response; None: nothing to replay)."""
        if p.children:
            c["subagent_steps"] += 1
            _count_calls(p, c, True)
            tool = Tool("+".join(dict.fromkeys(p.names)), TOOL_SUBAGENT,
                        round(p.latency_s or 0.0, 6), "error" if any(
                            k.error for k in p.calls) else "ok", any(k.mutating for k in p.calls))
            spawns.append((tool, p.children))
            return tool
        never = any(k.latency_s is None for k in p.calls)
        if last:
            if p.calls and not self.keep_trailing and not any(
                    k.latency_s is None and k.name.lower() not in self.ending for k in p.calls):
                c["trailing_tools_dropped"] += len(p.calls)
                _count_calls(p, c, False)
                return None
            return self._calls(p, c) if p.calls else None
        if never or (p.calls and not p.human):
            return self._calls(p, c)
        if p.human:
            c["human_pauses"] += 1
            return Tool(p.name or "user", "human", round(p.latency_s or 0.0, 6))
        # Nothing between two calls (a retried or continued response): an instant step keeps
        # LLM and tool steps alternating.
        c["back_to_back_calls"] += 1
        return Tool(GAP_TOOL, "local_read", round(p.latency_s or 0.0, 6))

    @staticmethod
    def _calls(p: Pause, c: Counter[str]) -> Tool:
        """The calls of a pause as one tool step."""
        _count_calls(p, c, True)
        tools = [Tool(k.name, k.cls, k.latency_s, "abandoned" if k.latency_s is None else
                      "error" if k.error else "ok", k.mutating) for k in p.calls]
        merged = merge_parallel(tools)
        if merged.latency_s is not None:
            merged.latency_s = round(merged.latency_s if p.wall_s is None else p.wall_s, 6)
            timings = {k.timing for k in p.calls}
            c["exact_latency" if timings == {EXACT} else "latency_unknown"
              if UNKNOWN in timings else "approximate_latency"] += 1
        c["tool_steps"] += 1
        c["parallel_pauses"] += len(p.calls) > 1
        return merged


def _count_calls(p: Pause, c: Counter[str], replayed: bool) -> None:
    """A pause's calls, those with a result, how each latency is known (`replayed`: not a
    trailing step that was dropped, whose calls that never returned nobody waited for)."""
    for k in p.calls:
        c["acts"] += 1
        c["acts_answered"] += k.has_result
        if k.latency_s is None and not replayed:
            continue
        c["acts_abandoned" if k.latency_s is None else "acts_inferred"
          if k.timing == INFERRED else f"acts_{k.timing}"] += 1
        c["acts_error"] += k.error


@dataclass
class _Ctx:
    """The context after the previous call: its prompt and output, whether the prompt was
    counted (not estimated)."""

    prompt: int
    output: int
    counted: bool


def _llm(r: Response, ctx: _Ctx | None, c: Counter[str]) -> tuple[LLM, _Ctx]:
    """Response `r` as an LLM step after context `ctx` (None: the first of its trajectory)."""
    out = max(r.output, 1)
    c["llm_steps"] += 1
    c["zero_output"] += r.output < 1
    c["output_tokens"] += out
    before = ctx.prompt + ctx.output if ctx is not None else 0
    if r.prompt is not None:
        p = r.prompt
        c["prompt_tokens"] += p
    else:
        c["llm_calls_estimated"] += 1
        if r.prompt_est is None:  # what was appended, counted from the text
            p = before + r.counted_in
        elif ctx is not None and ctx.counted:  # in other units than the counts before it
            p = max(r.prompt_est, before)
        else:
            p = r.prompt_est
        c["prompt_tokens_estimated"] += p
    if r.cached is not None:
        c["calls_with_cached"] += 1
    c["cached_tokens"] += min(r.cached or 0, p)
    keep: int | None = None
    if ctx is not None and r.keep is not None:  # the source says what stays
        keep = r.keep
        c["kept_tokens_given"] += keep
    elif ctx is not None and (r.cut is not None or p < before):
        c["context_cuts"] += 1
        if r.cut is not None:  # what stays is what the provider found cached
            c["cuts_declared"] += 1
            c["compactions" if r.cut == "compaction" else "clears"] += 1
        else:
            c["output_not_resent" if p >= ctx.prompt else "cuts"] += 1
        keep, how = cut_keep(p, 0 if r.cut is not None else ctx.prompt, before, r.cached)
        c[f"cuts_keep_{how}"] += 1
        c["cut_tokens_dropped"] += before - keep
    step = prompt_step(p, out, before, keep)
    c["appended_tokens"] += step.input_tokens
    c["kept_tokens"] += p - step.input_tokens
    return step, _Ctx(p, out, r.prompt is not None)


def assign_starts(built: Built, priority: str, tenant: str, unit: float = 1.0) -> None:
    """start_s of every root from its first time (in `unit`s of a second), relative to the
    earliest root of the import (0 where a source has no times); a sub-agent takes its
    root's."""
    known = [t for t in built.start_ts.values() if t is not None]
    t0 = min(known) if known else 0.0
    for t in built.trajectories:
        ts = built.start_ts.get(built.root[t.trajectory_id])
        t.start_s = 0.0 if ts is None else round(max(0.0, ts - t0) / unit, 6)
        t.priority, t.tenant = priority, tenant
