"""Claude Code transcript files, line by line: conversations of responses and tool calls.

A transcript line is `user`, `assistant`, `system`, `summary`, `progress`,
`file-history-snapshot`, `queue-operation` (and newer kinds); `user` and `assistant` lines hold
an API `message`. One API response is written as several `assistant` lines sharing
`message.id` (one content block each): they are one LLM call, its usage taken once (the largest
output the lines report). Tool calls are `tool_use` blocks; their `tool_result` blocks come in
`user` lines, with `toolUseResult` (durationMs, totalDurationMs, durationSeconds) where the
tool timed itself. Sub-agent conversations are `isSidechain` lines (their own `agent-*.jsonl`
files with `agentId`, or written inline in 1.0.x), or copies inside `progress` lines
(`data.type` agent_progress).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness.errors import InputError
from harness.traces.importers._common import quote
from harness.traces.importers.agent_log import (
    FileStats,
    count_field,
    parse_ts,
    seconds_field,
)
from harness.traces.importers.claude_code_meta import AgentMeta
from harness.traces.importers.form import Call, Convo, Response
from harness.userfiles import count_tokens, read_jsonl

SPAWN_TOOLS = ("Task", "Agent")
# Markers Claude Code writes as user text: not the user's prompt.
INTERRUPTED = "[Request interrupted by user"
REJECTED = ("The user doesn't want to proceed with this tool use",
            "User rejected tool use")
CLEAR = "<command-name>/clear</command-name>"
CUT_SUBTYPES = {"compact_boundary": "compaction", "microcompact_boundary": "compaction"}
# toolUseResult fields that time a tool exactly, in seconds per unit; the first present wins.
DURATIONS = (("totalDurationMs", 1e-3), ("durationMs", 1e-3), ("durationSeconds", 1.0))


@dataclass
class Entry:
    """A `user` or `assistant` line (or one copied into a progress line), or a marker."""

    n: int
    ts: float | None
    role: str  # user, assistant, or marker: compaction / clear
    message: dict[str, Any]
    meta: bool = False
    compact: bool = False
    result: Any = None  # toolUseResult
    uuid: str = ""


@dataclass
class Side:
    """A sub-agent conversation in a file: its entries and what links it to its parent."""

    entries: list[Entry]
    agent_id: str
    session: str
    convo: Convo | None = None
    progress_of: str = ""  # the parent's Task call id (progress copies)
    prompt: str = ""  # its first user text (matched against a Task's prompt)
    meta: AgentMeta | None = None  # its agent-<id>.meta.json (2.1.x): the exact parent call


@dataclass
class ClaudeFile:
    """One transcript file: its main conversation (may be empty) and sub-agent ones."""

    stats: FileStats
    session: str = ""
    main: list[Entry] = field(default_factory=list)
    sides: list[Side] = field(default_factory=list)


def _where(path: Path, n: int, fld: str = "") -> str:
    return f"{path}: line {n}" + (f": {fld}" if fld else "")


def _text(content: Any) -> str:
    """The text of a message's content or a tool result's (any nesting), for counting."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(b) for b in content)
    if isinstance(content, dict):
        if content.get("type") == "tool_use":
            return orjson.dumps(content.get("input")).decode()
        return "\n".join(_text(content[k]) for k in ("text", "thinking", "content")
                         if k in content)
    return ""


def _entry(path: Path, n: int, d: dict[str, Any]) -> Entry:
    msg = d.get("message")
    if not isinstance(msg, dict):
        raise InputError(f"{_where(path, n, 'message')} must be an object")
    return Entry(n, parse_ts(d.get("timestamp"), _where(path, n)), str(d["type"]), msg,
                 d.get("isMeta") is True, d.get("isCompactSummary") is True,
                 d.get("toolUseResult"), str(d.get("uuid") or ""))


def read_file(path: Path) -> ClaudeFile:
    """Parse one transcript into its main and sub-agent conversations' entries; lines that
    carry nothing a replay needs are counted by type."""
    f = ClaudeFile(FileStats(path))
    sk = f.stats.skipped
    roots: dict[str, str] = {}  # sidechain uuid -> its conversation's key
    sides: dict[str, Side] = {}
    for n, d in read_jsonl(path):
        if not isinstance(d, dict):
            raise InputError(f"{_where(path, n)}: expected a JSON object")
        kind = d.get("type")
        if not isinstance(kind, str):
            raise InputError(f"{_where(path, n, 'type')} must be a string, got {quote(kind)}")
        sid = d.get("sessionId")
        if isinstance(sid, str) and sid and not f.session:
            f.session = sid
        ver = d.get("version")
        if isinstance(ver, str) and not f.stats.version:
            f.stats.version = ver
        if kind == "system":
            _system(path, n, d, f)
        elif kind == "progress":
            _progress(path, n, d, f, sides)
        elif kind not in ("user", "assistant"):
            sk[kind] += 1
        elif isinstance(d.get("message"), dict) and d["message"].get("model") == "<synthetic>":
            sk["assistant (synthetic: an error Claude Code wrote)"] += 1
        elif d.get("isSidechain") is True:
            e = _entry(path, n, d)
            agent = d.get("agentId")
            parent = d.get("parentUuid")
            if isinstance(agent, str) and agent:
                key = agent
            elif isinstance(parent, str) and parent in roots:
                key = roots[parent]
            else:  # 1.0.x: a sidechain starts at a line whose parent is not a sidechain's
                key = e.uuid or f"line{n}"
            roots[e.uuid] = key
            side = sides.get(key)
            if side is None:
                side = sides[key] = Side([], agent if isinstance(agent, str) else "",
                                         sid if isinstance(sid, str) else "")
            side.entries.append(e)
        else:
            f.main.append(_entry(path, n, d))
    f.sides = list(sides.values())
    for s in f.sides:
        s.prompt = next((_text(e.message.get("content")).strip() for e in s.entries
                         if e.role == "user"), "")
    return f


def _system(path: Path, n: int, d: dict[str, Any], f: ClaudeFile) -> None:
    sub = d.get("subtype")
    content = d.get("content")
    cut = CUT_SUBTYPES.get(sub) if isinstance(sub, str) else None
    if cut is None and isinstance(content, str) and CLEAR in content:
        cut = "clear"
    if cut is None:
        f.stats.skipped[f"system:{sub}"] += 1
        return
    f.main.append(Entry(n, parse_ts(d.get("timestamp"), _where(path, n)), cut, {}))


def _progress(path: Path, n: int, d: dict[str, Any], f: ClaudeFile,
              sides: dict[str, Side]) -> None:
    """A progress line: an agent_progress one copies a sub-agent's message (the conversation
    is rebuilt from these where no sub-agent file holds it)."""
    data = d.get("data")
    inner = data.get("message") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("type") != "agent_progress" or not isinstance(
            inner, dict) or inner.get("type") not in ("user", "assistant"):
        f.stats.skipped[f"progress:{data.get('type') if isinstance(data, dict) else None}"] += 1
        return
    agent = data.get("agentId")
    parent = d.get("parentToolUseID")
    key = f"progress:{agent if isinstance(agent, str) else parent}"
    side = sides.get(key)
    if side is None:
        sid = d.get("sessionId")
        side = sides[key] = Side([], agent if isinstance(agent, str) else "",
                                 sid if isinstance(sid, str) else "",
                                 progress_of=parent if isinstance(parent, str) else "")
    where = _where(path, n, "data.message")
    msg = inner.get("message")
    if not isinstance(msg, dict):
        raise InputError(f"{where}.message must be an object")
    ts = parse_ts(inner.get("timestamp", d.get("timestamp")), where)
    side.entries.append(Entry(n, ts, str(inner["type"]), msg, result=inner.get("toolUseResult"),
                              uuid=str(inner.get("uuid") or "")))


class _State:
    """What came before the next response: the user's prompt, a cut, appended tokens."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Nothing has come since the response that just started."""
        self.user = False
        self.user_ts: float | None = None
        self.cut: str | None = None
        self.counted = 0


def _blocks(content: Any) -> Iterator[dict[str, Any]]:
    if isinstance(content, list):
        yield from (b for b in content if isinstance(b, dict))


def convo_of(entries: list[Entry], stats: FileStats, key: str, kind: str, task: bool,
             path: Path) -> Convo:
    """The conversation of `entries`: one response per message id, the tool calls they made
    and their results; `task`: its first user text is the task a parent gave (not a turn)."""
    convo = Convo(key, stats.counts, kind=kind)
    by_id: dict[str, Response] = {}
    calls: dict[str, Call] = {}
    st = _State()
    for e in entries:
        if e.ts is not None:
            convo.first_ts = e.ts if convo.first_ts is None else min(convo.first_ts, e.ts)
            convo.last_ts = e.ts if convo.last_ts is None else max(convo.last_ts, e.ts)
        if e.role in ("compaction", "clear"):
            st.cut = e.role
        elif e.role == "assistant":
            _assistant(e, convo, by_id, calls, st, path)
        else:
            task = _user(e, calls, st, task, path, stats)
    return convo


def _assistant(e: Entry, convo: Convo, by_id: dict[str, Response], calls: dict[str, Call],
               st: _State, path: Path) -> None:
    m = e.message
    c = convo.counts
    mid = m.get("id")
    key = mid if isinstance(mid, str) and mid else e.uuid or f"line{e.n}"
    usage = m.get("usage")
    where = _where(path, e.n, "message.usage")
    prompt = output = cached = None
    if isinstance(usage, dict):
        parts = [count_field(usage, k, where) for k in (
            "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
        prompt = sum(p or 0 for p in parts) if parts[0] is not None else None
        cached = parts[1] if prompt is not None else None
        output = count_field(usage, "output_tokens", where)
    elif usage is not None:
        raise InputError(f"{where} must be an object")
    r = by_id.get(key)
    if r is None:
        r = by_id[key] = Response(e.n, prompt, output or 0, cached, e.ts, e.ts,
                                  counted_in=st.counted, user_turn=st.user,
                                  user_ts=st.user_ts if st.user else None, cut=st.cut)
        convo.responses.append(r)
        c["llm_calls"] += 1
        c["user_turns"] += st.user
        st.reset()
    else:
        r.output = max(r.output, output or 0)
        if prompt is not None:
            r.prompt, r.cached = prompt, cached
        if e.ts is not None:
            r.end_ts = e.ts if r.end_ts is None else max(r.end_ts, e.ts)
    content = m.get("content")
    r.counted_out += count_tokens(_text(content))
    for b in _blocks(content):
        if b.get("type") == "server_tool_use":
            c["hosted_calls"] += 1
        if b.get("type") != "tool_use":
            continue
        cid, name = b.get("id"), b.get("name")
        if not isinstance(cid, str) or not cid or not isinstance(name, str) or not name:
            raise InputError(f"{_where(path, e.n, 'message.content')}: a tool_use needs a "
                             "string 'id' and 'name'")
        raw = b.get("input")
        inp: dict[str, Any] = raw if isinstance(raw, dict) else {}
        kind = inp.get("subagent_type")
        call = Call(cid, name, e.ts, spawn=name in SPAWN_TOOLS,
                    kind=kind if isinstance(kind, str) else "")
        if call.spawn:
            prompt_text = inp.get("prompt")
            call.prompt = prompt_text.strip() if isinstance(prompt_text, str) else ""
            c["subagent_calls"] += 1
        calls[cid] = call
        r.calls.append(call)
        c["tool_calls"] += 1


def _user(e: Entry, calls: dict[str, Call], st: _State, task: bool, path: Path,
          stats: FileStats) -> bool:
    """A user line: tool results, the user's prompt, or a marker. Returns whether the
    conversation's task prompt is still to come."""
    content = e.message.get("content")
    results = [b for b in _blocks(content) if b.get("type") == "tool_result"]
    texts = [_text(b) for b in _blocks(content) if b.get("type") == "text"]
    if isinstance(content, str):
        texts.append(content)
    for b in results:
        text = _text(b.get("content"))
        st.counted += count_tokens(text)
        call = calls.get(str(b.get("tool_use_id")))
        if call is None:
            stats.skipped["tool_result without its call"] += 1
            continue
        call.has_result, call.result_ts = True, e.ts
        call.result_tokens = count_tokens(text)
        call.error = b.get("is_error") is True
        res = e.result if len(results) == 1 else None
        if text.startswith((*REJECTED, INTERRUPTED)) or (
                isinstance(res, str) and res.startswith(REJECTED)) or (
                isinstance(res, dict) and res.get("interrupted") is True):
            call.abandoned = True
        if isinstance(res, dict) and call.spawn and (
                res.get("status") == "async_launched" or res.get("isAsync") is True):
            # Launched in the background: the parent went on without waiting for it, so the
            # sub-agent is not a child holding it paused.
            call.spawn = False
            stats.counts["async_subagent_calls"] += 1
        if isinstance(res, dict):
            where = _where(path, e.n, "toolUseResult")
            for fld, scale in DURATIONS:
                if res.get(fld) is not None:
                    call.exact_s = seconds_field(res[fld], where, fld, scale)
                    break
            aid = res.get("agentId")
            call.agent_id = aid if isinstance(aid, str) else ""
    text = "\n".join(texts).strip()
    if not text:
        return task
    st.counted += count_tokens(text)
    if e.compact:
        st.cut = "compaction"
    elif text.startswith(INTERRUPTED):
        for call in calls.values():  # calls still out when the user interrupted
            call.abandoned = call.abandoned or not call.has_result
    elif task:
        return False
    elif CLEAR in text:
        st.cut = "clear"
    elif not e.meta:
        st.user, st.user_ts = True, e.ts
    return task
