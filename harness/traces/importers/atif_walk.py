"""ATIF documents read into the intermediate form (form.py): each agent step with a model call
is a response; its tool calls, and the sub-agents their results name, are the pause after it.

A document and the ones that continue it are one conversation; sub-trajectories are its
children, read depth-first. Tool calls are timed by the next step's timestamp (approximate),
else by the options (inferred); a spawn step waits from its last sub-agent's last step to the
step after the one that started them.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_SECONDS, MAX_SUBAGENT_DEPTH
from harness.traces.importers._common import quote
from harness.traces.importers.agent_tools import call_class
from harness.traces.importers.atif_read import SOURCES, Doc, Resolver
from harness.traces.importers.form import APPROXIMATE, INFERRED, Call, Convo, Response
from harness.traces.importers.otel_read import NS, count, iso_ns
from harness.userfiles import count_tokens

# A tool result that says it failed (read, never stored): an error outcome.
_FAILED = re.compile(r"\A\s*(?:error|exception)\b|Traceback \(most recent call last\)", re.I)
REPLACING = frozenset({"replace", "truncate"})  # context_management boundaries that cut
_Kid = tuple[Doc, str, int | None, int | None]  # a sub-agent: its document, name, first, last


@dataclass(frozen=True)
class Latencies:
    """The options' tool latencies (a default, per tool name) and the user's."""

    tool: float
    per_tool: dict[str, float]
    human: float


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


def _gap(a: float, b: float, c: Counter[str]) -> float:
    """Seconds from `a` to `b`; 0 when the timestamps run backwards (counted: clock_skew)."""
    if b < a:
        c["clock_skew"] += 1
        return 0.0
    return min((b - a) / NS, MAX_SECONDS)


@dataclass
class Walk:
    """A conversation's responses and pauses as its steps are read."""

    responses: list[Response] = field(default_factory=list)
    kids: list[list[_Kid]] = field(default_factory=list)  # per response: sub-agents started
    ends: list[int | None] = field(default_factory=list)  # per response: its pause's end
    early: list[_Kid] = field(default_factory=list)  # started before the first call
    positions: list[int] = field(default_factory=list)  # index in `seq` of each call
    seq: list[tuple[Doc, int, dict[str, Any]]] = field(default_factory=list)
    waiting: list[Call] = field(default_factory=list)  # timed by the next step's timestamp
    waiting_pause: int | None = None
    since: int = 0  # tokens (by the rule) appended since the last call
    cut: bool = False
    last_ts: int | None = None
    first_ts: int | None = None


class Reader:
    """Reads documents into conversations, counting into each file's counter."""

    def __init__(self, resolver: Resolver, opt: Latencies) -> None:
        self.resolver, self.opt = resolver, opt
        self.counts: dict[Path, Counter[str]] = {}
        self.walks: dict[int, Walk] = {}  # id(conversation) -> how it was read

    def counter(self, doc: Doc) -> Counter[str]:
        return self.counts.setdefault(doc.path, Counter())

    def read(self, doc: Doc, key: str, stack: set[int], child: bool = False) -> Convo | None:
        """The conversation of `doc` (and its continuations) with its sub-agents as children;
        None when it makes no model call. `stack`: the documents above it."""
        if len(stack) > MAX_SUBAGENT_DEPTH:
            raise InputError(f"{doc.where}: sub-agents nested deeper than "
                             f"{MAX_SUBAGENT_DEPTH} levels (the limit)")
        inner = stack | {id(doc)}
        w = self._walk(doc, inner)
        c = self.counter(doc)
        if not w.responses:
            c["empty_trajectories"] += 1
            return None
        for r, kids, end in zip(w.responses, w.kids, w.ends, strict=True):
            p = r.after
            if p.calls and all(k.ts is not None and k.result_ts is not None for k in p.calls):
                p.wall_s = max(0.0, (max(k.result_ts or 0 for k in p.calls)
                                     - min(k.ts or 0 for k in p.calls)) / NS)
            for d, name, _, _ in kids:
                kid = self.read(d, d.text("trajectory_id") or d.text("session_id") or d.agent,
                                inner, True)
                assert kid is not None  # a sub-agent is named only where it makes calls
                p.children.append(kid)
                p.names.append(name)
            if kids:
                p.names += [k.name for k in p.calls]
                last = [e for _, _, _, e in kids]
                if end is not None and all(e is not None for e in last):
                    p.latency_s = max(0.0, (end - max(e or 0 for e in last)) / NS)
                else:  # the children's times are not known: the pause's own calls come on top
                    p.latency_s = max((k.latency_s or 0.0 for k in p.calls), default=0.0)
        convo = Convo(key, c, w.responses, first_ts=w.first_ts, under_parent=child)
        self.walks[id(convo)] = w
        return convo

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
            self.counter(doc)["continuations_missing" if nxt is None else "continuations"] += 1
            d = nxt
        return seq

    def _call(self, name: str, ts: int | None, result: bool = True, error: bool = False
              ) -> Call:
        """A tool call timed by the options until the next step's timestamp times it."""
        cls = call_class(name)
        return Call("", name, ts, has_result=result, error=error,
                    latency_s=self.opt.per_tool.get(name, self.opt.tool), timing=INFERRED,
                    cls=cls, mutating=cls == "mutating")

    @staticmethod
    def _settle(w: Walk, ts: int | None, c: Counter[str]) -> None:
        """Time the calls (and a spawning pause) waiting for the step that follows them."""
        for k in w.waiting:
            if k.ts is not None and ts is not None:
                k.latency_s = _gap(k.ts, ts, c)
                k.result_ts, k.timing = ts, APPROXIMATE
        if w.waiting_pause is not None and ts is not None:
            w.ends[w.waiting_pause] = ts
        w.waiting, w.waiting_pause = [], None

    def _children(self, doc: Doc, refs: list[Any], at: str, stack: set[int],
                  c: Counter[str]) -> list[_Kid]:
        out: list[_Kid] = []
        for j, ref in enumerate(refs):
            if not isinstance(ref, dict):
                raise InputError(f"{at}: subagent_trajectory_ref[{j}]: expected a JSON object")
            child = self.resolver.subagent(doc, ref)
            if child is not None and id(child) in stack:
                raise InputError(f"{at}: subagent_trajectory_ref[{j}] names a trajectory that "
                                 "is already its ancestor")
            if child is None or not _has_calls(child):
                c["subagents_missing"] += 1
                continue
            steps = [s for s in child.steps if isinstance(s, dict)]
            stamps = [s.get("timestamp") for s in steps if isinstance(s.get("timestamp"), str)]
            span = [iso_ns(x, child.where, "timestamp") for x in stamps[:1] + stamps[-1:]]
            out.append((child, child.agent, span[0] if span else None,
                        span[-1] if span else None))
        return out

    def _agent(self, d: Doc, s: dict[str, Any], at: str, ts: int | None, w: Walk,
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
            if o is None:
                c["output_estimated"] += 1
                o = count_tokens(out_text) + sum(count_tokens(
                    f"{tc.get('function_name')} {json.dumps(tc.get('arguments'), default=str)}")
                    for tc in calls if isinstance(tc, dict))
            w.responses.append(Response(0, p, o, k, ts, ts, counted_in=w.since,
                                        cut="compaction" if w.cut else None))
            w.kids.append([])
            w.ends.append(None)
            w.positions.append(len(w.seq) - 1)
            w.since, w.cut = 0, False
        if not w.responses:
            c["tool_calls_before_first_call"] += len(calls)
            return
        pause = w.responses[-1].after
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
            call = self._call(tc["function_name"], ts, bool(res), failed)
            pause.calls.append(call)
            w.waiting.append(call)
            refs = [x for r in mine for x in _list(r, "subagent_trajectory_ref", at)]
            w.kids[-1] += self._children(d, refs, at, stack, c)
        loose = [x for r in general for x in _list(r, "subagent_trajectory_ref", at)]
        ids = {tc.get("tool_call_id") for tc in calls if isinstance(tc.get("tool_call_id"), str)}
        loose += [x for sc, rs in by_call.items() if sc not in ids for r in rs
                  for x in _list(r, "subagent_trajectory_ref", at)]
        w.kids[-1] += self._children(d, loose, at, stack, c)
        if w.kids[-1]:
            w.waiting_pause = len(w.responses) - 1

    def _system(self, d: Doc, s: dict[str, Any], at: str, w: Walk, stack: set[int],
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
        kids = self._children(d, refs, at, stack, c)
        if not kids:
            if refs and w.responses:  # a delegation whose trajectory is missing: a plain pause
                call = self._call("subagent", w.last_ts)
                w.responses[-1].after.calls.append(call)
                w.waiting.append(call)
            return
        if not w.responses:
            c["subagents_before_first_call"] += len(kids)
            w.early += kids
            return
        w.kids[-1] += kids
        w.waiting_pause = len(w.responses) - 1

    def _walk(self, doc: Doc, stack: set[int]) -> Walk:
        w = Walk()
        c = self.counter(doc)
        for d, i, s in self._chain(doc, stack):
            at = f"{d.where}: steps[{i}]"
            src = s.get("source")
            if src not in SOURCES:
                raise InputError(f"{at}: 'source' must be one of {', '.join(SOURCES)}, "
                                 f"got {quote(src)}")
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
            self._settle(w, ts, c)
            if ts is not None and w.first_ts is None:
                w.first_ts = ts
            if src == "agent":
                self._agent(d, s, at, ts, w, stack, c)
            elif src == "user":
                c["user_turns"] += 1
                w.since += count_tokens(_text(s.get("message")))
                p = w.responses[-1].after if w.responses else None
                if p is not None and not p.calls and not w.kids[-1] and not p.human:
                    p.human = True
                    gap = None if ts is None or w.last_ts is None else _gap(w.last_ts, ts, c)
                    p.latency_s = self.opt.human if gap is None else gap
                    c["human_latency_inferred" if gap is None else "human_latency_timed"] += 1
            else:
                w.since += count_tokens(_text(s.get("message")))
                self._system(d, s, at, w, stack, c)
            w.last_ts = ts if ts is not None else w.last_ts
        for k in w.waiting:  # the last step's calls: nothing after them
            if not k.has_result:
                k.latency_s = None
        if w.kids:
            w.kids[0][:0] = w.early
        return w


def _has_calls(doc: Doc) -> bool:
    return any(isinstance(s, dict) and s.get("source") == "agent"
               and s.get("is_copied_context") is not True and s.get("llm_call_count") != 0
               for s in doc.steps)


def seconds_option(value: str, what: str, fmt: str) -> float:
    """An option's seconds, from 0 to MAX_SECONDS; InputError naming it otherwise."""
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
        raise InputError(f"{fmt} import: option {what} must be seconds from 0 to "
                         f"{MAX_SECONDS:g}, got {value!r}")
    return v
