"""A recording's calls read back, checked field by field and with their contexts rebuilt.

Each `call` line stores only the blocks past what it shares with an earlier call (`prev`,
`shared`); its whole request is that call's context up to `shared` plus these, and its context
after the answer the request up to `answer_from` plus the answer's blocks. A field that is not
what the recorder writes is an InputError naming the file, the line and the field.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.proxy.answers import APIS, OPENAI_COMPLETIONS
from harness.proxy.conversations import AGENT_LINK, WAIT_LINK
from harness.proxy.hashing import KINDS
from harness.proxy.recorder import OUTCOMES
from harness.proxy.store import EVENTS, Recording, read_recording
from harness.userfiles import is_count, is_seconds

MAX_TIME_S = 1e9
LINKS = (AGENT_LINK, WAIT_LINK)
# (hash, tokens, kind)
BlockRow = tuple[str, int, str]


@dataclass
class Usage:
    prompt: int
    output: int
    cached: int | None
    exact: bool  # from the server's usage or timings, not estimated


@dataclass(frozen=True)
class Result:
    """A tool's result, back in this call's request."""

    ref: str  # the tool call's id, hashed
    name: str
    wall_s: float  # from the end of the answer it answers to this call's arrival
    call: int  # that answer's call
    error: bool  # the client marked it an error
    client: bool  # the tool call was written by the client, not made by an answer


@dataclass
class Call:
    """One recorded call."""

    id: int
    line: int
    api: str
    arrival: float
    end: float
    outcome: str
    usage: Usage | None
    conv: str | None
    how: str
    parent: tuple[str, int] | None
    blocks: tuple[BlockRow, ...]  # the whole request
    context: tuple[BlockRow, ...]  # the request up to answer_from, then the answer
    tool_calls: list[tuple[str, str]]  # (hashed id, tool name)
    results: list[Result]
    user_turn: bool
    session: str | None
    agent: str | None = None  # its agent header's value, hashed (a sub-agent's id)
    link: str | None = None  # how a sub-agent's first call was linked: agent | wait
    parent_tool: str | None = None  # the (hashed) tool call that spawned it (agent links)

    @property
    def tail(self) -> int:
        """Blocks at the end of the request that a continuation may have grown."""
        return 1 if self.api == OPENAI_COMPLETIONS else 0


@dataclass
class RecordedCalls:
    """The calls of one recording, in the order they ended, and what else its lines held."""

    recording: Recording
    calls: list[Call]
    unfinished: int  # calls that arrived and never ended (the proxy was killed)
    other_requests: int
    unparsed: int
    skipped: Counter[str] = field(default_factory=Counter)


class _Line:
    """Typed field access for one line, each failure naming file, line and field."""

    def __init__(self, path: Path, n: int, obj: dict[str, Any]) -> None:
        self.where = f"{path}: line {n}"
        self.obj = obj

    def fail(self, key: str, what: str) -> InputError:
        return InputError(f"{self.where}: field {key!r}: {what}")

    def count(self, key: str, value: Any = None) -> int:
        v: Any = self.obj.get(key) if value is None else value
        if not is_count(v):
            raise self.fail(key, f"must be an integer >= 0, got {v!r}")
        return int(v)

    def seconds(self, key: str) -> float:
        v: Any = self.obj.get(key)
        if not is_seconds(v) or v > MAX_TIME_S:
            raise self.fail(key, f"must be seconds >= 0 and <= {MAX_TIME_S:g}, got {v!r}")
        return float(v)

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        v = self.obj.get(key)
        if v not in allowed:
            raise self.fail(key, f"must be one of {', '.join(allowed)}, got {v!r}")
        return str(v)

    def text(self, key: str, value: Any = None, optional: bool = False) -> str | None:
        v = self.obj.get(key) if value is None else value
        if v is None and optional:
            return None
        if not isinstance(v, str) or len(v) > 4096:
            raise self.fail(key, f"must be a string, got {type(v).__name__}")
        return v

    def items(self, key: str) -> list[Any]:
        v = self.obj.get(key, [])
        if not isinstance(v, list):
            raise self.fail(key, "must be a list")
        return v

    def blocks(self, key: str) -> list[BlockRow]:
        out: list[BlockRow] = []
        for i, b in enumerate(self.items(key)):
            if (not isinstance(b, list) or len(b) < 3 or not isinstance(b[0], str)
                    or not is_count(b[1]) or b[2] not in KINDS):
                raise self.fail(f"{key}[{i}]", "must be [hash, tokens, kind, ...]")
            out.append((b[0], int(b[1]), b[2]))
        return out


def _usage(line: _Line) -> Usage | None:
    u = line.obj.get("usage")
    if u is None:
        return None
    if not isinstance(u, dict):
        raise line.fail("usage", "must be an object or null")
    cached = u.get("cached")
    if cached is not None and not is_count(cached):
        raise line.fail("usage.cached", f"must be an integer >= 0 or null, got {cached!r}")
    source = u.get("source")
    if source not in ("usage", "timings", "estimate"):
        raise line.fail("usage.source", f"must be usage, timings or estimate, got {source!r}")
    return Usage(line.count("usage.prompt", u.get("prompt")),
                 line.count("usage.output", u.get("output")), cached, source != "estimate")


def _pairs(line: _Line, key: str) -> list[tuple[str, str]]:
    out = []
    for i, tc in enumerate(line.items(key)):
        if not (isinstance(tc, list) and len(tc) == 2 and all(isinstance(x, str) for x in tc)):
            raise line.fail(f"{key}[{i}]", "must be [id, name]")
        out.append((tc[0], tc[1]))
    return out


def _results(line: _Line) -> list[Result]:
    out = []
    for i, r in enumerate(line.items("results")):
        ok = (isinstance(r, list) and len(r) == 6 and isinstance(r[0], str)
              and isinstance(r[1], str) and len(r[1]) <= 4096 and is_seconds(r[2])
              and r[2] <= MAX_TIME_S and is_count(r[3]) and r[4] in (0, 1) and r[5] in (0, 1))
        if not ok:
            raise line.fail(f"results[{i}]", "must be [id, name, wall_s, call, error, client]")
        out.append(Result(r[0], r[1], float(r[2]), int(r[3]), bool(r[4]), bool(r[5])))
    return out


def _call(line: _Line, path: Path, n: int, done: dict[int, Call]) -> Call | None:
    """A call line as a Call (None for one whose request was not JSON: not replayable)."""
    cid = line.count("id")
    if cid in done:
        raise line.fail("id", f"call {cid} is recorded twice")
    api = line.choice("api", APIS)
    arrival, end = line.seconds("arrival"), line.seconds("end")
    if end < arrival:
        raise line.fail("end", f"{end} is before the arrival {arrival}")
    outcome = line.choice("outcome", OUTCOMES)
    if line.obj.get("unparsed") or "conv" not in line.obj:
        return None
    conv = line.text("conv")
    how = line.choice("how", ("new", "subagent", "extends", "cut"))
    prev_raw, shared = line.obj.get("prev"), line.count("shared")
    new = line.blocks("blocks")
    if prev_raw is None:
        if shared:
            raise line.fail("shared", "must be 0 without a 'prev' call")
        request = tuple(new)
    else:
        prev = done.get(line.count("prev"))
        if prev is None:
            raise line.fail("prev", f"call {prev_raw} is not an earlier call of the recording")
        if shared > len(prev.context):
            raise line.fail("shared", f"{shared} blocks, but call {prev_raw}'s context has "
                                      f"{len(prev.context)}")
        request = prev.context[:shared] + tuple(new)
    answer_from = line.count("answer_from")
    if answer_from > len(request):
        raise line.fail("answer_from", f"{answer_from} is past the request's "
                                       f"{len(request)} blocks")
    parent_raw = line.obj.get("parent")
    parent = None
    if parent_raw is not None:
        if not (isinstance(parent_raw, list) and len(parent_raw) == 2
                and isinstance(parent_raw[0], str) and is_count(parent_raw[1])):
            raise line.fail("parent", "must be [conversation, call] or null")
        parent = (parent_raw[0], int(parent_raw[1]))
    return Call(cid, n, api, arrival, end, outcome, _usage(line), conv, how, parent, request,
                request[:answer_from] + tuple(line.blocks("answer")),
                _pairs(line, "tool_calls"), _results(line), line.obj.get("user_turn") is True,
                line.text("session", optional=True), line.text("agent", optional=True),
                None if line.obj.get("link") is None else line.choice("link", LINKS),
                line.text("parent_tool", optional=True))


def load_calls(folder: Path) -> RecordedCalls:
    """The calls of the recording in `folder` (see read_recording for what is refused)."""
    rec = read_recording(folder)
    path = folder / EVENTS
    done: dict[int, Call] = {}
    calls: list[Call] = []
    arrived: set[int] = set()
    out = RecordedCalls(rec, calls, 0, 0, 0)
    for n, obj in rec.events:
        line = _Line(path, n, obj)
        ev = obj["ev"]
        if ev == "request":
            arrived.add(line.count("id"))
        elif ev == "call":
            call = _call(line, path, n, done)
            ended = line.count("id")
            arrived.discard(ended)
            if call is None:
                out.unparsed += 1
                done.setdefault(ended, _placeholder(ended, n))
                continue
            done[call.id] = call
            calls.append(call)
        elif ev == "other":
            out.other_requests += 1
        else:
            out.skipped[ev[:40]] += 1
    out.unfinished = len(arrived)
    return out


def _placeholder(cid: int, n: int) -> Call:
    """An unparsed call: nothing shares its (unknown) context."""
    return Call(cid, n, APIS[0], 0.0, 0.0, "ok", None, None, "new", None, (), (), [], [], False,
                None)


def finite(x: float) -> bool:
    return math.isfinite(x)
