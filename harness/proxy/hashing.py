"""Salted hashes of the blocks of a request's context: what a replay needs of the text, no more.

A request's context (its tools, system prompt and messages) is cut into blocks: one per tools
list, system text and message content part (a text, a tool call, a tool result, an image). Each
is written canonically, leaving out what does not reach the model or moves between requests
(`cache_control` marks, thinking blocks, reasoning text) and re-serialising JSON arguments with
sorted keys, then hashed with BLAKE2b keyed by a salt drawn at random when the recording starts
and held in memory only. Requests that share a prefix share its blocks' hashes, so
continuations, cuts (compactions) and shared system prompts show in the recording; the text does
not, and without the salt no guess at a short text can be checked against its hash.

A block also carries its length in tokens by the importers' stated rule (TOKEN_RULE), an
estimate the importer scales to the server's own count. A /v1/completions prompt (one string)
is cut into chunks that end at a line break once they are CHUNK_MIN characters long (at most
CHUNK_MAX), so every chunk of a prompt but its last is a chunk of any text that extends it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from harness.userfiles import count_tokens

SALT_BYTES = 32
DIGEST_BYTES = 8  # 64-bit hashes: collisions among a recording's blocks are negligible
CHUNK_MIN = 256
CHUNK_MAX = 1024
TOKEN_IDS_PER_CHUNK = 64
# Block kinds: the part of the context a block is.
TOOLS, SYSTEM, USER, ASSISTANT = "tools", "system", "user", "assistant"
CALL, RESULT, TEXT, OTHER = "call", "result", "text", "other"
KINDS = (TOOLS, SYSTEM, USER, ASSISTANT, CALL, RESULT, TEXT, OTHER)
# Fields of a content part that never reach the model, or move from request to request.
_VOLATILE = frozenset({"cache_control", "citations", "signature"})
_MEMO_MAX = 200_000


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a context: its salted hash, its tokens (an estimate), what it is; a tool
    call or result also has its call id (hashed: `ref`), a call the tool's name, a result
    whether the client marked it an error."""

    hash: str
    tokens: int
    kind: str
    ref: str | None = None
    name: str | None = None
    error: bool = False

    def to_json(self) -> list[Any]:
        """The block as the recording stores it: [hash, tokens, kind, (ref, name | error)]."""
        if self.kind == CALL:
            return [self.hash, self.tokens, self.kind, self.ref or "", self.name or ""]
        if self.kind == RESULT:
            return [self.hash, self.tokens, self.kind, self.ref or "", int(self.error)]
        return [self.hash, self.tokens, self.kind]


class Hasher:
    """Hashes keyed by a random salt that never leaves this object (nor the process)."""

    __slots__ = ("_key", "_tokens")

    def __init__(self, salt: bytes | None = None) -> None:
        self._key = secrets.token_bytes(SALT_BYTES) if salt is None else salt
        self._tokens: dict[str, int] = {}  # hash -> tokens: a context's old blocks repeat

    def __repr__(self) -> str:
        return "Hasher(salt=<not shown>)"

    def digest(self, data: bytes) -> str:
        return hashlib.blake2b(data, key=self._key, digest_size=DIGEST_BYTES).hexdigest()

    def ident(self, value: str) -> str:
        """A tool call id, hashed (the recording matches calls to results by it)."""
        return self.digest(b"id\0" + value.encode("utf-8", "replace"))

    def block(self, kind: str, payload: Any, text: str, ref: str | None = None,
              name: str | None = None, error: bool = False) -> Block:
        """The block of `payload` (canonical JSON), with `text`'s tokens."""
        h = self.digest(_canonical([kind, payload]))
        n = self._tokens.get(h)
        if n is None:
            if len(self._tokens) >= _MEMO_MAX:
                self._tokens.clear()
            n = self._tokens[h] = count_tokens(text) if text else 0
        return Block(h, n, kind, None if ref is None else self.ident(ref), name, error)


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # e.g. a lone surrogate in a string, or an integer beyond 64 bits
        return repr(value).encode("utf-8", "replace")


def _clean(value: Any) -> Any:
    """`value` without the volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _json_text(value: Any) -> str:
    return _canonical(value).decode("utf-8", "replace")


def _arguments(args: Any) -> tuple[Any, str]:
    """A tool call's arguments canonically (a JSON string parsed, so spacing and key order do
    not matter), and as text for counting."""
    if isinstance(args, str):
        try:
            parsed = orjson.loads(args)
        except orjson.JSONDecodeError:
            return args, args
        return parsed, _json_text(parsed)
    return _clean(args), _json_text(args)


def _flat_text(content: Any) -> str:
    """The text of a content value (a string, or parts with `text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_flat_text(p.get("text", p.get("content", ""))) if isinstance(p, dict)
                         else _flat_text(p) for p in content)
    return ""


def _parts(content: Any) -> Iterator[tuple[Any, str]]:
    """(payload, text) of each content part that reaches the model; empty texts left out."""
    if content is None:
        return
    if isinstance(content, str):
        if s := content.strip():
            yield ["text", s], s
        return
    if not isinstance(content, list):
        yield _clean(content), ""
        return
    for p in content:
        if isinstance(p, str):
            if s := p.strip():
                yield ["text", s], s
        elif isinstance(p, dict):
            kind = p.get("type")
            if kind in ("text", "input_text", "output_text"):
                text = p.get("text")
                if isinstance(text, str) and (s := text.strip()):
                    yield ["text", s], s
            elif kind in ("thinking", "redacted_thinking", "reasoning"):
                continue
            else:
                yield _clean(p), ""
        else:
            yield p, ""


# ---------------------------------------------------------------- OpenAI chat


def openai_chat_blocks(body: dict[str, Any], h: Hasher) -> list[Block]:
    """The blocks of a /v1/chat/completions request: tools, then each message's parts."""
    blocks: list[Block] = []
    tools = body.get("tools") or body.get("functions")
    if tools:
        blocks.append(h.block(TOOLS, _clean(tools), _json_text(tools)))
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        blocks.extend(openai_message_blocks(msg, h))
    return blocks


def openai_message_blocks(msg: Any, h: Hasher) -> list[Block]:
    """One chat message's blocks (an assistant answer is hashed by this too, so a client that
    sends it back makes the same blocks)."""
    if not isinstance(msg, dict):
        return [h.block(OTHER, _clean(msg), _json_text(msg))]
    role = msg.get("role")
    content = msg.get("content")
    if role in ("tool", "function"):
        ref = msg.get("tool_call_id") or msg.get("name") or ""
        ref = ref if isinstance(ref, str) else _json_text(ref)
        return [h.block(RESULT, [ref, _clean(content)], _flat_text(content), ref=ref)]
    kind = {"system": SYSTEM, "developer": SYSTEM, "user": USER,
            "assistant": ASSISTANT}.get(role if isinstance(role, str) else "", OTHER)
    blocks = [h.block(kind, [role, payload], text) for payload, text in _parts(content)]
    if kind == ASSISTANT:
        calls = msg.get("tool_calls")
        for tc in calls if isinstance(calls, list) else []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            blocks.append(_call(h, tc.get("id") if isinstance(tc, dict) else "",
                                fn.get("name"), fn.get("arguments")))
        legacy = msg.get("function_call")
        if isinstance(legacy, dict):
            blocks.append(_call(h, "", legacy.get("name"), legacy.get("arguments")))
    return blocks or [h.block(kind, [role, None], "")]


def _call(h: Hasher, call_id: Any, name: Any, args: Any) -> Block:
    cid = call_id if isinstance(call_id, str) else ""
    tool = name if isinstance(name, str) else ""
    canon, text = _arguments(args)
    return h.block(CALL, [cid, tool, canon], f"{tool} {text}", ref=cid, name=tool)


def call_block(h: Hasher, call_id: Any, name: Any, args: Any) -> Block:
    """A tool call's block (as a chat message's tool call makes it)."""
    return _call(h, call_id, name, args)


def result_block(h: Hasher, ref: Any, content: Any) -> Block:
    """A tool result's block (as a chat `tool` message makes it)."""
    r = ref if isinstance(ref, str) else ""
    return h.block(RESULT, [r, _clean(content)], _flat_text(content), ref=r)


def tools_block(h: Hasher, tools: Any) -> Block:
    """A tools list's block."""
    return h.block(TOOLS, _clean(tools), _json_text(tools))


def system_blocks(h: Hasher, content: Any) -> list[Block]:
    """The blocks of system text (a string or text parts) given outside the messages."""
    return [h.block(SYSTEM, ["system", payload], text) for payload, text in _parts(content)]


def other_block(h: Hasher, value: Any) -> Block:
    """The block of something of no known kind (hashed whole, volatile fields aside)."""
    return h.block(OTHER, _clean(value), _json_text(value))


# ---------------------------------------------------------------- Anthropic messages


def anthropic_blocks(body: dict[str, Any], h: Hasher) -> list[Block]:
    """The blocks of a /v1/messages request: tools, system, then each message's parts."""
    blocks: list[Block] = []
    tools = body.get("tools")
    if tools:
        blocks.append(h.block(TOOLS, _clean(tools), _json_text(_clean(tools))))
    system = body.get("system")
    blocks.extend(h.block(SYSTEM, ["system", payload], text) for payload, text in _parts(system))
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        blocks.extend(anthropic_message_blocks(msg, h))
    return blocks


def anthropic_message_blocks(msg: Any, h: Hasher) -> list[Block]:
    """One Messages API message's blocks (an answer's content too). A `system` message among
    them (some clients send one there) is hashed as the request's `system` text is, so moving
    the same text between the two gives the same blocks."""
    if not isinstance(msg, dict):
        return [h.block(OTHER, _clean(msg), _json_text(msg))]
    role = msg.get("role")
    if role == "system":
        return system_blocks(h, msg.get("content")) or [h.block(SYSTEM, ["system", None], "")]
    kind = {"user": USER, "assistant": ASSISTANT}.get(role if isinstance(role, str) else "",
                                                      OTHER)
    content = msg.get("content")
    blocks: list[Block] = []
    for part in content if isinstance(content, list) else [content]:
        t = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and t in ("tool_use", "server_tool_use"):
            blocks.append(_call(h, part.get("id"), part.get("name"), part.get("input")))
        elif isinstance(part, dict) and t == "tool_result":
            ref = part.get("tool_use_id")
            ref = ref if isinstance(ref, str) else ""
            inner = _clean(part.get("content"))
            blocks.append(h.block(RESULT, [ref, inner, bool(part.get("is_error"))],
                                  _flat_text(inner), ref=ref, error=bool(part.get("is_error"))))
        else:
            blocks.extend(h.block(kind, [role, payload], text) for payload, text
                          in _parts([part] if not isinstance(part, str) else part))
    return blocks or [h.block(kind, [role, None], "")]


# ---------------------------------------------------------------- completions


def text_chunks(text: str) -> list[str]:
    """`text` cut at line breaks into chunks of CHUNK_MIN to CHUNK_MAX characters (the last
    shorter): a chunk's end depends only on what precedes it, so a prompt's chunks but its last
    are the chunks of any text that extends it."""
    chunks: list[str] = []
    start, n = 0, len(text)
    while start < n:
        nl = text.find("\n", start + CHUNK_MIN, start + CHUNK_MAX)
        end = min(n, start + CHUNK_MAX) if nl < 0 else nl
        chunks.append(text[start:end])
        start = end
    return chunks


def completion_blocks(prompt: Any, h: Hasher) -> list[Block]:
    """The blocks of a /v1/completions prompt: text chunks, or chunks of token ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch: its first prompt stands for the context
    if isinstance(prompt, str):
        return [h.block(TEXT, c, c) for c in text_chunks(prompt)]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        out = []
        for i in range(0, len(prompt), TOKEN_IDS_PER_CHUNK):
            ids = prompt[i:i + TOKEN_IDS_PER_CHUNK]
            b = h.block(TEXT, ids, "")
            out.append(Block(b.hash, len(ids), TEXT))
        return out
    return []
