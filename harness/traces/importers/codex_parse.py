"""A Codex CLI rollout read into the intermediate form (form.py): one conversation of model
responses, the tool calls each made and what became of them, and the user's turns and
compactions between them. codex.py imports the rollouts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from harness.errors import InputError
from harness.traces.importers._common import quote
from harness.traces.importers.agent_log import (
    MAX_LOG_S,
    FileStats,
    count_calls,
    count_field,
    parse_ts,
    seconds_field,
)
from harness.traces.importers.form import Call, Convo, Response
from harness.userfiles import count_tokens, read_jsonl

ENVELOPE = ("session_meta", "response_item", "event_msg", "compacted", "turn_context")
CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")

# Tools OpenAI runs inside the response: part of the LLM call, not a pause of the agent.
HOSTED_ITEMS = ("web_search_call", "image_generation_call", "tool_search_call")
COMPACTION_ITEMS = ("compaction", "compaction_summary")

# A tool output's header (before "Output:"): unified exec and the shell tool state these.
_WALL_RE = re.compile(r"^Wall time: ([0-9]+(?:\.[0-9]+)?) seconds?\s*$", re.M)
_EXIT_RE = re.compile(r"^(?:Exit code:|Process exited with code) (-?[0-9]+)\s*$", re.M)

# Context given as a user message that is not the user's prompt (legacy rollouts, which have
# no user_message events).
_NOT_PROMPT = ("<environment_context>", "<user_instructions>", "# AGENTS.md", "<permissions")


def _text(value: Any) -> str:
    """The text of a message's content, an output or a reasoning summary (any nesting)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_text(value[k]) for k in ("text", "content", "output") if k in value)
    return ""


class Rollout:
    """One rollout file, read line by line into a conversation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stats = FileStats(path)
        self.convo = Convo("", self.stats.counts)
        self.calls: dict[str, Call] = {}
        self.facts: dict[str, dict[str, Any]] = {}  # call_id -> durations and exit code
        self.pending: list[Call] = []
        self.open = False  # model output since the last response ended
        self.first_item: float | None = None
        self.last_item: float | None = None
        self.counted_in = 0
        self.counted_out = 0
        self.user = False
        self.user_ts: float | None = None
        self.cut: str | None = None
        self.last_total: tuple[int, int, int] | None = None
        self.last_usage: tuple[int, int, int] | None = None
        self.with_usage = False
        self.user_events = False

    def where(self, n: int, field: str = "") -> str:
        """'<file>: line <n>[: <field>]' for an error."""
        return f"{self.path}: line {n}" + (f": {field}" if field else "")

    def read(self) -> Convo:
        """The rollout's conversation; its counts are in self.stats."""
        lines = self._normalise(read_jsonl(self.path))
        self.with_usage = any(k == "event_msg" and p.get("type") == "token_count"
                              and p.get("info") is not None for _, _, k, p in lines)
        self.user_events = any(k == "event_msg" and p.get("type") == "user_message"
                               for _, _, k, p in lines)
        for n, ts, kind, payload in lines:
            if ts is not None:
                c = self.convo
                c.first_ts = ts if c.first_ts is None else min(c.first_ts, ts)
                c.last_ts = ts if c.last_ts is None else max(c.last_ts, ts)
            if kind == "session_meta":
                self._meta(n, payload)
            elif kind == "response_item":
                self._item(n, ts, payload)
            elif kind == "event_msg":
                self._event(n, ts, payload)
            elif kind == "compacted":
                self.cut = "compaction"
            else:
                self.stats.skipped[kind] += 1
        if self.open:
            self._close(None, None)
        self._finish()
        return self.convo

    def _normalise(self, raw: list[tuple[int, Any]]
                   ) -> list[tuple[int, float | None, str, dict[str, Any]]]:
        """(line, time, kind, payload) of each line: envelope lines as they are; a legacy
        header as session_meta and bare items as response_item; the rest as its type."""
        out: list[tuple[int, float | None, str, dict[str, Any]]] = []
        for n, d in raw:
            if not isinstance(d, dict):
                raise InputError(f"{self.where(n)}: expected a JSON object")
            ts = parse_ts(d.get("timestamp"), self.where(n))
            kind = d.get("type")
            if isinstance(kind, str) and "payload" in d:
                payload = d["payload"]
                if not isinstance(payload, dict):
                    raise InputError(f"{self.where(n, 'payload')} must be an object")
                out.append((n, ts, kind if kind in ENVELOPE else f"unknown:{kind}", payload))
            elif "record_type" in d:
                out.append((n, ts, f"record_type:{d['record_type']}", {}))
            elif kind is None and "id" in d and not out:  # the legacy session header
                out.append((n, ts, "session_meta", d))
            elif isinstance(kind, str):
                out.append((n, ts, "response_item", d))
            else:
                raise InputError(f"{self.where(n, 'type')} must be a string "
                                 "(a rollout line or a response item)")
        if out and out[0][2] == "session_meta":  # the header's instructions reach the model
            self.counted_in += count_tokens(_text(out[0][3].get("instructions")))
        return out

    def _meta(self, n: int, p: dict[str, Any]) -> None:
        sid, ver = p.get("id"), p.get("cli_version")
        if not isinstance(sid, str) or not sid:
            raise InputError(f"{self.where(n, 'payload.id')} must be the session id (a string)")
        if not self.stats.ident:
            self.stats.ident = sid
            self.stats.version = ver if isinstance(ver, str) else ""
            src = p.get("source")
            if isinstance(src, dict) and "subagent" in src:  # a sub-agent's own rollout
                self.convo.kind = "subagent"
                self.stats.counts["subagents"] += 1
                self.stats.counts["subagents_unlinked"] += 1

    def _ptype(self, n: int, p: dict[str, Any]) -> str:
        t = p.get("type")
        if not isinstance(t, str):
            raise InputError(f"{self.where(n, 'payload.type')} must be a string, got {quote(t)}")
        return t

    def _model(self, ts: float | None) -> None:
        """Model output seen: a response is open (closed by its token_count)."""
        self.open = True
        if ts is not None:
            self.first_item = ts if self.first_item is None else self.first_item
            self.last_item = ts

    def _item(self, n: int, ts: float | None, p: dict[str, Any]) -> None:
        t = self._ptype(n, p)
        if t == "message":
            role = p.get("role")
            text = _text(p.get("content"))
            if role == "assistant":
                self._model(ts)
                self.counted_out += count_tokens(text)
                return
            self._input()
            self.counted_in += count_tokens(text)
            if role == "user" and not self.user_events and not text.lstrip().startswith(
                    _NOT_PROMPT):
                self._user(ts)
        elif t == "reasoning":
            self._model(ts)
            self.counted_out += count_tokens(_text(p.get("summary")) + _text(p.get("content")))
        elif t in CALL_ITEMS:
            self._call(n, ts, t, p)
        elif t in OUTPUT_ITEMS:
            self._input()
            self._output(n, ts, p)
        elif t in HOSTED_ITEMS:
            self._model(ts)
            self.stats.counts["hosted_calls"] += 1
        elif t in COMPACTION_ITEMS:
            self._input()
            self.cut = "compaction"
        else:
            self.stats.skipped[f"response_item:{t}"] += 1

    def _call(self, n: int, ts: float | None, t: str, p: dict[str, Any]) -> None:
        cid = p.get("call_id") or p.get("id")
        name = "local_shell" if t == "local_shell_call" else p.get("name")
        if not isinstance(cid, str) or not cid:
            raise InputError(f"{self.where(n, 'payload.call_id')} must be a string")
        if not isinstance(name, str) or not name:
            raise InputError(f"{self.where(n, 'payload.name')} must be a string")
        self._model(ts)
        call = Call(cid, name, ts)
        self.calls[cid] = call
        self.pending.append(call)
        self.stats.counts["tool_calls"] += 1
        body = p.get("arguments", p.get("input", p.get("action")))
        self.counted_out += count_tokens(body if isinstance(body, str) else _text(body))

    def _output(self, n: int, ts: float | None, p: dict[str, Any]) -> None:
        cid = p.get("call_id")
        call = self.calls.get(cid) if isinstance(cid, str) else None
        if call is None:
            self.stats.skipped["output_without_call"] += 1
            return
        raw = p.get("output")
        text = _text(raw)
        facts = self.facts.setdefault(call.call_id, {})
        if isinstance(raw, str) and raw.startswith("{"):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            if isinstance(meta, dict):  # the legacy shell / apply_patch output JSON
                facts["meta"] = seconds_field(meta.get("duration_seconds"), self.where(
                    n, "payload.output"), "metadata.duration_seconds")
                facts["exit"] = meta.get("exit_code")
                text = _text(obj.get("output"))
        header = text.split("\nOutput:", 1)[0] if "\nOutput:" in text else text[:400]
        if (m := _WALL_RE.search(header)) and float(m.group(1)) <= MAX_LOG_S:
            facts["wall"] = float(m.group(1))
        if m := _EXIT_RE.search(header):
            facts["exit"] = int(m.group(1))
        if text.strip().lower() in ("aborted", "aborted by user"):
            call.abandoned = True
        call.has_result, call.result_ts = True, ts
        self.counted_in += count_tokens(text)

    def _event(self, n: int, ts: float | None, p: dict[str, Any]) -> None:
        t = self._ptype(n, p)
        if t == "token_count":
            self._usage(n, ts, p)
        elif t == "user_message":
            self._input()
            self._user(ts)
        elif t in ("exec_command_end", "mcp_tool_call_end", "patch_apply_end"):
            self._tool_end(n, t, p)
        elif t == "turn_aborted":
            if self.open:
                self._close(None, ts)
            for call in self.calls.values():
                call.abandoned = call.abandoned or not call.has_result
        elif t == "context_compacted":
            self.cut = "compaction"
        else:
            self.stats.skipped[f"event_msg:{t}"] += 1

    def _tool_end(self, n: int, t: str, p: dict[str, Any]) -> None:
        cid = p.get("call_id")
        if not isinstance(cid, str) or cid not in self.calls:
            self.stats.skipped[f"event_msg:{t}"] += 1
            return
        facts = self.facts.setdefault(cid, {})
        where = self.where(n, "payload.duration")
        d = p.get("duration")
        if isinstance(d, dict):  # a Rust Duration: {secs, nanos}
            secs = seconds_field(d.get("secs", 0), where, "secs")
            nanos = seconds_field(d.get("nanos", 0), where, "nanos", 1e-9)
            facts["end"] = (secs or 0.0) + (nanos or 0.0)
        elif d is not None:
            facts["end"] = seconds_field(d, where, "duration")
        result = p.get("result")
        if t == "exec_command_end":
            facts.setdefault("exit", p.get("exit_code"))
        elif (t == "patch_apply_end" and p.get("success") is False) or (
                isinstance(result, dict) and ("Err" in result or result.get("isError") is True)):
            self.calls[cid].error = True

    def _usage(self, n: int, ts: float | None, p: dict[str, Any]) -> None:
        info = p.get("info")
        if info is None:
            self.stats.skipped["event_msg:token_count"] += 1
            return
        if not isinstance(info, dict):
            raise InputError(f"{self.where(n, 'payload.info')} must be an object")
        last = self._counts(n, info, "last_token_usage")
        total = self._counts(n, info, "total_token_usage")
        if (total is not None and total == self.last_total) or (
                total is None and last == self.last_usage and not self.open):
            self.stats.skipped["event_msg:token_count (repeated)"] += 1
            return
        if last is None:
            if total is None:
                self.stats.skipped["event_msg:token_count"] += 1
                return
            base = self.last_total or (0, 0, 0)
            last = (max(0, total[0] - base[0]), max(0, total[1] - base[1]),
                    max(0, total[2] - base[2]))
        self.last_total, self.last_usage = total, last
        self._close(last, ts)

    def _counts(self, n: int, info: dict[str, Any], key: str) -> tuple[int, int, int] | None:
        u = info.get(key)
        if u is None:
            return None
        where = self.where(n, f"payload.info.{key}")
        if not isinstance(u, dict):
            raise InputError(f"{where} must be an object")
        inp = count_field(u, "input_tokens", where) or 0
        return inp, min(count_field(u, "cached_input_tokens", where) or 0, inp), \
            count_field(u, "output_tokens", where) or 0

    def _input(self) -> None:
        """Input to the model seen: without token counts it ends the open response."""
        if self.open and not self.with_usage:
            self._close(None, None)

    def _user(self, ts: float | None) -> None:
        if self.open:  # a response cut short (no token count came): it ends here
            self._close(None, None)
        self.user, self.user_ts = True, ts
        self.stats.counts["user_turns"] += 1

    def _close(self, usage: tuple[int, int, int] | None, ts: float | None) -> None:
        """The response since the last one ended: with `usage` (input, cached, output) from
        its token count, else without (estimated from the text)."""
        r = Response(line=0, prompt=None if usage is None else usage[0],
                     output=max(self.counted_out, 1) if usage is None else usage[2],
                     cached=None if usage is None else usage[1], start_ts=self.first_item,
                     end_ts=ts if ts is not None else self.last_item,
                     counted_in=self.counted_in, counted_out=self.counted_out,
                     calls=self.pending, user_turn=self.user,
                     user_ts=self.user_ts if self.user else None, cut=self.cut)
        self.convo.responses.append(r)
        self.stats.counts["llm_calls"] += 1
        self.pending, self.open, self.first_item, self.last_item = [], False, None, None
        self.counted_in = self.counted_out = 0
        self.user, self.user_ts, self.cut = False, None, None

    def _finish(self) -> None:
        """Each call's exact duration from its facts, and its outcome."""
        for cid, call in self.calls.items():
            f = self.facts.get(cid, {})
            exact = next((f[k] for k in ("wall", "meta", "end") if f.get(k) is not None),
                         None)
            call.exact_s = exact if call.has_result else None
            code = f.get("exit")
            if isinstance(code, int) and not isinstance(code, bool) and code != 0:
                call.error = True
        count_calls(self.calls.values(), self.stats.counts)
