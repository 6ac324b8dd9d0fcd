"""The OpenAI Responses API (`POST /v1/responses`): a request's context as blocks, an answer (a
response object, or its event stream) read, and the responses a later request may continue.

A request's context is its `tools`, its `instructions` (system text) and its `input` items: a
message (role user, system, developer or assistant; content a string or `input_text` /
`output_text` parts) is hashed as the chat API's message of that role and content, a
`function_call` (and `custom_tool_call`, `local_shell_call`) as a tool call, a
`function_call_output` (and the others' outputs) as a tool result, so a conversation's blocks
are those its chat form would make. Reasoning items (encrypted or summarised) are counted and
left out, as thinking blocks are: their text is never hashed nor kept. An item of any other
type is hashed whole as one block and counted (`unknown_items`).

A request that names `previous_response_id` (or a `conversation`) holds only its new items: the
server prepends the named response's input and output. The recorder keeps the item blocks of
recent responses (`Chains`, bounded) and hashes such a request whole: the named context, then
its own items, so it continues its conversation as a client that resends everything would.

An answer's usage is its `usage` (`input_tokens`, `input_tokens_details.cached_tokens`,
`output_tokens`); its tool calls are its `function_call` output items. A stream ends with
`response.completed`, `response.incomplete` or `response.failed` (or an `error` event); one
without any is not whole (`complete` False). A failed response, or an error, has no message.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from harness.proxy.answers import (
    RESPONSES_TOKEN_EVENTS,
    Answer,
    Usage,
    as_dict,
    openai_usage,
    safe_code,
    sse_payloads,
    timings_usage,
)
from harness.proxy.hashing import (
    Block,
    Hasher,
    call_block,
    openai_message_blocks,
    other_block,
    result_block,
    system_blocks,
    tools_block,
)

# An input or output item that is a tool call: its type -> the field holding its arguments.
_CALL_ARGS = {"function_call": "arguments", "custom_tool_call": "input",
              "local_shell_call": "action"}
_RESULTS = frozenset({"function_call_output", "custom_tool_call_output",
                      "local_shell_call_output"})
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Stream events read for nothing (or only for their tokens): not counted as unknown.
_KNOWN_PREFIXES = (
    "response.created", "response.in_progress", "response.queued", "response.output_item.",
    "response.content_part.", "response.output_text.", "response.refusal.",
    "response.reasoning", "response.function_call_arguments.",
    "response.custom_tool_call_input.", "response.web_search_call.",
    "response.file_search_call.", "response.code_interpreter_call", "response.image_generation",
    "response.mcp_", "response.audio.", "response.output_audio")
MAX_CHAIN_BLOCKS = 1_000_000  # block references Chains holds at most (a few MiB)


@dataclass
class ItemCounts:
    """What a request's (or an answer's) items held besides what is hashed."""

    reasoning: int = 0
    unknown: int = 0


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def input_items(body: dict[str, Any]) -> list[Any]:
    """A request's `input` as items (a string is one user message)."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return raw if isinstance(raw, list) else []


def head_blocks(body: dict[str, Any], h: Hasher) -> list[Block]:
    """The blocks before a request's items: its tools, then its instructions."""
    tools = body.get("tools")
    head = [tools_block(h, tools)] if tools else []
    return head + system_blocks(h, body.get("instructions"))


def item_blocks(items: list[Any], h: Hasher, counts: ItemCounts) -> list[Block]:
    """The blocks of input (or output) items; reasoning items and unknown types counted."""
    out: list[Block] = []
    for item in items:
        d = as_dict(item)
        kind = d.get("type", "message" if "role" in d else None)
        if kind == "message" and "role" in d:
            out.extend(openai_message_blocks({"role": d.get("role"),
                                              "content": d.get("content")}, h))
        elif isinstance(kind, str) and kind in _CALL_ARGS:
            name = "local_shell" if kind == "local_shell_call" else d.get("name")
            out.append(call_block(h, d.get("call_id"), name, d.get(_CALL_ARGS[kind])))
        elif isinstance(kind, str) and kind in _RESULTS:
            out.append(result_block(h, d.get("call_id") or d.get("id"), d.get("output")))
        elif kind == "reasoning":
            counts.reasoning += 1
        else:
            counts.unknown += 1
            out.append(other_block(h, item))
    return out


def responses_usage(usage: Any) -> Usage | None:
    """A response's `usage`: input tokens (the cached ones among them), output tokens."""
    return openai_usage(usage, "input_tokens", "output_tokens", "input_tokens_details")


def _without_reasoning(items: list[Any]) -> list[Any]:
    """Output items as kept: a reasoning item's text (or encrypted content) left out."""
    return [{"type": "reasoning"} if as_dict(i).get("type") == "reasoning" else i for i in items]


def _read_response(ans: Answer, resp: dict[str, Any], output: list[Any]) -> None:
    """A response object (whole, or a stream's last) into `ans`, with its output items."""
    ans.model = _str(resp.get("model")) or ans.model
    ans.ident = _str(resp.get("id")) or ans.ident
    status = resp.get("status")
    err = resp.get("error")
    if status == "failed" or err:
        e = as_dict(err)
        ans.error_type = safe_code(e.get("code")) or safe_code(e.get("type")) or "failed"
        ans.finish = "failed"
        return
    reason = as_dict(resp.get("incomplete_details")).get("reason")
    ans.finish = safe_code(reason) if status == "incomplete" else safe_code(status)
    if status in ("queued", "in_progress"):  # a background response: no answer yet
        return
    ans.usage = responses_usage(resp.get("usage")) or timings_usage(resp.get("timings"))
    for item in map(as_dict, output):
        kind = item.get("type")
        if kind == "reasoning":
            ans.reasoning += 1
        elif isinstance(kind, str) and kind in _CALL_ARGS:
            name = "local_shell" if kind == "local_shell_call" else _str(item.get("name"))
            ans.tool_calls.append((_str(item.get("call_id")), name))
        elif kind != "message":
            ans.unknown_items += 1
    ans.message = _without_reasoning(output)


def parse_responses(body: bytes, sse: bool) -> Answer:
    """What a Responses API answer says (`body` a response object, or its stream when `sse`);
    never raises on odd input."""
    if sse:
        return _stream(body)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer()
    if not isinstance(obj, dict):
        return Answer()
    ans = Answer(complete=True, readable=obj.get("object") == "response" or any(
        k in obj for k in ("output", "error", "usage")))
    output = obj.get("output")
    _read_response(ans, obj, output if isinstance(output, list) else [])
    return ans


def _stream(body: bytes) -> Answer:
    ans = Answer()
    long_lines, bad = [0], [0]
    items: dict[int, dict[str, Any]] = {}
    texts: dict[int, list[str]] = {}
    args: dict[int, list[str]] = {}
    final: dict[str, Any] | None = None
    for obj in sse_payloads(body, long_lines, bad):
        if not isinstance(obj, dict):
            continue  # a `[DONE]` some servers add
        kind = obj.get("type")
        idx = obj.get("output_index")
        i = idx if isinstance(idx, int) else -1
        if kind == "error":
            ans.readable, ans.complete = True, True
            ans.error_type = safe_code(obj.get("code")) or safe_code(
                as_dict(obj.get("error")).get("code")) or "error"
            continue
        if not isinstance(kind, str) or not kind.startswith("response."):
            ans.unknown_events += 1
            continue
        ans.readable = True
        if kind in RESPONSES_TOKEN_EVENTS:
            ans.token_events += 1
        if kind in _TERMINAL:
            final, ans.complete = as_dict(obj.get("response")), True
        elif kind in ("response.created", "response.in_progress", "response.queued"):
            resp = as_dict(obj.get("response"))
            ans.model = _str(resp.get("model")) or ans.model
            ans.ident = _str(resp.get("id")) or ans.ident
        elif kind in ("response.output_item.added", "response.output_item.done"):
            items[i] = dict(as_dict(obj.get("item")))
            if kind.endswith(".done"):
                texts.pop(i, None)
                args.pop(i, None)
            elif _str(items[i].get("type")) in _CALL_ARGS:
                ans.token_events += 1
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            texts.setdefault(i, []).append(_str(obj.get("delta")))
        elif kind in ("response.function_call_arguments.delta",
                      "response.custom_tool_call_input.delta"):
            args.setdefault(i, []).append(_str(obj.get("delta")))
        elif kind == "response.function_call_arguments.done":
            args[i] = [_str(obj.get("arguments"))]
        elif not kind.startswith(_KNOWN_PREFIXES):
            ans.unknown_events += 1
    ans.long_lines, ans.bad_events = long_lines[0], bad[0]
    _unfinished_items(items, texts, args)
    output = [items[i] for i in sorted(items)]
    if final is not None:
        done = final.get("output")
        _read_response(ans, final, done if isinstance(done, list) and done else output)
    elif ans.error_type is None:  # no end: what came, read as far as it goes
        _read_response(ans, {}, output)
        ans.usage, ans.finish = None, None
    return ans


def _unfinished_items(items: dict[int, dict[str, Any]], texts: dict[int, list[str]],
                      args: dict[int, list[str]]) -> None:
    """Items whose `output_item.done` never came, made from their deltas."""
    for i, parts in texts.items():
        item = items.setdefault(i, {"type": "message", "role": "assistant"})
        item["content"] = [{"type": "output_text", "text": "".join(parts)}]
    for i, parts in args.items():
        item = items.setdefault(i, {"type": "function_call"})
        item[_CALL_ARGS.get(_str(item.get("type")), "arguments")] = "".join(parts)


def responses_text(message: Any) -> str:
    """The generated text of an answer's output items (to estimate its tokens)."""
    parts: list[str] = []
    for item in map(as_dict, message if isinstance(message, list) else []):
        content = item.get("content")
        if isinstance(content, list):
            parts += [_str(as_dict(c).get("text")) for c in content]
        parts.append(_str(item.get("arguments")) or _str(item.get("input")))
    return " ".join(p for p in parts if p)


def kept_request(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as --keep-text keeps it: reasoning items' content left out."""
    raw = body.get("input")
    if not isinstance(raw, list):
        return body
    return {**body, "input": _without_reasoning(raw)}


class Chains:
    """The item blocks (input, then output) of recent responses, by response id and by
    conversation id, held in memory only: a request naming one is hashed with them first.
    Bounded: past MAX_CHAIN_BLOCKS block references, the oldest entries are dropped (a request
    that names one of them is hashed as it comes, and counted)."""

    def __init__(self, max_blocks: int = MAX_CHAIN_BLOCKS) -> None:
        self._held: OrderedDict[str, tuple[Block, ...]] = OrderedDict()
        self._size = 0
        self._max = max_blocks

    @staticmethod
    def _keys(body: dict[str, Any]) -> tuple[str | None, str | None]:
        prev = body.get("previous_response_id")
        conv = body.get("conversation")
        conv = as_dict(conv).get("id") if isinstance(conv, dict) else conv
        return (f"response\0{prev}" if isinstance(prev, str) and prev else None,
                f"conversation\0{conv}" if isinstance(conv, str) and conv else None)

    def prior(self, body: dict[str, Any]) -> tuple[tuple[Block, ...], str | None]:
        """The blocks the request continues, and whether they were found: None when it names
        no response nor conversation; "known"; "unknown" (a response the recording does not
        hold: its request is hashed as it comes); "new" (a conversation not seen before)."""
        prev, conv = self._keys(body)
        key = prev or conv
        if key is None:
            return (), None
        held = self._held.get(key)
        if held is None:
            # a conversation's first request: nothing before it is not a break
            return (), "unknown" if prev is not None else "new"
        self._held.move_to_end(key)
        return held, "known"

    def remember(self, body: dict[str, Any], response_id: str | None,
                 items: tuple[Block, ...]) -> None:
        """What a response's items were (its request's, with the named ones, and its
        output): under its id, and its conversation's when the request named one."""
        _, conv = self._keys(body)
        for key in (f"response\0{response_id}" if response_id else None, conv):
            if key is None:
                continue
            old = self._held.pop(key, None)
            self._size -= len(old) if old is not None else 0
            self._held[key] = items
            self._size += len(items)
        while self._size > self._max and len(self._held) > 1:
            _, dropped = self._held.popitem(last=False)
            self._size -= len(dropped)
