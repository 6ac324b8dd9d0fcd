"""ATIF trajectories (Agent Trajectory Interchange Format, ATIF-v1.x: Harbor, terminal-bench).

A file is one trajectory: `steps` of `source` system, user or agent. Each agent step is one
model call (`metrics.prompt_tokens`, `completion_tokens`, `cached_tokens`; without metrics, the
token rule on its text); its `tool_calls` are one pause, their results in `observation.results`
(by `source_call_id`; a result without one answers every call of the step). A later user step
with no tool call before it is the user's turn. Sub-trajectories named by
`subagent_trajectory_ref` (a tool call's result, or a system step's observation) are
sub-agents; `continued_trajectory_ref` continues the same trajectory in another file; steps
marked `is_copied_context` are the context a trajectory starts with, not new calls. Step
`timestamp`s time the pauses (approximately: the wall gap between steps); where a log has none
(Harbor's test outputs drop them), tool latency comes from the options and is marked inferred.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_SECONDS, MAX_SUBAGENT_DEPTH
from harness.traces.importers._common import LLM, Trajectory, build_frame, take_options
from harness.traces.importers.atif_read import SOURCES, Doc, Resolver, looks_atif, make_doc
from harness.traces.importers.atif_report import provenance, warnings
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.otel_build import NS, Act, Call, Child, Pause, assemble
from harness.traces.importers.otel_files import files_in_tree
from harness.traces.importers.otel_read import count, iso_ns
from harness.userfiles import count_tokens, read_json

FORMAT = "atif"
OPTIONS = {"tool_latency": "1", "tool_latencies": "", "human_latency": "0"}
# A tool result that says it failed (read, never stored): an error outcome.
_FAILED = re.compile(r"\A\s*(?:error|exception)\b|Traceback \(most recent call last\)", re.I)
REPLACING = frozenset({"replace", "truncate"})  # context_management boundaries that cut


@dataclass(frozen=True)
class _Opts:
    tool: float
    per_tool: dict[str, float]
    human: float


def _secs_opt(value: str, what: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
        raise InputError(f"{FORMAT} import: option {what} must be seconds from 0 to "
                         f"{MAX_SECONDS:g}, got {value!r}")
    return v


def _options(options: dict[str, str]) -> tuple[dict[str, str], _Opts]:
    opts = take_options(options, FORMAT, OPTIONS)
    per: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in opts["tool_latencies"].split(","))):
        name, eq, secs = item.rpartition("=")
        if not eq or not name.strip():
            raise InputError(f"{FORMAT} import: option tool_latencies takes NAME=SECONDS,..., "
                             f"got {item!r}")
        per[name.strip()] = _secs_opt(secs, f"tool_latencies ({name.strip()})")
    return opts, _Opts(_secs_opt(opts["tool_latency"], "tool_latency"), per,
                       _secs_opt(opts["human_latency"], "human_latency"))


def _text(v: Any) -> str:
    """A message or content: a string, or content parts (their text)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return " ".join(str(p.get("text", "")) for p in v if isinstance(p, dict))
    return ""


def _list(d: dict[str, Any], key: str, at: str) -> list[Any]:
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise InputError(f"{at}: {key!r} must be a list")
    return v


@dataclass
class _Walk:
    """A trajectory's calls and pauses as its steps are read."""

    calls: list[Call] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    kids: dict[str, Doc] = field(default_factory=dict)  # child key -> its document
    early: list[Child] = field(default_factory=list)  # started before the first call
    positions: list[int] = field(default_factory=list)  # index in `seq` of each call
    seq: list[tuple[Doc, int, dict[str, Any]]] = field(default_factory=list)
    waiting: list[Act] = field(default_factory=list)  # timed by the next step's timestamp
    waiting_pause: Pause | None = None
    since: int = 0  # tokens (by the rule) appended since the last call
    cut: bool = False
    last_ts: int | None = None
    first_ts: int | None = None


class _Import:
    """The trajectories of an import, built root by root, with each file's counts."""

    def __init__(self, resolver: Resolver, opt: _Opts) -> None:
        self.resolver, self.opt = resolver, opt
        self.counts: dict[Path, Counter[str]] = {}
        self.trajs: list[Trajectory] = []
        self.ids: set[str] = set()
        self.starts: dict[str, int | None] = {}
        self.roots: dict[str, str] = {}  # a sub-agent's root trajectory

    def counter(self, doc: Doc) -> Counter[str]:
        return self.counts.setdefault(doc.path, Counter())

    def new_id(self, base: str) -> str:
        tid, k = base, 2
        while tid in self.ids:
            tid, k = f"{base}-{k}", k + 1
        self.ids.add(tid)
        return tid

    # ------------------------------------------------------------ reading the steps

    def _chain(self, doc: Doc, stack: set[int]) -> list[tuple[Doc, int, dict[str, Any]]]:
        """The steps of a document and of the documents that continue it."""
        seq: list[tuple[Doc, int, dict[str, Any]]] = []
        d: Doc | None = doc
        seen: set[int] = set()
        while d is not None:
            if id(d) in seen or (d is not doc and id(d) in stack):
                raise InputError(f"{d.where}: continued_trajectory_ref comes back to a "
                                 "trajectory already read")
            seen.add(id(d))
            for i, s in enumerate(d.steps):
                if not isinstance(s, dict):
                    raise InputError(f"{d.where}: steps[{i}]: expected a JSON object")
                seq.append((d, i, s))
            ref = d.data.get("continued_trajectory_ref")
            if ref is None:
                break
            nxt = self.resolver.by_file(d, ref)
            if nxt is None:
                self.counter(doc)["continuations_missing"] += 1
            else:
                self.counter(doc)["continuations"] += 1
            d = nxt
        return seq

    def _latency(self, name: str) -> float:
        return self.opt.per_tool.get(name, self.opt.tool)

    def _settle(self, w: _Walk, ts: int | None) -> None:
        """Time the calls (and a spawning pause) waiting for the step that follows them."""
        for a in w.waiting:
            if a.start_ns is not None and ts is not None:
                a.latency_s = self._gap(a.start_ns, ts)
                a.end_ns, a.inferred = ts, False
        if w.waiting_pause is not None and ts is not None:
            w.waiting_pause.end_ns = ts
        w.waiting, w.waiting_pause = [], None

    @staticmethod
    def _gap(a: int, b: int) -> float:
        return min(max(0.0, (b - a) / NS), MAX_SECONDS)

    def _children(self, doc: Doc, refs: list[Any], at: str, w: _Walk, stack: set[int],
                  c: Counter[str]) -> list[Child]:
        out: list[Child] = []
        for j, ref in enumerate(refs):
            if not isinstance(ref, dict):
                raise InputError(f"{at}: subagent_trajectory_ref[{j}]: expected a JSON object")
            child = self.resolver.subagent(doc, ref)
            if child is not None and id(child) in stack:
                raise InputError(f"{at}: subagent_trajectory_ref[{j}] names a trajectory that "
                                 "is already its ancestor")
            if child is None or not self._has_calls(child):
                c["subagents_missing"] += 1
                continue
            key = f"{len(w.kids)}"
            w.kids[key] = child
            steps = [s for s in child.steps if isinstance(s, dict)]
            stamps = [s.get("timestamp") for s in steps if isinstance(s.get("timestamp"), str)]
            span = [iso_ns(x, child.where, "timestamp") for x in stamps[:1] + stamps[-1:]]
            out.append(Child(key, child.agent, span[0] if span else None,
                             span[-1] if span else None))
        return out

    @staticmethod
    def _has_calls(doc: Doc) -> bool:
        return any(isinstance(s, dict) and s.get("source") == "agent"
                   and s.get("is_copied_context") is not True and s.get("llm_call_count") != 0
                   for s in doc.steps)

    def _agent(self, d: Doc, s: dict[str, Any], at: str, ts: int | None, w: _Walk,
               stack: set[int], c: Counter[str]) -> None:
        n = count(s.get("llm_call_count"), at, "llm_call_count")
        calls = _list(s, "tool_calls", at)
        obs = s.get("observation")
        if obs is not None and not isinstance(obs, dict):
            raise InputError(f"{at}: 'observation' must be a JSON object")
        results = _list(obs or {}, "results", at)
        out_text = _text(s.get("message")) + " " + _text(s.get("reasoning_content"))
        if n == 0:  # a deterministic dispatch: no model call; its tools join the pause
            c["dispatch_steps"] += 1
        else:
            m = s.get("metrics")
            if m is not None and not isinstance(m, dict):
                raise InputError(f"{at}: 'metrics' must be a JSON object")
            m = m or {}
            p, o, k = (count(m.get(x), at, f"metrics.{x}") for x in (
                "prompt_tokens", "completion_tokens", "cached_tokens"))
            c["aggregated_calls"] += max(0, (n or 1) - 1)
            est = count_tokens(out_text) + sum(count_tokens(
                f"{tc.get('function_name')} {json.dumps(tc.get('arguments'), default=str)}")
                for tc in calls if isinstance(tc, dict))
            w.calls.append(Call(p, o, k, None, est, ts, ts, append_est=w.since, cut=w.cut))
            w.pauses.append(Pause())
            w.positions.append(len(w.seq) - 1)
            w.since, w.cut = 0, False
        if not w.pauses:
            c["tool_calls_before_first_call"] += len(calls)
            return
        pause = w.pauses[-1]
        by_call: dict[str, list[dict[str, Any]]] = {}
        general: list[dict[str, Any]] = []
        for j, r in enumerate(results):
            if not isinstance(r, dict):
                raise InputError(f"{at}: observation.results[{j}]: expected a JSON object")
            sc = r.get("source_call_id")
            (by_call.setdefault(sc, []) if isinstance(sc, str) and sc else general).append(r)
            w.since += count_tokens(_text(r.get("content")))
        for j, tc in enumerate(calls):
            if not isinstance(tc, dict) or not isinstance(tc.get("function_name"), str):
                raise InputError(f"{at}: tool_calls[{j}]: needs 'function_name' (a string)")
            cid = tc.get("tool_call_id")
            mine = by_call.get(cid, []) if isinstance(cid, str) else []
            res = mine or general
            failed = any(_FAILED.search(_text(r.get("content")))
                         or (isinstance(r.get("extra"), dict)
                             and r["extra"].get("is_error") is True) for r in res)
            name = tc["function_name"]
            act = Act(name, self._latency(name), False, bool(res), "error" if failed else "ok",
                      ts, None, inferred=True)
            pause.acts.append(act)
            w.waiting.append(act)
            refs = [x for r in mine for x in _list(r, "subagent_trajectory_ref", at)]
            pause.children += self._children(d, refs, at, w, stack, c)
        loose = [x for r in general for x in _list(r, "subagent_trajectory_ref", at)]
        ids = {tc.get("tool_call_id") for tc in calls if isinstance(tc.get("tool_call_id"), str)}
        loose += [x for sc, rs in by_call.items() if sc not in ids for r in rs
                  for x in _list(r, "subagent_trajectory_ref", at)]
        pause.children += self._children(d, loose, at, w, stack, c)
        if pause.children:
            w.waiting_pause = pause

    def _system(self, d: Doc, s: dict[str, Any], at: str, w: _Walk, stack: set[int],
                c: Counter[str]) -> None:
        obs = s.get("observation")
        if obs is not None and not isinstance(obs, dict):
            raise InputError(f"{at}: 'observation' must be a JSON object")
        refs = [x for j, r in enumerate(_list(obs or {}, "results", at))
                for x in _list(r if isinstance(r, dict) else {}, "subagent_trajectory_ref",
                               f"{at}: observation.results[{j}]")]
        extra = s.get("extra")
        cm = extra.get("context_management") if isinstance(extra, dict) else None
        if isinstance(cm, dict) and str(cm.get("boundary")) in REPLACING:
            w.cut = True
        for r in _list(obs or {}, "results", at):
            if isinstance(r, dict):
                w.since += count_tokens(_text(r.get("content")))
        kids = self._children(d, refs, at, w, stack, c)
        if not kids:
            if refs and w.pauses:  # a delegation whose trajectory is missing: a plain pause
                act = Act("subagent", self._latency("subagent"), False, True, inferred=True,
                          start_ns=w.last_ts)
                w.pauses[-1].acts.append(act)
                w.waiting.append(act)
            return
        if not w.pauses:
            c["subagents_before_first_call"] += len(kids)
            w.early += kids
            return
        w.pauses[-1].children += kids
        w.waiting_pause = w.pauses[-1]

    def _walk(self, doc: Doc, stack: set[int]) -> _Walk:
        w = _Walk()
        c = self.counter(doc)
        for d, i, s in self._chain(doc, stack):
            at = f"{d.where}: steps[{i}]"
            src = s.get("source")
            if src not in SOURCES:
                raise InputError(f"{at}: 'source' must be one of {', '.join(SOURCES)}, "
                                 f"got {src!r}")
            ts = None if s.get("timestamp") is None else iso_ns(s["timestamp"], at, "timestamp")
            w.seq.append((d, i, s))
            if s.get("is_copied_context") is True:  # context the trajectory starts with
                c["copied_steps"] += 1
                obs = s.get("observation")
                results = obs.get("results") if isinstance(obs, dict) else None
                w.since += count_tokens(_text(s.get("message")) + " " + " ".join(
                    _text(r.get("content")) for r in (results if isinstance(results, list) else [])
                    if isinstance(r, dict)))
                continue
            self._settle(w, ts)
            if ts is not None and w.first_ts is None:
                w.first_ts = ts
            if src == "agent":
                self._agent(d, s, at, ts, w, stack, c)
            elif src == "user":
                c["user_turns"] += 1
                w.since += count_tokens(_text(s.get("message")))
                p = w.pauses[-1] if w.pauses else None
                if p is not None and not p.acts and not p.children and not p.human:
                    p.human = True
                    gap = None if ts is None or w.last_ts is None else self._gap(w.last_ts, ts)
                    p.latency_s = self.opt.human if gap is None else gap
                    c["human_latency_inferred" if gap is None else "human_latency_timed"] += 1
            else:
                w.since += count_tokens(_text(s.get("message")))
                self._system(d, s, at, w, stack, c)
            w.last_ts = ts if ts is not None else w.last_ts
        for a in w.waiting:  # the last step's calls: nothing after them
            if not a.has_result:
                a.latency_s = None
        if w.pauses:
            w.pauses[0].children[:0] = w.early
        return w

    # ------------------------------------------------------------ building

    def build(self, doc: Doc, tid: str,
              parent: tuple[Trajectory, int, _Walk, Counter[str]] | None,
              stack: set[int]) -> None:
        """The trajectory of `doc` (and its continuations), then its sub-agents; `parent`:
        the parent, its step that starts this one, how it was read, and its file's counts
        (where the sub-agents it started are counted)."""
        if len(stack) > MAX_SUBAGENT_DEPTH:
            raise InputError(f"{doc.where}: sub-agents nested deeper than "
                             f"{MAX_SUBAGENT_DEPTH} levels (the limit)")
        inner = stack | {id(doc)}
        w = self._walk(doc, inner)
        c = self.counter(doc)
        if not w.calls:
            c["empty_trajectories"] += 1
            return
        steps, spawned = assemble(w.calls, w.pauses, c)
        traj = Trajectory(tid, steps)
        if parent is None:
            self.starts[tid] = w.first_ts
        else:
            traj.parent_id, traj.spawn_step = parent[0].trajectory_id, parent[1]
            parent[3]["subagents"] += 1
            _share_prefix(parent[0], parent[2], traj, w, self.root_of(parent[0]))
        self.trajs.append(traj)
        for key, child in w.kids.items():
            name = child.text("trajectory_id") or child.text("session_id") or child.agent
            cid = self.new_id(f"{tid}/{name}")
            self.roots[cid] = self.root_of(traj)
            self.build(child, cid, (traj, spawned[key], w, c), inner)

    def root_of(self, t: Trajectory) -> str:
        return self.roots.get(t.trajectory_id, t.trajectory_id)


def _share_prefix(parent: Trajectory, pw: _Walk, child: Trajectory, cw: _Walk,
                  root: str) -> None:
    """A sub-trajectory that starts with a copy of its parent's first steps shares their
    tokens: both go in one prefix group, the child's prefix as long as the parent's prompt
    that held those steps (at most the child's first input)."""
    copied = [s for _, _, s in cw.seq]
    n = 0
    for s in copied:
        if s.get("is_copied_context") is not True or n >= len(pw.seq):
            break
        mine = pw.seq[n][2]
        if (s.get("source"), s.get("message")) != (mine.get("source"), mine.get("message")):
            break
        n += 1
    if not n:
        return
    held = next((call.prompt for call, pos in zip(pw.calls, pw.positions, strict=True)
                 if pos >= n and call.prompt is not None), None)
    first_child, first_parent = child.steps[0], parent.steps[0]
    if held is None or not isinstance(first_child, LLM) or not isinstance(first_parent, LLM):
        return
    share = min(held, first_child.input_tokens)
    if not share or not first_parent.input_tokens:
        return
    group = f"{FORMAT}/{root}"
    child.prefix_group, child.prefix_tokens = group, share
    if parent.prefix_group is None:
        parent.prefix_group, parent.prefix_tokens = group, first_parent.input_tokens


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one ATIF file, or a folder of them."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import ATIF files and folders; a file another one references is not a root of its own."""
    opts, opt = _options(options)
    docs: list[Doc] = []
    skipped: list[str] = []
    for f, from_folder in files_in_tree(paths, (".json", ".json.gz")):
        data = read_json(f)
        if from_folder and not looks_atif(data):
            skipped.append(str(f))  # a folder's other JSON (a run's config, results)
            continue
        docs.append(make_doc(f, str(f), data))
    if not docs:
        raise InputError(f"{FORMAT} import: no ATIF trajectory in {', '.join(map(str, paths))}")
    resolver = Resolver(docs)
    referenced = _referenced(docs, resolver)
    imp = _Import(resolver, opt)
    for d in docs:
        imp.counter(d)
    if all(id(d) in referenced for d in docs):
        raise InputError(f"{FORMAT} import: every trajectory given is referenced by another "
                         "(their references form a cycle)")
    sessions = Counter(d.text("trajectory_id") or d.text("session_id") or d.path.stem
                       for d in docs if id(d) not in referenced)
    for d in docs:
        if id(d) in referenced:
            continue
        base = d.text("trajectory_id") or d.text("session_id") or d.path.stem
        if sessions[base] > 1:  # one session id in several files (copies, test outputs)
            base = f"{base}/{d.path.name}"
        imp.build(d, imp.new_id(base), None, set())
    if not imp.trajs:
        raise InputError(f"{FORMAT} import: no agent step with a model call in "
                         f"{len(docs)} file(s): nothing to replay")
    known = [v for v in imp.starts.values() if v is not None]
    base_ns = min(known) if known else 0
    for t in imp.trajs:
        root = imp.root_of(t)
        st = imp.starts.get(root)
        t.start_s = round((st - base_ns) / NS, 6) if st is not None else 0.0
        t.priority, t.tenant = opts["priority"], opts["tenant"]
    return Imported(build_frame(imp.trajs), provenance(FORMAT, docs, imp.counts, opts,
                                                       skipped),
                    warnings(imp.counts, skipped))


def _referenced(docs: list[Doc], resolver: Resolver) -> set[int]:
    """Documents of the import that another one names (a sub-agent or a continuation)."""
    out: set[int] = set()
    for d in docs:
        nxt = resolver.by_file(d, d.data.get("continued_trajectory_ref"))
        if nxt is not None and nxt is not d:
            out.add(id(nxt))
        for s in d.steps:
            obs = s.get("observation") if isinstance(s, dict) else None
            results = obs.get("results") if isinstance(obs, dict) else None
            for r in results if isinstance(results, list) else []:
                refs = r.get("subagent_trajectory_ref") if isinstance(r, dict) else None
                for ref in refs if isinstance(refs, list) else []:
                    child = resolver.subagent(d, ref) if isinstance(ref, dict) else None
                    if child is not None and child is not d:
                        out.add(id(child))
    return out


IMPORTER = Format("atif", import_paths, many=True)
