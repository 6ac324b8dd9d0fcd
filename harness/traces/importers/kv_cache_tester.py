"""WEKA kv-cache-tester traces: one (gzipped) JSON per Claude Code conversation, with sub-agents.

A file holds `block_size` (64), `tool_tokens` + `system_tokens` (the shared prefix) and
`requests[]`: `t` (s from the start), `in`/`out` tokens, `hash_ids` (one id per full block of the
prompt), `input_types`, `api_time` (s the server took), `think_time` (s of client time before the
request). A `subagent` entry has its own `requests[]`; its `t` is when it ended in the parent's
timeline, `duration_ms` how long it ran. Each conversation becomes a trajectory, each request an
LLM step whose prompt is exactly `in` tokens and keeps the blocks it shares with the previous
request; between two requests a tool step of the next one's think_time. Sub-agents become child
trajectories spawned by the parent's tool step in the gap where they started. This module reads
the files into the intermediate form (form.py: what each request keeps, each pause, where each
sub-agent starts) and `builder` makes the steps.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

from harness.errors import InputError
from harness.traces.importers._common import (
    arrival_offsets,
    build_frame,
    files_in,
    opt_float,
    opt_int,
    quote,
    summarize,
    summed,
    take_options,
)
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import Builder, Built, publish
from harness.traces.importers.form import APPROXIMATE, EXACT, Call, Convo, Pause, Response
from harness.traces.importers.kv_cache_tester_read import (
    Conv,
    Limits,
    Req,
    Sub,
    fail,
    read_conv,
    read_doc,
)
from harness.traces.schema import Provenance
from harness.userfiles import is_count

FORMAT = "kv-cache-tester"
OPTIONS = {"arrival_rate": "", "seed": "0", "max_context": "", "max_requests": ""}
MAIN_GROUP = f"{FORMAT}/main"
# Request times are whole seconds: a sub-agent that started up to this long before a request's
# `t` started after that request.
SPAWN_TOLERANCE_S = 1.0
# The counts the builder counts under other names.
PUBLISHED = {"tool_pauses": ("tool_steps",), "subagents_replayed": ("subagents_built",)}
# Every count a file's provenance entry holds (0 when nothing happened).
COUNTS = (
    "requests", "subagent_requests", "llm_steps", "tool_pauses", "human_pauses",
    "subagent_steps", "subagents", "subagents_replayed", "subagents_skipped_async",
    "subagents_skipped_other", "subagents_dropped", "subagents_after_last_request",
    "subagents_before_first_request", "subagent_waits_clipped", "extends",
    "last_block_changed", "cut", "cut_tokens_dropped", "earlier_shares_more",
    "earlier_blocks_understated", "zero_output", "think_time_inferred", "untyped_inputs",
    "unsorted_requests", "dropped_max_context", "dropped_max_requests", "prompt_tokens",
    "kept_tokens", "appended_tokens", "output_tokens",
)


@dataclass
class _File:
    """What one file became, and what was counted on the way."""

    path: Path
    block: int
    root: str = ""
    counts: Counter[str] = field(default_factory=Counter)
    skipped: dict[int, list[str]] = field(default_factory=dict)  # id(Convo) -> sub-agents
    late: dict[int, list[Convo]] = field(default_factory=dict)  # id(Convo) -> sub-agents
    # started after its last request


def _lcp(a: bytes, b: bytes) -> int:
    """How many leading ids (8 bytes each) `a` and `b` share."""
    n = min(len(a), len(b)) // 8
    if a[:8 * n] == b[:8 * n]:
        return n
    lo, hi = 0, n  # in ids: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:8 * mid] == b[:8 * mid] else (lo, mid)
    return lo


def _keeps(reqs: list[Req], block: int, c: Counter[str]) -> list[int | None]:
    """What each request keeps: the blocks it shares with the one before (the first: None)."""
    keeps: list[int | None] = []
    # id -> a request that held it. The ids name a block and all before it (true of every
    # file here), so a request sharing more than k blocks with this one holds its id k;
    # were they not, earlier_shares_more would be a lower bound.
    seen: dict[int, int] = {}
    for k, r in enumerate(reqs):
        h, blocks = r.hashes, len(r.hashes) // 8
        m = 0
        if not k:
            keeps.append(None)
        else:
            prev = reqs[k - 1]
            m = _lcp(h, prev.hashes)
            full = min(prev.inp // block, len(prev.hashes) // 8)
            keeps.append(min(block * m, prev.inp, r.inp))
            if m >= full:
                c["extends"] += 1
            elif m == full - 1:
                c["last_block_changed"] += 1
            else:
                c["cut"] += 1
                c["cut_tokens_dropped"] += block * (full - m)
            best = m
            while best < blocks and (j := seen.get(int.from_bytes(
                    h[8 * best:8 * best + 8], sys.byteorder, signed=True))) is not None:
                more = _lcp(h, reqs[j].hashes)
                if more <= best:
                    break
                best = more
            if best > m:
                c["earlier_shares_more"] += 1
                c["earlier_blocks_understated"] += best - m
        seen.update(zip(struct.unpack(f"{blocks - m}q", h[8 * m:]), repeat(k)))
    return keeps


def _pause(prev: Req, nxt: Req, subs: list[tuple[Sub, Convo]], c: Counter[str]) -> Pause:
    """The pause between two requests: the sub-agents started there, else a tool's result or
    the user's turn, lasting the next request's think_time (else the gap less the server's
    time)."""
    wait = nxt.think
    if wait is None:
        c["think_time_inferred"] += 1
        wait = max(0.0, nxt.t - prev.t - (prev.api or 0.0))
    if subs:
        ran_from = prev.t + prev.api if prev.api is not None else min(s.start for s, _ in subs)
        ran = max(s.end for s, _ in subs) - ran_from
        c["subagent_waits_clipped"] += wait < ran
        return Pause(children=[k for _, k in subs], names=[s.kind for s, _ in subs],
                     latency_s=max(0.0, wait - ran))
    if nxt.tool:
        return Pause([Call("", "tool_result", nxt.t, has_result=True, latency_s=wait,
                           timing=APPROXIMATE if nxt.think is None else EXACT)])
    return Pause(human=True, latency_s=wait, name="user_turn")


def _convo(conv: Conv, key: str, group: str, f: _File, lim: Limits) -> Convo:
    """`conv` in the intermediate form (one request at least stays under the limits): its
    requests kept, each keeping the blocks it shares with the one before, and its sub-agents'
    conversations in the pauses where they started."""
    c = f.counts
    n, by_context = lim.kept(conv.reqs)
    c["dropped_max_context"] += by_context
    c["dropped_max_requests"] += len(conv.reqs) - by_context - n
    reqs = conv.reqs[:n]
    out = Convo(key, c, prefix_group=group, prefix_tokens=conv.prefix)
    ts = [r.t for r in conv.reqs]
    gaps: dict[int, list[tuple[Sub, Convo]]] = {}  # gap after request g -> sub-agents
    for s in conv.subs:
        if s.duration is None or s.status == "async_launched" or not s.conv.reqs:
            c["subagents_skipped_async" if s.status == "async_launched"
              else "subagents_skipped_other"] += 1
            f.skipped.setdefault(id(out), []).append(f"{s.agent_id} ({s.status or 'no duration'})")
            continue
        g = bisect_right(ts, s.start + SPAWN_TOLERANCE_S) - 1
        if g < 0:
            c["subagents_before_first_request"] += 1
            g = 0
        if (g >= n - 1 and n < len(conv.reqs)) or not lim.kept(s.conv.reqs)[0]:
            # It started after the last request kept, or its first request is over the limit.
            c["subagents_dropped"] += 1
            c["dropped_max_context" if lim.max_context is not None
              else "dropped_max_requests"] += _count(s.conv)[0]
            continue
        kid = _convo(s.conv, s.agent_id, f"{FORMAT}/{s.kind}", f, lim)
        kid.under_parent = True
        gaps.setdefault(g, []).append((s, kid))
    out.responses = [Response(k, r.inp, r.out, None, r.t, None, keep=keep)
                     for k, (r, keep) in enumerate(zip(reqs, _keeps(reqs, f.block, c),
                                                       strict=True))]
    for i in range(n - 1):
        out.responses[i].after = _pause(reqs[i], reqs[i + 1], gaps.get(i, []), c)
    if n - 1 in gaps:  # sub-agents that started after the last request: the parent waits
        c["subagents_after_last_request"] += len(gaps[n - 1])
        f.late[id(out)] = [k for _, k in gaps[n - 1]]
        out.responses[-1].after = Pause(children=[k for _, k in gaps[n - 1]],
                                        names=[s.kind for s, _ in gaps[n - 1]])
    return out


def _count(conv: Conv) -> tuple[int, int]:
    """Requests and sub-agents in `conv`, its sub-agents' included."""
    inner = [_count(s.conv) for s in conv.subs]
    return (len(conv.reqs) + sum(r for r, _ in inner),
            len(conv.subs) + sum(n for _, n in inner))


def _import_file(path: Path, builder: Builder, built: Built, lim: Limits) -> _File:
    """One conversation file's trajectories (the root first, each parent before its
    sub-agents) into `built`, and its counts."""
    doc = read_doc(path)
    where = str(path)
    if not isinstance(doc, dict) or "requests" not in doc:
        raise fail(where, "expected a JSON object with 'requests' (a kv-cache-tester trace)")
    block = doc.get("block_size", 64)
    if not is_count(block) or not 0 < block <= 1 << 20:
        raise fail(where, f"'block_size' must be a positive integer (tokens per hash block), "
                           f"got {quote(block)}")
    f = _File(path, block)
    conv = read_conv(doc, where, block, f.counts, 0, where)
    if not conv.reqs:
        raise fail(where, "no requests")
    f.counts["subagents"] = _count(conv)[1]
    raw_id = doc.get("id")
    base = raw_id if isinstance(raw_id, str) and raw_id else path.name.split(".")[0]
    if lim.kept(conv.reqs)[0]:
        first = len(built.trajectories)
        builder.build(_convo(conv, base, MAIN_GROUP, f, lim), built)
        f.root = built.trajectories[first].trajectory_id
    else:
        f.root = builder.unique(base)  # taken all the same: ids do not depend on the limits
        f.counts["dropped_max_context"] += _count(conv)[0]
    publish(f.counts, PUBLISHED)
    return f


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one kv-cache-tester trace file, or a directory of them."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import kv-cache-tester trace files and directories of them (one conversation a file)."""
    opts = take_options(options, FORMAT, OPTIONS)
    rate = opt_float(opts, "arrival_rate", FORMAT)
    seed = opt_int(opts, "seed", FORMAT, minimum=0)
    lim = Limits(*(None if opts[k] == "" else opt_int(opts, k, FORMAT, minimum=1)
                    for k in ("max_context", "max_requests")))
    builder, built = Builder(), Built()
    files = [_import_file(p, builder, built, lim) for p in files_in(paths)]
    trajs = built.trajectories
    if not trajs:
        raise InputError(f"{FORMAT} import: every conversation's first request is over "
                         f"max_context={opts['max_context']}")
    roots = [t.trajectory_id for t in trajs if t.parent_id is None]
    starts = dict(zip(roots, arrival_offsets(len(roots), rate, seed).tolist(), strict=True))
    for t in trajs:  # a sub-agent arrives with its root
        t.start_s = starts[built.root[t.trajectory_id]]
        t.priority, t.tenant = opts["priority"], opts["tenant"]
    return Imported(build_frame(trajs), _provenance(files, opts, len(roots), len(trajs)),
                    _warnings(files, built))


def _warnings(files: list[_File], built: Built) -> list[str]:
    skipped: list[str] = []
    late: list[str] = []
    zero_out: list[str] = []
    owner = {id(f.counts): f for f in files}
    tid = {id(convo): t for t, convo in built.convo.items()}
    for t in built.trajectories:  # each parent before its sub-agents, as they were read
        convo = built.convo[t.trajectory_id]
        f = owner[id(convo.counts)]
        skipped += [f"{t.trajectory_id}/{s}" for s in f.skipped.get(id(convo), [])]
        late += [tid[id(k)] for k in f.late.get(id(convo), [])]
        if zero := sum(r.output < 1 for r in convo.responses):
            zero_out.append(f"{t.trajectory_id}: {zero}")
    found = (
        ("sub-agents not replayed (no duration: the parent did not wait for them)", skipped),
        ("sub-agents started after their parent's last request: spawned by a final subagent "
         "step (the time before them is not replayed)", late),
        ("trajectories with requests of 0 output tokens raised to 1", zero_out),
        ("files whose requests were not in time order: sorted",
         [str(f.path) for f in files if f.counts["unsorted_requests"]]),
    )
    return [summarize(what, items) for what, items in found if items]


def _inferred(opts: dict[str, str]) -> dict[str, str]:
    """How each column of the trajectories is inferred from the trace."""
    return {
        "keep_tokens": "block_size x the hash_ids a request shares with the previous "
                       "request of its trajectory (at most that one's `in`); first: null",
        "input_tokens": "`in` - keep_tokens (the replayed prompt is exactly `in` tokens)",
        "output_tokens": "`out` (at least 1)",
        "latency_s": "the next request's think_time (else the gap less api_time, >= 0); a "
                     "subagent step: that less the time from the request's end (t + "
                     "api_time) to its last sub-agent's end, >= 0 (0 after the last request)",
        "tool_class": "'sandbox' when the next request's input_types has tool_result (the "
                      "tool is not named), else 'human'; 'subagent' where sub-agents start",
        "tool_name": "'tool_result', 'user_turn', or the sub-agents' subagent_type(s)",
        "outcome": "'ok'", "mutating": "false", "deadline_s": "null",
        "spawn_step": "the tool step after the parent's last request with t <= the "
                      f"sub-agent's start (t - duration_ms / 1000) + {SPAWN_TOLERANCE_S:g} s",
        "prefix_tokens": f"min(tool_tokens + system_tokens, first `in`); group {MAIN_GROUP!r}"
                         f", or '{FORMAT}/<subagent_type>' for sub-agents",
        "start_s": (f"Poisson arrivals at {opts['arrival_rate']}/s, seed {opts['seed']}"
                    if opts["arrival_rate"] else "0") + "; a sub-agent: its root's",
        "priority": f"option priority ({opts['priority']!r})",
        "tenant": f"option tenant ({opts['tenant']!r})",
    }


def _provenance(files: list[_File], opts: dict[str, str], roots: int,
                trajectories: int) -> Provenance:
    per = [{"file": str(f.path), "id": f.root, "block_size": f.block,
            **{k: int(f.counts[k]) for k in COUNTS}} for f in files]
    totals = {"files": len(files), "conversations": roots, "trajectories": trajectories,
              **summed((f.counts for f in files), COUNTS)}
    return Provenance(
        source_format=FORMAT,
        source_files=[str(f.path) for f in files],
        inferred=_inferred(opts),
        notes=[
            "each request keeps exactly the hash blocks it shares with the previous request of "
            "its trajectory; one that shares more with an earlier request is still replayed "
            "from the previous one (earlier_shares_more, earlier_blocks_understated)",
            "trajectories of one prefix_group share min(their prefix_tokens) tokens of one "
            "canonical prefix (like the tester's warm prefix); the trace's own prefix ids are "
            "local to each conversation",
            f"{totals['subagents_replayed']} sub-agents replayed, "
            f"{totals['subagents_skipped_async'] + totals['subagents_skipped_other']} skipped "
            f"(no duration: not waited for), {totals['subagents_dropped']} dropped by limits",
        ],
        extra={"files": per, "totals": totals, "max_context": opts["max_context"] or None,
               "max_requests": opts["max_requests"] or None},
    )


IMPORTER = Format("kv-cache-tester", import_paths, many=True)
