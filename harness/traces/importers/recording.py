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
cut stream, client gone) are not replayed; they are counted. A sub-agent hangs under the call
the proxy linked it to: by its agent id (a new agent id while an Agent or Task call waited;
counted in subagents_by_agent_id), else by the times (counted in subagents_guessed); one whose
parent is not in the import is a trajectory of its own (subagents_orphaned). This module reads
a recording into the intermediate form (form.py: what each call keeps, each pause as the proxy
timed it, which conversation each sub-agent's is) and `builder` makes the steps.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.proxy.conversations import AGENT_LINK, lcp
from harness.proxy.events import Call, RecordedCalls, Result, load_calls
from harness.traces.importers._common import build_frame, take_options
from harness.traces.importers.agent_tools import agent_tool_class, call_class
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import Builder, Built, assign_starts, publish
from harness.traces.importers.form import APPROXIMATE, EXACT, Convo, Pause, Response
from harness.traces.importers.form import Call as Act
from harness.traces.importers.recording_counts import (
    DEFAULT_DEADLINE_S,
    FORMAT,
    PUBLISHED,
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


def _keep(prev: Call | None, call: Call, c: Counter[str]) -> int | None:
    """What `call`'s prompt keeps of the context after `prev` (the conversation's previous
    call replayed): None when its blocks extend that context, else the tokens of the blocks
    both share."""
    assert call.usage is not None
    c["usage_exact" if call.usage.exact else "usage_estimated"] += 1
    if prev is None:
        return None
    assert prev.usage is not None
    p, before = call.usage.prompt, prev.usage.prompt + max(prev.usage.output, 1)
    m = lcp(tuple(b[0] for b in call.blocks), tuple(b[0] for b in prev.context))
    extends = m >= len(prev.context) - prev.tail
    if extends and p >= before:
        c["extends"] += 1
        return None
    if extends:  # the same text, fewer tokens (e.g. reasoning not sent back)
        c["shorter_than_context"] += 1
        keep = p - _scaled(call, call.blocks[m:])
    else:
        c["cut"] += 1
        keep = _scaled(call, call.blocks[:m])
    keep = max(0, min(keep, before, p))
    c["cut_tokens_dropped"] += before - keep if not extends else 0
    return keep


def _answered(j: Call, conv: Conv) -> tuple[list[tuple[str, str]], dict[str, Result]]:
    """The tool calls of the pause after `j`: its answer's, then those the client wrote into
    its next messages (answered at once); and each one's result, by call id."""
    back = {r.ref: r for later in conv.calls if later.arrival >= j.end for r in later.results
            if r.call == j.id}
    made = {ref for ref, _ in j.tool_calls}
    own = [(r.ref, r.name) for r in back.values() if r.client and r.ref not in made]
    return [*j.tool_calls, *own], back


def _acts(j: Call, conv: Conv, until: float | None, spawn: bool, c: Counter[str]) -> list[Act]:
    """The tool calls after `j`, each timed by its result's return (exact), else until the
    next call (approximate), or never when none came (`until` None); with sub-agents
    (`spawn`) the parent waits on them instead."""
    calls, back = _answered(j, conv)
    acts = []
    for ref, name in calls:
        cls = call_class(name or "tool")
        act = Act(ref, name or "tool", j.end, cls=cls, mutating=cls == "mutating")
        if ref in back and not (spawn and until is None):
            r = back[ref]
            act.has_result, act.latency_s, act.timing, act.error = (True, round(r.wall_s, 6),
                                                                     EXACT, r.error)
            c["client_tool_calls"] += r.client
            c["long_tools"] += r.wall_s > DEFAULT_DEADLINE_S and not spawn
        elif until is not None:
            act.latency_s, act.timing = round(max(0.0, until - j.end), 6), APPROXIMATE
        acts.append(act)
    return acts


def _pause(conv: Conv, i: int, kids: list[Convo], c: Counter[str]) -> Pause:
    """The pause after LLM call `conv.llm[i]`: its tool calls, the sub-agents started while it
    waited, or the user's (else the client's) turn."""
    j, k = conv.llm[i], conv.llm[i + 1] if i + 1 < len(conv.llm) else None
    later = [x for x in conv.calls if x.arrival >= j.end and x is not j]
    nxt = later[0].arrival if later else None
    if k is not None:
        c["failed_calls_between"] += sum(1 for x in later if x.arrival < k.arrival)
    if kids:
        calls = [n for _, n in _answered(j, conv)[0]]
        names = [n for n in calls if agent_tool_class(n) == TOOL_SUBAGENT] or calls or [
            "subagent"]
        acts = _acts(j, conv, None if k is None else nxt, True, c)
        if k is None:  # the parent never went on: it ends when its sub-agents have
            c["subagents_after_last_call"] += len(kids)
            return Pause(acts, kids, names, latency_s=0.0)
        ended = max(x.end for ch in conv.children[j.id] for x in ch.calls)
        c["subagent_waits_clipped"] += k.arrival < ended
        return Pause(acts, kids, names, latency_s=round(max(0.0, k.arrival - ended), 6))
    if k is None:
        return Pause(_acts(j, conv, None, False, c) if j.tool_calls else [])
    acts = _acts(j, conv, nxt, False, c)
    assert nxt is not None
    if acts:
        return Pause(acts)
    user = any(x.user_turn for x in later if x.arrival <= k.arrival)
    c["other_pauses"] += not user
    return Pause(human=True, latency_s=round(max(0.0, nxt - j.end), 6),
                 name="user" if user else "client")


def _convo(conv: Conv, key: str, depth: int, rec: Rec) -> Convo:
    """`conv` in the intermediate form, its sub-agents' conversations in its pauses."""
    if depth > MAX_SUBAGENT_DEPTH:
        raise InputError(f"{rec.path}: sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} "
                         "levels (the limit)")
    out = Convo(key, rec.built, under_parent=depth > 0)
    rec.firsts.append((out, conv.llm[0]))
    for i, call in enumerate(conv.llm):
        assert call.usage is not None
        r = Response(i, call.usage.prompt, call.usage.output, call.usage.cached, call.arrival,
                     call.end, keep=_keep(conv.llm[i - 1] if i else None, call, rec.counts))
        kids = [_convo(ch, ch.id, depth + 1, rec) for ch in conv.children.get(call.id, [])]
        r.after = _pause(conv, i, kids, rec.counts)
        out.responses.append(r)
    return out


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
            conv.parent, conv.guessed = call.parent, call.link != AGENT_LINK
    for conv in convs.values():
        conv.calls.sort(key=lambda x: (x.arrival, x.id))
        conv.llm = [x for x in conv.calls if x.outcome == "ok" and x.usage is not None]
    rec.counts["conversations"] = len(convs)
    live = {cid: cv for cid, cv in convs.items() if cv.llm}
    rec.counts["conversations_without_answer"] = len(convs) - len(live)
    _link_client_spawns(live, rec.counts)
    _break_cycles(live, rec.counts)
    for conv in live.values():
        p = conv.parent
        host = live.get(p[0]) if p is not None else None
        if p is not None and (host is None or not any(x.id == p[1] for x in host.llm)):
            rec.counts["subagents_orphaned"] += 1  # its parent's call is not replayed
            conv.parent = None
        elif p is not None and host is not None:
            host.children.setdefault(p[1], []).append(conv)
    for conv in live.values():
        if conv.parent is not None:  # the links kept, recorded or guessed
            rec.counts["subagents_guessed" if conv.guessed else "subagents_by_agent_id"] += 1
        if conv.parent is None:
            rec.roots.append(_convo(conv, f"{rid}/{conv.id}", 0, rec))
            rec.roots[-1].first_ts = rec.started + conv.llm[0].arrival
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
            r.parent, r.guessed = (best[1].id, best[2].id), True
            c["subagents_linked"] += 1


def _break_cycles(live: dict[str, Conv], c: Counter[str]) -> None:
    """A conversation whose chain of parents comes back to itself (a sub-agent that names
    itself, or a conversation of a cycle, as its parent) would hang under no root: each on
    such a cycle is imported as a trajectory of its own (counted as orphaned and as cyclic)."""
    cyclic = [conv for conv in live.values() if conv.parent is not None
              and (conv.parent[0] == conv.id or _descends(live.get(conv.parent[0], conv),
                                                          conv, live))]
    for conv in cyclic:
        conv.parent = None
    c["subagents_orphaned"] += len(cyclic)
    c["subagents_cyclic"] += len(cyclic)


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


def _prefix_groups(rec: Rec) -> None:
    """Conversations whose first calls start with the same block share a prefix group; each's
    prefix_tokens is the most tokens it shares with another of the group (its estimate)."""
    groups: dict[str, list[tuple[Convo, Call]]] = {}
    for convo, first in rec.firsts:
        if first.blocks:
            groups.setdefault(first.blocks[0][0], []).append((convo, first))
    for key, members in groups.items():
        if len(members) < 2:
            continue
        rec.counts["prefix_groups"] += 1
        hashes = [tuple(b[0] for b in call.blocks) for _, call in members]
        for i, (convo, call) in enumerate(members):
            m = max(lcp(hashes[i], h) for k, h in enumerate(hashes) if k != i)
            convo.prefix_group = f"{FORMAT}/{key[:12]}"
            convo.prefix_tokens = _scaled(call, call.blocks[:m])  # at most its first prompt


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one recording folder."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import recording folders (each one `harness record --out` wrote)."""
    opts = take_options(options, FORMAT, {})
    taken: set[str] = set()
    recs = [_import_folder(p, taken) for p in paths]
    builder, built = Builder(keep_trailing=True), Built()
    for r in recs:
        _prefix_groups(r)
        first = len(built.trajectories)
        for convo in r.roots:
            builder.build(convo, built)
        r.counts["trajectories"] = len(built.trajectories) - first
        publish(r.counts, PUBLISHED, r.built)
        r.counts["human_pauses"] -= r.counts["other_pauses"]  # the user's turns only
    if not built.trajectories:
        raise InputError(f"{FORMAT} import: no call in {', '.join(map(str, paths))} ended with "
                         "an answer: nothing to replay")
    assign_starts(built, opts["priority"], opts["tenant"])
    return Imported(build_frame(built.trajectories), recording_provenance(recs, opts),
                    recording_warnings(recs))


IMPORTER = Format("recording", import_paths, many=True)
