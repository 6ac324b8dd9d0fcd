"""Recordings of `harness record` (a folder each): every conversation a trajectory, sub-agents
as children.

Each call that ended `ok` is an LLM step: its prompt and output tokens from the server's usage
(llama.cpp's timings where a stream has no usage; else estimated by the token rule, and counted).
The prompt appends to the previous call's context (prompt + output) when the call's blocks
extend that context; where they do not (a compaction, a regenerate, rewritten older messages)
`keep_tokens` is the tokens of the blocks both share, the block estimates scaled to the call's
prompt. The replayed prompt is the recorded one either way. Between two calls, one pause: the
tool calls of the first call's answer (parallel calls merged), each timed as the proxy measured it
(the next request that brought its result back arrived `wall_s` after the answer ended), the
sub-agents started while it waited (a `subagent` step, then the time after the last ended), or
the user's turn (`human`). A conversation that ends waiting on its tool calls ends with a tool
step that never returns (`abandoned`). Calls that failed (error status, unreachable upstream,
cut stream, client gone) are not replayed; they are counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.proxy.conversations import lcp
from harness.proxy.events import Call, RecordedCalls, Result, load_calls
from harness.traces.importers._common import (
    LLM,
    Tool,
    Trajectory,
    build_frame,
    take_options,
)
from harness.traces.importers.agent_tools import agent_tool_class, merge_parallel
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.prompts import prompt_step
from harness.traces.importers.recording_counts import (
    DEFAULT_DEADLINE_S,
    FORMAT,
    UNSPAWNED_CLASS,
    Conv,
    Rec,
    recording_provenance,
    recording_warnings,
)
from harness.traces.schema import TOOL_SUBAGENT

_SAFE_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _scaled(call: Call, blocks: Sequence[tuple[str, int, str]]) -> int:
    """Tokens of `blocks` (of `call`'s request): their estimates scaled to its prompt."""
    total = sum(b[1] for b in call.blocks)
    part = sum(b[1] for b in blocks)
    assert call.usage is not None
    return round(part * call.usage.prompt / total) if total else 0


def _llm(prev: Call | None, call: Call, c: Counter[str]) -> LLM:
    """`call` as an LLM step after `prev` (the conversation's previous replayed call)."""
    assert call.usage is not None
    p, out = call.usage.prompt, max(call.usage.output, 1)
    c["zero_output"] += call.usage.output < 1
    c["prompt_tokens"] += p
    c["output_tokens"] += out
    c["cached_tokens"] += call.usage.cached or 0
    c["usage_exact" if call.usage.exact else "usage_estimated"] += 1
    if prev is None:
        c["appended_tokens"] += p
        return prompt_step(p, out, 0)
    assert prev.usage is not None
    before = prev.usage.prompt + max(prev.usage.output, 1)
    ours, theirs = tuple(b[0] for b in call.blocks), tuple(b[0] for b in prev.context)
    m = lcp(ours, theirs)
    extends = m >= len(theirs) - prev.tail
    if extends and p >= before:
        c["extends"] += 1
        c["appended_tokens"] += p - before
        return prompt_step(p, out, before)
    if extends:  # the same text, fewer tokens (e.g. reasoning not sent back)
        c["shorter_than_context"] += 1
        keep = p - _scaled(call, call.blocks[m:])
    else:
        c["cut"] += 1
        keep = _scaled(call, call.blocks[:m])
    keep = max(0, min(keep, before, p))
    c["cut_tokens_dropped"] += before - keep if not extends else 0
    c["kept_tokens"] += keep
    c["appended_tokens"] += p - keep
    return prompt_step(p, out, before, keep)


def _answered(j: Call, conv: Conv) -> tuple[list[tuple[str, str]], dict[str, Result]]:
    """The tool calls of the pause after `j`: its answer's, then those the client wrote into
    its next messages (answered at once); and each one's result, by call id."""
    back = {r.ref: r for later in conv.calls if later.arrival >= j.end for r in later.results
            if r.call == j.id}
    made = {ref for ref, _ in j.tool_calls}
    own = [(r.ref, r.name) for r in back.values() if r.client and r.ref not in made]
    return [*j.tool_calls, *own], back


def _tools(j: Call, conv: Conv, until: float | None, c: Counter[str]) -> Tool:
    """The pause for `j`'s tool calls: each timed by its result's return (else until the
    next call, or never when none came)."""
    calls, back = _answered(j, conv)
    tools = []
    for ref, name in calls:
        cls = agent_tool_class(name or "tool")
        cls = UNSPAWNED_CLASS if cls == TOOL_SUBAGENT else cls
        c["tool_calls"] += 1
        if ref in back:
            r = back[ref]
            c["tool_results"] += 1
            c["exact_latency"] += 1
            c["client_tool_calls"] += r.client
            c["long_tools"] += r.wall_s > DEFAULT_DEADLINE_S
            tools.append(Tool(name or "tool", cls, round(r.wall_s, 6),
                              "error" if r.error else "ok", cls == "mutating"))
        elif until is None:
            c["abandoned_tool_calls"] += 1
            tools.append(Tool(name or "tool", cls, None, "abandoned", cls == "mutating"))
        else:
            c["results_missing"] += 1
            tools.append(Tool(name or "tool", cls, round(max(0.0, until - j.end), 6), "ok",
                              cls == "mutating"))
    return merge_parallel(tools)


def _pause(conv: Conv, j: Call, k: Call | None, c: Counter[str]) -> Tool:
    """The tool step after LLM call `j` (k: the next one replayed; None: j is the last)."""
    later = [x for x in conv.calls if x.arrival >= j.end and x is not j]
    nxt = later[0].arrival if later else None
    if k is not None:
        c["failed_calls_between"] += sum(1 for x in later if x.arrival < k.arrival)
    children = conv.children.get(j.id, [])
    calls, back = _answered(j, conv)
    if children:
        c["subagent_steps"] += 1
        names = [n for _, n in calls if agent_tool_class(n) == TOOL_SUBAGENT] or [
            n for _, n in calls] or ["subagent"]
        c["tool_calls"] += len(calls)
        if k is None:  # the parent never went on: it ends when its sub-agents have
            c["abandoned_tool_calls"] += len(calls)
            c["subagents_after_last_call"] += len(children)
            return Tool("+".join(dict.fromkeys(names)), TOOL_SUBAGENT, 0.0)
        ended = max(x.end for ch in children for x in ch.calls)
        c["subagent_waits_clipped"] += k.arrival < ended
        answered = sum(ref in back for ref, _ in calls)
        c["tool_results"] += answered
        c["exact_latency"] += answered
        c["client_tool_calls"] += sum(back[ref].client for ref, _ in calls if ref in back)
        c["results_missing"] += len(calls) - answered
        return Tool("+".join(dict.fromkeys(names)), TOOL_SUBAGENT,
                    round(max(0.0, k.arrival - ended), 6))
    if calls:
        c["tool_pauses"] += 1
        return _tools(j, conv, None if k is None else nxt, c)
    assert k is not None and nxt is not None
    wait = round(max(0.0, nxt - j.end), 6)
    if any(x.user_turn for x in later if x.arrival <= k.arrival):
        c["human_pauses"] += 1
        return Tool("user", "human", wait)
    c["other_pauses"] += 1
    return Tool("client", "human", wait)


def _steps(conv: Conv, c: Counter[str]) -> list[LLM | Tool]:
    steps: list[LLM | Tool] = []
    for i, call in enumerate(conv.llm):
        if i:
            steps.append(_pause(conv, conv.llm[i - 1], call, c))
        steps.append(_llm(conv.llm[i - 1] if i else None, call, c))
    last = conv.llm[-1]
    if last.tool_calls or conv.children.get(last.id):
        steps.append(_pause(conv, last, None, c))
    c["llm_steps"] += len(conv.llm)
    return steps


def _outcome_counts(rc: RecordedCalls, c: Counter[str]) -> None:
    c["calls"] = len(rc.calls) + rc.unparsed
    for call in rc.calls:
        c[f"calls_{call.outcome}"] += 1
    c["calls_unfinished"] = rc.unfinished
    c["unparsed"] = rc.unparsed
    c["other_requests"] = rc.other_requests


def _import_folder(path: Path, taken: set[str]) -> Rec:
    rc = load_calls(path)
    meta = rc.recording.meta
    raw = meta.get("id")
    base = raw if isinstance(raw, str) and _SAFE_ID.fullmatch(raw) else path.name or "recording"
    rid, k = base, 2
    while rid in taken:
        rid, k = f"{base}-{k}", k + 1
    taken.add(rid)
    started = meta.get("started_unix")
    rec = Rec(path, rid, float(started) if isinstance(started, int | float) else 0.0,
               meta.get("closed") is True, rc.recording.truncated_last_line, skipped=rc.skipped)
    _outcome_counts(rc, rec.counts)
    convs: dict[str, Conv] = {}
    for call in rc.calls:
        if call.conv is None:
            continue
        conv = convs.setdefault(call.conv, Conv(call.conv, []))
        conv.calls.append(call)
        if call.how == "subagent" and conv.parent is None:
            conv.parent = call.parent
    for conv in convs.values():
        conv.calls.sort(key=lambda x: (x.arrival, x.id))
        conv.llm = [x for x in conv.calls if x.outcome == "ok" and x.usage is not None]
    rec.counts["conversations"] = len(convs)
    live = {cid: cv for cid, cv in convs.items() if cv.llm}
    rec.counts["conversations_without_answer"] = len(convs) - len(live)
    _link_client_spawns(live, rec.counts)
    for conv in live.values():
        p = conv.parent
        host = live.get(p[0]) if p is not None else None
        if p is not None and (host is None or not any(x.id == p[1] for x in host.llm)):
            rec.counts["subagents_orphaned"] += 1  # its parent's call is not replayed
            conv.parent = None
        elif p is not None and host is not None:
            host.children.setdefault(p[1], []).append(conv)
    for conv in live.values():
        if conv.parent is None:
            conv.tid = f"{rid}/{conv.id}"
            _emit(conv, None, 0, rec)
    return rec


def _link_client_spawns(live: dict[str, Conv], c: Counter[str]) -> None:
    """A new conversation that started and ended within another's pause on tool calls its
    client wrote itself (which the proxy saw only when the results came back) is that
    conversation's sub-agent: of several, the pause that began last."""
    for r in live.values():
        if r.parent is not None or r.calls[0].how != "new":
            continue
        start, end, session = r.calls[0].arrival, max(x.end for x in r.calls), r.calls[0].session
        best: tuple[float, Conv, Call] | None = None
        for p in live.values():
            if p is r or _descends(p, r, live):
                continue
            for j in p.llm:
                if j.session != session or j.end > start or (best and j.end <= best[0]):
                    continue
                calls, back = _answered(j, p)
                nxt = next((x.arrival for x in p.calls if x.arrival >= j.end and x is not j),
                           None)
                if (nxt is not None and end <= nxt
                        and any(back[ref].client for ref, _ in calls if ref in back)):
                    best = (j.end, p, j)
        if best is not None:
            r.parent = (best[1].id, best[2].id)
            c["subagents_linked"] += 1


def _descends(conv: Conv, root: Conv, live: dict[str, Conv]) -> bool:
    """Whether `root` is among `conv`'s parents."""
    seen: set[str] = set()
    while conv.parent is not None and conv.id not in seen:
        seen.add(conv.id)
        if conv.parent[0] == root.id:
            return True
        parent = live.get(conv.parent[0])
        if parent is None:
            return False
        conv = parent
    return False


def _emit(conv: Conv, parent: tuple[str, int] | None, depth: int, rec: Rec) -> None:
    """Append `conv`'s trajectory, then its sub-agents' (depth-first)."""
    if depth > MAX_SUBAGENT_DEPTH:
        raise InputError(f"{rec.path}: sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} "
                         "levels (the limit)")
    steps = _steps(conv, rec.counts)
    rec.trajs.append(Trajectory(conv.tid, steps, parent_id=None if parent is None else parent[0],
                                spawn_step=None if parent is None else parent[1]))
    rec.first_calls[conv.tid] = conv.llm[0]
    if parent is None:
        rec.root_start[conv.tid] = rec.started + conv.llm[0].arrival
    else:
        rec.counts["subagents"] += 1
    for i, call in enumerate(conv.llm):
        for child in conv.children.get(call.id, []):
            child.tid = f"{conv.tid}/{child.id}"
            _emit(child, (conv.tid, 2 * i + 1), depth + 1, rec)


def _prefix_groups(recs: list[Rec]) -> None:
    """Trajectories whose first calls start with the same block share a prefix group; each's
    prefix_tokens is the most tokens it shares with another of the group (its estimate)."""
    for rec in recs:
        groups: dict[str, list[Trajectory]] = {}
        for t in rec.trajs:
            first = rec.first_calls[t.trajectory_id]
            if first.blocks:
                groups.setdefault(first.blocks[0][0], []).append(t)
        for key, members in groups.items():
            if len(members) < 2:
                continue
            rec.counts["prefix_groups"] += 1
            hashes = {t.trajectory_id: tuple(b[0] for b in rec.first_calls[t.trajectory_id]
                                             .blocks) for t in members}
            for t in members:
                call = rec.first_calls[t.trajectory_id]
                m = max(lcp(hashes[t.trajectory_id], hashes[o.trajectory_id])
                        for o in members if o is not t)
                first_step = t.steps[0]
                assert isinstance(first_step, LLM)
                shared = min(_scaled(call, call.blocks[:m]), first_step.input_tokens)
                if shared > 0:
                    t.prefix_group, t.prefix_tokens = f"{FORMAT}/{key[:12]}", shared


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one recording folder."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import recording folders (each one `harness record --out` wrote)."""
    opts = take_options(options, FORMAT, {})
    taken: set[str] = set()
    recs = [_import_folder(p, taken) for p in paths]
    trajs = [t for r in recs for t in r.trajs]
    if not trajs:
        raise InputError(f"{FORMAT} import: no call in {', '.join(map(str, paths))} ended with "
                         "an answer: nothing to replay")
    _prefix_groups(recs)
    origin = min(s for r in recs for s in r.root_start.values())
    for r in recs:
        root = ""
        for t in r.trajs:  # a sub-agent follows its root and arrives with it
            root = t.trajectory_id if t.parent_id is None else root
            t.start_s = round(max(0.0, r.root_start[root] - origin), 6)
            t.priority, t.tenant = opts["priority"], opts["tenant"]
    for r in recs:
        r.counts["trajectories"] = len(r.trajs)
    return Imported(build_frame(trajs), recording_provenance(recs, opts), recording_warnings(recs))


IMPORTER = Format("recording", import_paths, many=True)
