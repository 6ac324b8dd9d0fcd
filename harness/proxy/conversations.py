"""Joining calls into conversations and sub-agents, as they end, from their block hashes.

The rules, applied to a call as of its arrival:

1. Candidates are the conversations of the call's session (the value of its session header;
   calls without one form one pool of their own) whose latest call had ended when this one
   arrived.
2. The call continues a candidate when its blocks start with that candidate's whole last
   request (tail tolerance: a completions prompt's last chunk may have grown): of several, the
   one sharing the most blocks, then the latest. It *extends* it when it starts with the whole
   context (the last request and the answer), else it cuts the answer (a regenerate).
3. Else, a call that carries results of tool calls a candidate is waiting on (its last answer
   made them) continues it, cutting the context to the blocks they share (the client rewrote
   older messages, e.g. cleared old tool results).
4. Else, when a candidate is waiting on tool calls, the call starts a sub-agent of the one that
   began waiting last.
5. Else, with a session header, a call that shares at least its first block with a candidate
   continues the one sharing the most, cutting the context to the shared blocks (a compaction, a
   /clear that keeps the system prompt).
6. Else it starts a new conversation.

A call's tool results (blocks past the shared prefix) are matched by call id to the tool calls
its conversation is waiting on: the tool's wall time is this call's arrival less the end of the
call that made it. A tool call the client wrote into its own messages (no answer made it: a
client that parses calls from the model's text, or a scripted agent) is matched to its result
in the same request and timed from the conversation's last answer; the importer finds the
sub-agents started during such a pause (harness.traces.importers.recording). A call whose
new blocks hold a user message and no tool result is a user turn.
Without session headers, an independent agent that starts while another waits on a tool looks
like a sub-agent: send a session header (each agent its own) to tell them apart.

An agent header (a sub-agent's own id, e.g. Claude Code's x-claude-code-agent-id) names a
conversation inside its session: the candidates of rules 1-5 are the conversations of the same
session *and* agent, so agents are never joined into one another even when their first calls
are identical, and an agent's call never starts a guessed sub-agent (rule 4) but may continue
its own conversation by its first block (rule 5). A call of an agent id not seen before in its
session starts that agent's conversation: the sub-agent of the conversation of its session
waiting on a spawning tool call (an answer's Agent or Task call with no later call yet) that
began waiting last, one whose spawning calls all have their sub-agents coming after one that
has not (a sub-agent spawning its own is linked to it, not to the agent waiting above it);
with none waiting, a new conversation. These links are recorded as `agent` links; rule 4's
are guesses (`wait`).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from harness.proxy.hashing import CALL, RESULT, USER, Block

PAST_CALLS = 4  # calls kept per conversation: a call is joined as of its arrival
SPAWN_TOOLS = frozenset({"agent", "task"})  # tool names (lower case) that start a sub-agent
AGENT_LINK, WAIT_LINK = "agent", "wait"  # a sub-agent linked by its agent id, or guessed


@dataclass(frozen=True)
class CallView:
    """What the joiner needs of a call: its times, session, blocks and answer."""

    id: int
    arrival: float
    end: float
    session: str | None
    blocks: tuple[Block, ...]
    context: tuple[str, ...]  # hashes of the context after the call (request + answer)
    tool_calls: tuple[tuple[str, str], ...]  # (hashed call id, tool name) of the answer
    ok: bool
    tail: int = 0  # blocks at the end of the request that may grow (completions: 1)
    agent: str | None = None  # its agent header's value (hashed), inside its session


@dataclass
class ToolResult:
    """A tool call's result, back in a later request: `wall_s` after the call's answer."""

    ref: str
    name: str
    wall_s: float
    call: int  # the call whose answer made the tool call (or that the client answered)
    error: bool
    client: bool = False  # a call the client wrote into its messages, not one of an answer


@dataclass
class Joined:
    """Where a call went: its conversation, the call its shared blocks come from, how many,
    and (for the first call of a sub-agent) the parent conversation and the call it waits on."""

    conv: str
    how: str  # "new" | "subagent" | "extends" | "cut"
    prev: int | None = None
    shared: int = 0
    parent: tuple[str, int] | None = None
    user_turn: bool = False
    link: str | None = None  # how a sub-agent was linked: AGENT_LINK | WAIT_LINK
    parent_tool: str | None = None  # the (hashed) spawning tool call of an agent link
    results: list[ToolResult] = field(default_factory=list)


@dataclass
class _Past:
    id: int
    arrival: float
    end: float
    request: tuple[str, ...]
    context: tuple[str, ...]
    tool_calls: tuple[tuple[str, str], ...]
    ok: bool
    tail: int


@dataclass
class _Conv:
    id: str
    session: str | None
    agent: str | None
    calls: deque[_Past] = field(default_factory=lambda: deque(maxlen=PAST_CALLS))
    pending: dict[str, tuple[str, float, int]] = field(default_factory=dict)
    last_ok: tuple[int, float] | None = None  # its latest call that ended ok: id, end

    def as_of(self, t: float) -> _Past | None:
        """Its latest call that arrived by `t`, when that call had also ended by then."""
        for past in reversed(self.calls):
            if past.arrival <= t:
                return past if past.end <= t else None
        return None


def lcp(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many leading hashes `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


class Joiner:
    """Assigns each call to a conversation; calls come in the order they ended."""

    def __init__(self) -> None:
        self._convs: list[_Conv] = []
        self._by_id: dict[str, _Conv] = {}
        self.subagents = 0
        self.user_turns = 0
        self.tool_results = 0
        self._spawned: Counter[tuple[str, int]] = Counter()  # agent links per spawning call

    @property
    def conversations(self) -> int:
        return len(self._convs)

    def join(self, call: CallView) -> Joined:
        """The conversation `call` belongs to (created when new), and what it shows."""
        hashes = tuple(b.hash for b in call.blocks)
        mine = [c for c in self._convs if c.session == call.session and c.agent == call.agent]
        pool = [(c, p) for c in mine if (p := c.as_of(call.arrival)) is not None]
        best: tuple[int, float, _Conv, _Past] | None = None
        for conv, past in pool:
            m = lcp(hashes, past.context)
            if m >= max(1, len(past.request) - past.tail) and (
                    best is None or (m, past.end) > best[:2]):
                best = (m, past.end, conv, past)
        if best is not None:
            m, _, conv, past = best
            how = "extends" if m >= len(past.context) - past.tail else "cut"
            joined = self._continue(conv, past, call, m, how)
        else:
            waiting = [(p.end, c, p) for c, p in pool if p.ok and p.tool_calls]
            shared = [(lcp(hashes, p.context), p.end, c, p) for c, p in pool]
            cut = max(shared, key=lambda s: s[:2], default=None)
            refs = {b.ref for b in call.blocks if b.kind == RESULT}
            answering = [s for s in shared if any(r in refs for r, _ in s[3].tool_calls)]
            if call.agent is not None and not mine:
                joined = self._new_agent(call)
            elif answering:
                m, _, conv, past = max(answering, key=lambda s: s[:2])
                joined = self._continue(conv, past, call, m, "cut")
            elif waiting and call.agent is None:
                _, parent, spawned_after = max(waiting, key=lambda w: w[0])
                joined = self._new(call, "subagent", (parent.id, spawned_after.id))
                joined.link = WAIT_LINK
                self.subagents += 1
            elif (call.session is not None or call.agent is not None) and cut is not None \
                    and cut[0] >= 1:
                joined = self._continue(cut[2], cut[3], call, cut[0], "cut")
            else:
                joined = self._new(call, "new", None)
        self._remember(joined.conv, call)
        return joined

    def _new_agent(self, call: CallView) -> Joined:
        """The first call of an agent id new to its session: the sub-agent of the conversation
        waiting on a spawning tool call (see the module's rules), else a new conversation."""
        best: tuple[tuple[bool, float], _Conv, _Past, list[str]] | None = None
        for conv in self._convs:
            past = conv.as_of(call.arrival) if conv.session == call.session else None
            if past is None or not past.ok:
                continue
            refs = [r for r, name in past.tool_calls if name.lower() in SPAWN_TOOLS]
            key = (self._spawned[conv.id, past.id] < len(refs), past.end)
            if refs and (best is None or key > best[0]):
                best = (key, conv, past, refs)
        if best is None:
            return self._new(call, "new", None)
        _, conv, past, refs = best
        taken = self._spawned[conv.id, past.id]
        self._spawned[conv.id, past.id] += 1
        self.subagents += 1
        joined = self._new(call, "subagent", (conv.id, past.id))
        joined.link, joined.parent_tool = AGENT_LINK, refs[min(taken, len(refs) - 1)]
        return joined

    def _new(self, call: CallView, how: str, parent: tuple[str, int] | None) -> Joined:
        conv = _Conv(f"c{len(self._convs) + 1}", call.session, call.agent)
        self._convs.append(conv)
        self._by_id[conv.id] = conv
        return Joined(conv.id, how, parent=parent)

    def _continue(self, conv: _Conv, past: _Past, call: CallView, shared: int,
                  how: str) -> Joined:
        new = call.blocks[shared:]
        joined = Joined(conv.id, how, past.id, shared)
        # Calls the client wrote itself (a model whose tool calls it parses from text, a
        # scripted agent) show only here, beside their results: timed from the last answer.
        own = {b.ref: b.name or "" for b in new
               if b.kind == CALL and b.ref is not None and b.ref not in conv.pending}
        for b in new:
            if b.kind != RESULT or b.ref is None:
                continue
            if b.ref in conv.pending:
                name, end, made_by = conv.pending.pop(b.ref)
                joined.results.append(ToolResult(b.ref, name, max(0.0, call.arrival - end),
                                                 made_by, b.error))
            elif b.ref in own and conv.last_ok is not None:
                made_by, end = conv.last_ok
                joined.results.append(ToolResult(b.ref, own.pop(b.ref),
                                                  max(0.0, call.arrival - end), made_by,
                                                  b.error, client=True))
        self.tool_results += len(joined.results)
        if any(b.kind == USER for b in new) and not any(b.kind == RESULT for b in new):
            joined.user_turn = True
            self.user_turns += 1
        return joined

    def _remember(self, conv_id: str, call: CallView) -> None:
        conv = self._by_id[conv_id]
        conv.calls.append(_Past(call.id, call.arrival, call.end,
                                tuple(b.hash for b in call.blocks), call.context,
                                call.tool_calls, call.ok, call.tail))
        if call.ok:
            conv.last_ok = (call.id, call.end)
            for ref, name in call.tool_calls:
                conv.pending[ref] = (name, call.end, call.id)
