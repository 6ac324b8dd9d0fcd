"""One OpenTelemetry GenAI trace as a root trajectory and its sub-agents.

Spans are classified by `gen_ai.operation.name` (chat, text_completion, generate_content,
call_llm: an LLM call; execute_tool: a tool; invoke_agent, create_agent: an agent), else by
OpenInference's `openinference.span.kind` (LLM, TOOL, AGENT; CHAIN is structure), else by
OpenLLMetry's `traceloop.span.kind`, else by the Langfuse observation type (GENERATION, TOOL,
AGENT), else a span named `tool.*` or `execute_tool *`, or one named like a tool the model called,
is a tool. Anything else is structure (counted by kind, never an error).

An agent span nested in a tool span, or in an agent that made model calls of its own, is a
sub-agent (a wrapper agent with no calls of its own is the same conversation). An LLM span
nested in another is one call (the instrumentation of two layers); a tool span nested in another
is one call.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator

from harness.limits import MAX_SECONDS, MAX_SUBAGENT_DEPTH
from harness.traces.importers.agent_tools import call_class
from harness.traces.importers.form import APPROXIMATE, EXACT, Call, Convo, Pause, Response, Usage
from harness.traces.importers.otel_attrs import (
    INPUT_ATTRS,
    OUTPUT_ATTRS,
    agent_name,
    call_ids,
    classify,
    input_roles,
    requested_calls,
    skip_kind,
    texts,
    tool_name,
    usage_of,
)
from harness.traces.importers.otel_read import NS, Span, fail
from harness.userfiles import count_tokens

ROOT = ""  # the trace itself, owner of every span outside a sub-agent


class _Trace:
    """A trace's spans, their tree and classes."""

    def __init__(self, spans: list[Span], c: Counter[str]) -> None:
        self.by_id: dict[str, Span] = {}
        for s in spans:
            if s.sid in self.by_id:
                c["duplicate_spans"] += 1
                continue
            self.by_id[s.sid] = s
        self.parent = {k: (s.parent if s.parent in self.by_id and s.parent != k else None)
                       for k, s in self.by_id.items()}
        c["orphan_spans"] += sum(1 for s in self.by_id.values()
                                 if s.parent and s.parent not in self.by_id)
        self.depth = self._depths()
        base = {k: classify(s, set()) for k, s in self.by_id.items()}
        self.asked = {k: requested_calls(self.by_id[k]) for k, v in base.items() if v == "llm"}
        names = {n for calls in self.asked.values() for _, n in calls}
        self.kind = {k: v or classify(self.by_id[k], names) for k, v in base.items()}

    def _depths(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for k in self.by_id:
            chain: list[str] = []
            node = k
            while node not in depth:
                if len(chain) > len(self.by_id):
                    s = self.by_id[k]
                    raise fail(s.where, f"span {k}: its chain of parents loops")
                chain.append(node)
                p = self.parent[node]
                if p is None:
                    depth[node] = 0
                    chain.pop()
                    break
                node = p
            for n in reversed(chain):
                depth[n] = depth[self.parent[n] or n] + 1
        return depth

    def up(self, k: str) -> Iterator[str]:
        p = self.parent[k]
        while p is not None:
            yield p
            p = self.parent[p]


def _secs(a: int, b: int, where: str, c: Counter[str]) -> float:
    d = (b - a) / NS
    if d < 0:
        c["clock_skew"] += 1
        return 0.0
    if d > MAX_SECONDS:
        raise fail(where, f"a duration of {d:.0f} s is over the limit of {MAX_SECONDS:.0f} s")
    return d


def read_trace(spans: list[Span], root_id: str, c: Counter[str]) -> list[Convo]:
    """The root conversations of one trace's spans (the root named `root_id`; its sub-agents
    are their children), counting into `c`."""
    t = _Trace(spans, c)
    kind, by_id = t.kind, t.by_id
    for k, v in kind.items():
        if v is None:
            c[f"skipped.{skip_kind(by_id[k])}"] += 1
    dup: dict[str, str] = {}  # an LLM or tool span nested in one of its kind -> the outer one
    for k in sorted(kind, key=lambda x: t.depth[x]):
        if kind[k] in ("llm", "tool"):
            outer = next((a for a in t.up(k) if kind[a] in ("llm", "tool", "agent")), None)
            if outer is not None and kind[outer] == kind[k]:
                dup[k] = dup.get(outer, outer)
                c[f"nested_{kind[k]}_spans"] += 1

    def nearest_agent(k: str) -> str:
        return next((a for a in t.up(k) if kind[a] == "agent"), ROOT)

    direct: Counter[str] = Counter(nearest_agent(k) for k, v in kind.items()
                                   if v == "llm" and k not in dup)
    has_llm: set[str] = set()
    for k, v in kind.items():
        if v == "llm":
            has_llm.update(a for a in t.up(k) if kind[a] == "agent")
    sub: dict[str, str | None] = {}  # sub-agent -> the tool span that started it (if any)
    for a in sorted((k for k, v in kind.items() if v == "agent" and k in has_llm),
                    key=lambda x: t.depth[x]):
        via: str | None = None
        for anc in t.up(a):
            if kind[anc] == "tool" and via is None:
                via = anc
            if kind[anc] == "agent" and (direct[anc] or anc in sub):
                break
        else:
            anc = ROOT
        if via is not None or direct[anc]:
            sub[a] = via

    def owner(k: str) -> str:
        if k in sub:
            return k
        return next((a for a in t.up(k) if a in sub), ROOT)

    nest: dict[str, int] = {ROOT: 0}
    for a in sorted(sub, key=lambda x: t.depth[x]):
        up = t.parent[a]
        nest[a] = nest[ROOT if up is None else owner(up)] + 1
        if nest[a] > MAX_SUBAGENT_DEPTH:
            raise fail(by_id[a].where, f"sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} "
                                       "levels (the limit)")
    members: dict[str, list[str]] = {}
    for k, v in kind.items():
        if v in ("llm", "tool") and k not in dup:
            members.setdefault(owner(k), []).append(k)
    kids: dict[str, list[str]] = {}
    for a in sub:
        up = t.parent[a]
        kids.setdefault(ROOT if up is None else owner(up), []).append(a)
    return _Owner(t, dup, sub, members, kids, c).roots(root_id)


class _Owner:
    """Reads each conversation of a trace from the spans it owns."""

    def __init__(self, t: _Trace, dup: dict[str, str], sub: dict[str, str | None],
                 members: dict[str, list[str]], kids: dict[str, list[str]],
                 c: Counter[str]) -> None:
        self.t, self.dup, self.sub, self.members, self.kids = t, dup, sub, members, kids
        self.c = c
        self.inner: dict[str, list[str]] = {}
        for k, o in dup.items():
            self.inner.setdefault(o, []).append(k)

    def _inside(self, k: str, kind: str, stop: str) -> bool:
        for a in self.t.up(k):
            if a == stop:
                return False
            if self.t.kind[a] == kind:
                return True
        return False

    def _llms(self, o: str) -> list[str]:
        """The calls a trajectory makes itself (not those inside its tools), in time order."""
        t = self.t
        return sorted((k for k in self.members.get(o, []) if t.kind[k] == "llm"
                       and not self._inside(k, "tool", o)),
                      key=lambda k: (t.by_id[k].start or 0, t.depth[k]))

    def _kids(self, o: str) -> list[str]:
        """Its sub-agents that make calls; one that makes none stands for its own."""
        out: list[str] = []
        for a in self.kids.get(o, []):
            out.extend([a] if self._llms(a) else self._kids(a))
        return out

    def _response(self, k: str) -> Response:
        s = self.t.by_id[k]
        u = usage_of(s)
        for other in self.inner.get(k, []):
            if u is None:
                u = usage_of(self.t.by_id[other])
        u = u or Usage()
        if u.cached is not None and u.prompt is not None and u.cached > u.prompt:
            u = Usage(u.prompt + u.cached, u.output, u.cached)  # a prompt without its cache
            self.c["prompt_plus_cached"] += 1
        # The text is read only where the usage is missing: messages can be long.
        prompt_est: int | None = None
        output = u.output
        if u.prompt is None:
            text_in = " ".join(texts(s.attrs.get(a)) for a in INPUT_ATTRS) + " " + texts(s.inputs)
            prompt_est = count_tokens(text_in) if text_in.strip() else None
        if output is None:
            self.c["output_estimated"] += 1
            output = count_tokens(" ".join(texts(s.attrs.get(a)) for a in OUTPUT_ATTRS)
                                  + " " + texts(s.output))
        return Response(0, u.prompt, output, u.cached, s.start, s.end, prompt_est=prompt_est)

    def roots(self, root_id: str) -> list[Convo]:
        """The trace's root conversation; without calls of its own, its sub-agents."""
        if self._llms(ROOT):
            return [self.read(ROOT, root_id, True)]
        out = []
        for a in self._kids(ROOT):
            self.c["subagents_promoted"] += 1
            out.append(self.read(a, f"{root_id}/{a}", True))
        return out

    def read(self, o: str, key: str, root: bool) -> Convo:
        """The conversation of owner `o` (it makes calls), its sub-agents as children."""
        t, c = self.t, self.c
        mine = self.members.get(o, [])
        llms = self._llms(o)
        c["llm_in_tool"] += sum(1 for k in mine if t.kind[k] == "llm") - len(llms)
        starts = [t.by_id[k].start or 0 for k in llms]
        pauses = [Pause() for _ in llms]
        tools: list[list[str]] = [[] for _ in llms]
        for k in sorted((k for k in mine if t.kind[k] == "tool"),
                        key=lambda k: t.by_id[k].start or 0):
            g = bisect_right(starts, t.by_id[k].start or 0) - 1
            if g < 0:
                c["tools_before_first_call"] += 1
                continue
            tools[g].append(k)
        spans: list[list[tuple[int | None, int | None]]] = []
        for g in range(len(llms)):
            spans.append(self._calls(llms, g, tools[g], pauses[g]))
        ends: list[list[int | None]] = [[] for _ in llms]
        for a in self._kids(o):
            s = t.by_id[a]
            via = self.sub[a]
            at = t.by_id[via].start if via else s.start
            g = bisect_right(starts, at or 0) - 1
            if g < 0:
                c["subagents_before_first_call"] += 1
                g = 0
            pauses[g].children.append(self.read(a, a, False))
            pauses[g].names.append(agent_name(s))
            ends[g].append(s.end)
        responses = [self._response(k) for k in llms]
        for g, (r, p) in enumerate(zip(responses, pauses, strict=True)):
            self._fill(llms, g, p, spans[g], ends[g])
            r.after = p
        if root:
            c["user_turns"] += 1
        return Convo(key, c, responses, first_ts=starts[0], under_parent=not root)

    def _calls(self, llms: list[str], g: int, tools: list[str], p: Pause
               ) -> list[tuple[int | None, int | None]]:
        """The calls of the pause after call g: its tool spans, and calls it asked for with no
        span; each one's start and end (ns, where known)."""
        t, c = self.t, self.c
        nxt = t.by_id[llms[g + 1]].start if g + 1 < len(llms) else None
        llm = t.by_id[llms[g]]
        asked = list(t.asked.get(llms[g], []))
        times: list[tuple[int | None, int | None]] = []
        for k in tools:
            s = t.by_id[k]
            name, ids = tool_name(s), call_ids(s)
            hit = next((i for i, (cid, n) in enumerate(asked) if cid and cid in ids), None)
            if hit is None:
                hit = next((i for i, (_, n) in enumerate(asked) if n == name), None)
            if hit is not None:
                asked.pop(hit)
            start = s.start or 0
            if s.end is not None:
                lat: float | None = _secs(start, s.end, s.where, c)
                exact, result = True, True
            elif nxt is not None:  # no end, but the agent went on: until the next call
                lat, exact, result = _secs(start, nxt, s.where, c), False, True
            else:
                lat, exact, result = None, False, False
            p.calls.append(_call(name, lat, exact, result, s.error))
            times.append((s.start, s.end if s.end is not None else (
                nxt if lat is not None else None)))
        for _, name in asked:  # asked for, never traced: timed by the gap to the next call
            c["tool_calls_without_span"] += 1
            if nxt is not None and llm.end is not None:
                p.calls.append(_call(name, _secs(llm.end, nxt, llm.where, c), False, True))
                times.append((llm.end, nxt))
            else:
                p.calls.append(_call(name, 0.0 if nxt is not None else None, False,
                                     nxt is not None))
                times.append((None, None))
        return times

    def _fill(self, llms: list[str], g: int, p: Pause,
              times: list[tuple[int | None, int | None]], kid_ends: list[int | None]) -> None:
        """A pause's wall time, the wait after its sub-agents, or a user's turn or a gap's."""
        t = self.t
        if times and all(a is not None and b is not None for a, b in times):
            first = min(a for a, _ in times if a is not None)
            last = max(b for _, b in times if b is not None)
            p.wall_s = max(0.0, (last - first) / NS)
        if p.children:
            p.names += [k.name for k in p.calls]
            ends = [b for _, b in times if b is not None] + [e for e in kid_ends if e is not None]
            end = max(ends) if ends else None
            if end is not None and all(e is not None for e in kid_ends):
                done = max(e for e in kid_ends if e is not None)
                p.latency_s = max(0.0, (end - done) / NS)
            else:  # the children's times are not known: the pause's own calls come on top
                p.latency_s = max((k.latency_s or 0.0 for k in p.calls), default=0.0)
            return
        if p.calls or g + 1 >= len(llms):
            return
        prev, nxt = t.by_id[llms[g]], t.by_id[llms[g + 1]]
        if prev.end is not None and nxt.start is not None:
            p.latency_s = _secs(prev.end, nxt.start, nxt.where, self.c)
        before, after = input_roles(prev), input_roles(nxt)
        p.human = bool(before is not None and after and len(after) > len(before)
                       and after[-1] in ("user", "human"))
        self.c["user_turns"] += p.human


def _call(name: str, latency: float | None, exact: bool, result: bool,
          error: bool = False) -> Call:
    cls = call_class(name)
    return Call("", name, None, has_result=result, error=error, latency_s=latency,
                timing=EXACT if exact else APPROXIMATE, cls=cls, mutating=cls == "mutating")
