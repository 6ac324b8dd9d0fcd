"""What an upstream answer says: the assistant message (as a client sends it back), the tool
calls, usage and errors, from a JSON body or a server-sent-event stream of the OpenAI chat and
completions APIs or the Anthropic Messages API (the Responses API's: harness.proxy.responses);
and the moment a stream's first token arrives.

Usage comes from the answer's own `usage` (OpenAI: prompt_tokens, completion_tokens,
prompt_tokens_details.cached_tokens; Anthropic: input_tokens + cache_creation_input_tokens +
cache_read_input_tokens is the prompt, cache_read_input_tokens the cached part), else from
llama.cpp's `timings` (prompt_n + cache_n, predicted_n, cache_n); the request is never changed to
ask for it. Without either, the caller estimates it (Usage.source "estimate").

An answer is `readable` when at least one JSON object of the API's own shape was found in it
(OpenAI: one with `choices`, `usage`, `error` or `timings`; Anthropic: a message, an error or a
stream event other than a ping): a body of other bytes is no answer, whatever its status.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from harness.userfiles import is_count

OPENAI_CHAT = "openai-chat"
OPENAI_COMPLETIONS = "openai-completions"
ANTHROPIC = "anthropic-messages"
OPENAI_RESPONSES = "openai-responses"  # read by harness.proxy.responses
APIS = (OPENAI_CHAT, OPENAI_COMPLETIONS, ANTHROPIC, OPENAI_RESPONSES)
_DONE = object()
# An API's error type or code is kept only when it looks like one (never free text).
_SAFE_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# The keys that make a JSON object an OpenAI answer or stream event (see `readable`).
_OPENAI_KEYS = ("choices", "usage", "error", "timings")
# A stream's line longer than this is skipped (and counted), unread: what is searched for a
# line's end stays linear in the stream's size, and what is held of one line is bounded.
MAX_SSE_LINE = 4 * 1024 * 1024
# Responses API stream events that carry generated tokens (a tool call's start counts too).
RESPONSES_TOKEN_EVENTS = frozenset({
    "response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta"})
_RESPONSES_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_ANTHROPIC_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta",
                               "content_block_stop", "message_delta", "message_stop", "error"})


@dataclass
class Usage:
    """Token counts of one call; `source` says where they come from."""

    prompt: int
    output: int
    cached: int | None
    source: str  # "usage" | "timings" | "estimate"


@dataclass
class Answer:
    """One answer: `message` is the assistant message a client sends back (chat, messages) or
    the generated text (completions); `tool_calls` are (call id, tool name)."""

    message: Any = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    usage: Usage | None = None
    finish: str | None = None
    model: str | None = None
    error_type: str | None = None
    token_events: int = 0  # stream events that carried generated tokens
    long_lines: int = 0  # stream lines over MAX_SSE_LINE, skipped
    complete: bool = False  # the stream's end was seen (or a whole JSON body)
    readable: bool = False  # an object of the API's shape was found (see the module's doc)
    # The Responses API's: the response's id (held in memory, never written), stream events
    # that were not JSON, stream events and output items of a type not known, reasoning items.
    ident: str | None = None
    bad_events: int = 0
    unknown_events: int = 0
    unknown_items: int = 0
    reasoning: int = 0


def api_of(method: str, path: str) -> str | None:
    """The API a request speaks, by its path; None for one that is only passed through."""
    if method != "POST":
        return None
    p = path.rstrip("/")
    if p.endswith("/chat/completions"):
        return OPENAI_CHAT
    if p.endswith("/completions"):
        return OPENAI_COMPLETIONS
    if p.endswith("/messages"):
        return ANTHROPIC
    if p.endswith("/responses"):
        return OPENAI_RESPONSES
    return None


def safe_code(value: Any) -> str | None:
    return value if isinstance(value, str) and _SAFE_CODE.fullmatch(value) else None


def sse_payloads(body: bytes, long_lines: list[int] | None = None,
                 bad: list[int] | None = None) -> Iterator[Any]:
    """The parsed `data:` payload of each event of a server-sent-event body (`[DONE]` as a
    marker); a payload that is not JSON is skipped (counted in `bad[0]` when given), and so is
    a line over MAX_SSE_LINE (counted in `long_lines[0]` when given)."""
    data: list[bytes] = []
    for line in [*body.splitlines(), b""]:
        if len(line) > MAX_SSE_LINE:
            if long_lines is not None:
                long_lines[0] += 1
            continue
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
            continue
        if line or not data:
            continue
        payload, data = b"\n".join(data), []
        if payload.strip() == b"[DONE]":
            yield _DONE
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            if bad is not None:
                bad[0] += 1
            continue
        yield obj


def as_dict(v: Any) -> dict[str, Any]:
    """`v` if it is a JSON object, else an empty one."""
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _error_type(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if isinstance(err, dict):
        return safe_code(err.get("type")) or safe_code(err.get("code")) or "error"
    return "error" if err is not None else None


def openai_usage(usage: Any, prompt: str = "prompt_tokens", output: str = "completion_tokens",
                 details: str = "prompt_tokens_details") -> Usage | None:
    """An OpenAI `usage` (chat completions' keys by default; the Responses API names them
    input_tokens, output_tokens and input_tokens_details): prompt tokens (the cached ones
    among them), output tokens."""
    u = as_dict(usage)
    p: Any = u.get(prompt)
    o: Any = u.get(output)
    if not (is_count(p) and is_count(o)):
        return None
    cached: Any = as_dict(u.get(details)).get("cached_tokens")
    return Usage(p, o, cached if is_count(cached) else None, "usage")


def anthropic_usage(usage: dict[str, Any]) -> Usage | None:
    base: Any = usage.get("input_tokens")
    o: Any = usage.get("output_tokens")
    if not (is_count(base) and is_count(o)):
        return None
    extra: list[Any] = [usage.get(k) for k in ("cache_creation_input_tokens",
                                               "cache_read_input_tokens")]
    read = extra[1] if is_count(extra[1]) else None
    return Usage(base + sum(x for x in extra if is_count(x)), o, read, "usage")


def timings_usage(timings: Any) -> Usage | None:
    """llama.cpp's `timings`: prompt_n (processed) + cache_n (reused) is the prompt."""
    t = as_dict(timings)
    p: Any = t.get("prompt_n")
    c: Any = t.get("cache_n", 0)
    o: Any = t.get("predicted_n")
    if not (is_count(p) and is_count(c) and is_count(o)):
        return None
    return Usage(p + c, o, c, "timings")


def parse_answer(api: str, body: bytes, sse: bool) -> Answer:
    """What `body` (a whole JSON answer, or a stream when `sse`) says; never raises on odd
    input (what cannot be read is left unset)."""
    if sse:
        long_lines = [0]
        events = list(sse_payloads(body, long_lines))
        ans = {OPENAI_CHAT: _chat_stream, OPENAI_COMPLETIONS: _completion_stream,
               ANTHROPIC: _anthropic_stream}[api](events)
        ans.long_lines = long_lines[0]
        return ans
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer()
    if not isinstance(obj, dict):
        return Answer()
    if api == ANTHROPIC:
        return _anthropic_whole(obj)
    ans = Answer(model=_str(obj.get("model")) or None, error_type=_error_type(obj),
                 complete=True, readable=any(k in obj for k in _OPENAI_KEYS))
    choice = as_dict(_list(obj.get("choices"))[0]) if _list(obj.get("choices")) else {}
    ans.finish = _str(choice.get("finish_reason")) or None
    if api == OPENAI_CHAT:
        msg = as_dict(choice.get("message"))
        ans.message = msg or None
        ans.tool_calls = [(_str(tc.get("id")), _str(as_dict(tc.get("function")).get("name")))
                          for tc in map(as_dict, _list(msg.get("tool_calls")))]
    else:
        ans.message = _str(choice.get("text"))
    ans.usage = openai_usage(obj.get("usage")) or timings_usage(obj.get("timings"))
    return ans


def _first_choices(events: list[Any], ans: Answer, raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The first choice of each OpenAI stream event (chat or completions), reading the
    envelope on the way: the end marker and error into `ans`, the last usage and llama.cpp
    timings into `raw`."""
    for obj in events:
        if obj is _DONE:
            ans.complete = True
            continue
        if not isinstance(obj, dict):
            continue
        ans.readable = ans.readable or any(k in obj for k in _OPENAI_KEYS)
        ans.error_type = _error_type(obj) or ans.error_type
        ans.model = _str(obj.get("model")) or ans.model
        raw["usage"] = obj.get("usage") or raw.get("usage")
        raw["timings"] = obj.get("timings") or raw.get("timings")
        for ch in map(as_dict, _list(obj.get("choices"))):
            if ch.get("index", 0) == 0:
                yield ch


def _chat_stream(events: list[Any]) -> Answer:
    ans = Answer()
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    raw: dict[str, Any] = {}
    for ch in _first_choices(events, ans, raw):
        d = as_dict(ch.get("delta"))
        if c := _str(d.get("content")):
            text.append(c)
            ans.token_events += 1
        elif _str(d.get("reasoning_content")) or _str(d.get("refusal")):
            ans.token_events += 1
        for tc in map(as_dict, _list(d.get("tool_calls"))):
            idx = tc.get("index", 0)
            slot = calls.setdefault(idx if isinstance(idx, int) else 0,
                                    {"id": "", "name": "", "arguments": ""})
            slot["id"] = _str(tc.get("id")) or slot["id"]
            fn = as_dict(tc.get("function"))
            slot["name"] += _str(fn.get("name"))
            slot["arguments"] += _str(fn.get("arguments"))
            ans.token_events += 1
        ans.finish = _str(ch.get("finish_reason")) or ans.finish
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for _, c in sorted(calls.items())]
    ans.message = msg
    ans.tool_calls = [(c["id"], c["name"]) for _, c in sorted(calls.items())]
    ans.usage = openai_usage(raw.get("usage")) or timings_usage(raw.get("timings"))
    ans.complete = ans.complete or ans.finish is not None
    return ans


def _completion_stream(events: list[Any]) -> Answer:
    ans = Answer()
    text: list[str] = []
    raw: dict[str, Any] = {}
    for ch in _first_choices(events, ans, raw):
        if t := _str(ch.get("text")):
            text.append(t)
            ans.token_events += 1
        ans.finish = _str(ch.get("finish_reason")) or ans.finish
    ans.message = "".join(text)
    ans.usage = openai_usage(raw.get("usage")) or timings_usage(raw.get("timings"))
    ans.complete = ans.complete or ans.finish is not None
    return ans


def _anthropic_whole(obj: dict[str, Any]) -> Answer:
    ans = Answer(model=_str(obj.get("model")) or None, complete=True,
                 readable=obj.get("type") in ("message", "error") or "content" in obj)
    if obj.get("type") == "error":
        ans.error_type = _error_type(obj)
        return ans
    content = _list(obj.get("content"))
    ans.message = {"role": "assistant", "content": content}
    ans.tool_calls = _anthropic_calls(content)
    ans.finish = _str(obj.get("stop_reason")) or None
    ans.usage = anthropic_usage(as_dict(obj.get("usage"))) or timings_usage(obj.get("timings"))
    return ans


def _anthropic_calls(content: list[Any]) -> list[tuple[str, str]]:
    return [(_str(b.get("id")), _str(b.get("name"))) for b in map(as_dict, content)
            if b.get("type") in ("tool_use", "server_tool_use")]


def _anthropic_stream(events: list[Any]) -> Answer:
    ans = Answer()
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    usage: dict[str, Any] = {}
    timings: Any = None
    for obj in map(as_dict, events):
        kind = obj.get("type")
        ans.readable = ans.readable or (isinstance(kind, str) and kind in _ANTHROPIC_EVENTS)
        idx = obj.get("index")
        i = idx if isinstance(idx, int) else -1
        if kind == "message_start":
            msg = as_dict(obj.get("message"))
            ans.model = _str(msg.get("model")) or ans.model
            usage.update(as_dict(msg.get("usage")))
        elif kind == "content_block_start":
            blocks[i] = dict(as_dict(obj.get("content_block")))
            if blocks[i].get("type") in ("tool_use", "server_tool_use"):
                partial[i] = []
                ans.token_events += 1
        elif kind == "content_block_delta":
            d = as_dict(obj.get("delta"))
            block = blocks.setdefault(i, {"type": "text", "text": ""})
            if d.get("type") == "text_delta":
                block["text"] = _str(block.get("text")) + _str(d.get("text"))
            elif d.get("type") == "input_json_delta":
                partial.setdefault(i, []).append(_str(d.get("partial_json")))
            ans.token_events += 1
        elif kind == "content_block_stop" and i in partial:
            blocks[i]["input"] = _json_or_empty("".join(partial.pop(i)))
        elif kind == "message_delta":
            ans.finish = _str(as_dict(obj.get("delta")).get("stop_reason")) or ans.finish
            usage.update({k: v for k, v in as_dict(obj.get("usage")).items() if v is not None})
            timings = obj.get("timings") or timings
        elif kind == "message_stop":
            ans.complete = True
        elif kind == "error":
            ans.error_type = _error_type(obj)
    for i, parts in partial.items():  # a stream cut before the block's end
        if i in blocks:
            blocks[i]["input"] = _json_or_empty("".join(parts))
    content = [blocks[i] for i in sorted(blocks)]
    ans.message = {"role": "assistant", "content": content}
    ans.tool_calls = _anthropic_calls(content)
    ans.usage = anthropic_usage(usage) or timings_usage(timings)
    return ans


def _json_or_empty(text: str) -> Any:
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return text


def answer_text(api: str, message: Any) -> str:
    """The generated text of an answer (to estimate its tokens where usage is missing)."""
    if api == OPENAI_COMPLETIONS:
        return _str(message)
    msg = as_dict(message)
    content = msg.get("content")
    parts = [content] if isinstance(content, str) else [
        _str(b.get("text")) or _json_text(b.get("input")) for b in map(as_dict, _list(content))]
    parts += [_str(as_dict(tc.get("function")).get("arguments"))
              for tc in map(as_dict, _list(msg.get("tool_calls")))]
    return " ".join(p for p in parts if p)


def _json_text(v: Any) -> str:
    if v is None:
        return ""
    try:
        return orjson.dumps(v).decode()
    except TypeError:
        return ""


class FirstToken:
    """Finds the first event of a stream that carries generated tokens, chunk by chunk, as the
    proxy relays them: text, reasoning or a tool call's name or arguments (a role-only first
    chunk, a ping or message_start does not count). Each chunk is searched once (the start of
    a line is kept in pieces, not joined again with every chunk), and a line over MAX_SSE_LINE
    is dropped as it grows and skipped to its end (counted in `long_lines`)."""

    __slots__ = ("_api", "_parts", "_size", "_skipping", "long_lines")

    def __init__(self, api: str) -> None:
        self._api = api
        self._parts: list[bytes] = []  # the line begun so far
        self._size = 0
        self._skipping = False  # within a line over the bound
        self.long_lines = 0

    @property
    def held(self) -> int:
        """Bytes of an unfinished line held (at most MAX_SSE_LINE)."""
        return self._size

    def feed(self, chunk: bytes) -> bool:
        """True when `chunk` completes an event with a token."""
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            start = end + 1
            if self._skipping:
                self._skipping = False
                continue
            if self._size + len(piece) > MAX_SSE_LINE:
                self.long_lines += 1
            else:
                line = b"".join((*self._parts, piece)) if self._parts else piece
                if self._has_token(line):
                    self._parts, self._size = [], 0
                    return True
            self._parts, self._size = [], 0
        rest = chunk[start:]
        if rest and not self._skipping:
            self._size += len(rest)
            if self._size > MAX_SSE_LINE:
                self.long_lines += 1
                self._parts, self._size, self._skipping = [], 0, True
            else:
                self._parts.append(rest)
        return False

    def _has_token(self, line: bytes) -> bool:
        if not line.startswith(b"data:"):
            return False
        try:
            obj = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return False
        return isinstance(obj, dict) and _has_token(self._api, obj)


def _has_token(api: str, obj: dict[str, Any]) -> bool:
    if api == OPENAI_RESPONSES:
        event = _str(obj.get("type"))
        return event in RESPONSES_TOKEN_EVENTS or (
            event == "response.output_item.added"
            and _str(as_dict(obj.get("item")).get("type")) in _RESPONSES_CALLS)
    if api == ANTHROPIC:
        kind = obj.get("type")
        return kind == "content_block_delta" or (
            kind == "content_block_start"
            and as_dict(obj.get("content_block")).get("type") in ("tool_use", "server_tool_use"))
    for ch in map(as_dict, _list(obj.get("choices"))):
        if api == OPENAI_COMPLETIONS:
            if _str(ch.get("text")):
                return True
            continue
        d = as_dict(ch.get("delta"))
        if (_str(d.get("content")) or _str(d.get("reasoning_content")) or d.get("tool_calls")
                or _str(d.get("refusal"))):
            return True
    return False
