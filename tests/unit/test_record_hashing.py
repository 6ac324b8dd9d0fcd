"""Block hashes, the first-token finder and the joining of calls into conversations, on their
own: what moves between requests without reaching the model does not change a block, a salt
makes its own hashes, completions chunks survive an extension, and each joining rule holds."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.proxy.answers import ANTHROPIC, OPENAI_CHAT, FirstToken, parse_answer
from harness.proxy.conversations import CallView, Joiner
from harness.proxy.hashing import (
    CALL,
    RESULT,
    Hasher,
    anthropic_blocks,
    anthropic_message_blocks,
    openai_chat_blocks,
    openai_message_blocks,
    text_chunks,
)

H = Hasher(b"k" * 32)


def hashes(blocks: list[Any]) -> list[str]:
    return [b.hash for b in blocks]


def test_cache_control_and_thinking_do_not_change_blocks() -> None:
    def body(mark_last: bool) -> dict[str, Any]:
        text = {"type": "text", "text": "first question"}
        if mark_last:
            text = {**text, "cache_control": {"type": "ephemeral"}}
        return {"system": [{"type": "text", "text": "sys", "cache_control": {"type": "x"}}],
                "tools": [{"name": "bash", "input_schema": {}}],
                "messages": [{"role": "user", "content": [text]},
                             {"role": "assistant", "content": [
                                 {"type": "thinking", "thinking": "hmm", "signature": "s"},
                                 {"type": "tool_use", "id": "t1", "name": "bash",
                                  "input": {"b": 1, "a": 2}}]}]}
    a, b = anthropic_blocks(body(True), H), anthropic_blocks(body(False), H)
    assert hashes(a) == hashes(b)
    assert [x.kind for x in a] == ["tools", "system", "user", CALL]
    assert a[3].name == "bash" and a[3].ref == H.ident("t1")


def test_an_anthropic_system_message_hashes_as_the_system_text() -> None:
    # the same system text given as the request's `system` or as a system message among the
    # messages (as some clients send it) makes the same blocks, of kind system
    user = {"role": "user", "content": "hi"}
    top = anthropic_blocks({"system": "be brief", "messages": [user]}, H)
    inside = anthropic_blocks({"messages": [{"role": "system", "content": "be brief"}, user]}, H)
    parts = anthropic_blocks({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]}, user]}, H)
    assert hashes(top) == hashes(inside) == hashes(parts)
    assert [b.kind for b in inside] == ["system", "user"]
    empty = anthropic_message_blocks({"role": "system", "content": []}, H)
    assert [b.kind for b in empty] == ["system"]


def test_an_answer_hashes_as_the_client_sends_it_back() -> None:
    streamed = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b":1,"a":2}'}}]}
    resent = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 2, "b": 1}'}}]}
    assert hashes(openai_message_blocks(streamed, H)) == hashes(openai_message_blocks(resent, H))
    answer = {"role": "assistant", "content": [{"type": "text", "text": "ok "},
                                               {"type": "tool_use", "id": "t", "name": "n",
                                                "input": {}}]}
    back = {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                             {"type": "tool_use", "id": "t", "name": "n",
                                              "input": {}, "cache_control": {"type": "e"}}]}
    assert hashes(anthropic_message_blocks(answer, H)) == hashes(
        anthropic_message_blocks(back, H))


def test_each_recording_has_its_own_salt() -> None:
    msg = {"messages": [{"role": "user", "content": "same text"}]}
    one, two = Hasher(), Hasher()
    assert hashes(openai_chat_blocks(msg, one)) == hashes(openai_chat_blocks(msg, one))
    assert hashes(openai_chat_blocks(msg, one)) != hashes(openai_chat_blocks(msg, two))
    assert "salt" in repr(one) and "same" not in repr(one)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab \n", max_size=3000), st.text(alphabet="ab \n", max_size=600))
def test_completion_chunks_survive_an_extension(text: str, more: str) -> None:
    a, b = text_chunks(text), text_chunks(text + more)
    assert "".join(a) == text and "".join(b) == text + more
    assert b[:max(0, len(a) - 1)] == a[:-1]
    assert all(len(c) <= 1024 for c in b)


def test_first_token_skips_a_role_only_chunk_and_joins_split_lines() -> None:
    find = FirstToken(OPENAI_CHAT)
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    assert not find.feed(role)
    assert not find.feed(token[:20])
    assert find.feed(token[20:])
    anthropic = FirstToken(ANTHROPIC)
    assert not anthropic.feed(b'event: ping\ndata: {"type":"ping"}\n\n')
    assert anthropic.feed(b'data: {"type":"content_block_delta","index":0,"delta":'
                          b'{"type":"text_delta","text":"x"}}\n\n')


def test_anthropic_usage_adds_the_cache_to_the_prompt() -> None:
    body = json.dumps({"content": [], "usage": {"input_tokens": 3,
                                                "cache_creation_input_tokens": 10,
                                                "cache_read_input_tokens": 90,
                                                "output_tokens": 4}}).encode()
    u = parse_answer(ANTHROPIC, body, False).usage
    assert u is not None and (u.prompt, u.output, u.cached) == (103, 4, 90)


# ---------------------------------------------------------------- joining


def chat(*messages: dict[str, Any], system: str = "sys") -> list[Any]:
    return openai_chat_blocks({"messages": [{"role": "system", "content": system},
                                            *messages]}, H)


def view(cid: int, arrival: float, end: float, blocks: list[Any],
         answer: dict[str, Any] | None, session: str | None = None) -> CallView:
    ans = openai_message_blocks(answer, H) if answer else []
    calls = tuple((b.ref or "", b.name or "") for b in ans if b.kind == CALL)
    return CallView(cid, arrival, end, session, tuple(blocks),
                    tuple(b.hash for b in [*blocks, *ans]), calls, True)


TOOL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "function": {"name": "Task", "arguments": "{}"}}]}
TEXT = {"role": "assistant", "content": "done"}
USER = {"role": "user", "content": "go"}


def test_extension_subagent_results_and_user_turn() -> None:
    j = Joiner()
    first = j.join(view(1, 0.0, 1.0, chat(USER), TOOL))
    assert (first.conv, first.how) == ("c1", "new")
    sub = j.join(view(2, 1.5, 2.0, chat(USER, system="sub"), TEXT))
    assert (sub.conv, sub.how, sub.parent) == ("c2", "subagent", ("c1", 1))
    back = chat(USER, TOOL, {"role": "tool", "tool_call_id": "c1", "content": "r"})
    cont = j.join(view(3, 3.0, 4.0, back, TEXT))
    assert (cont.conv, cont.how, cont.prev, cont.shared) == ("c1", "extends", 1, 3)
    assert [(r.name, r.wall_s, r.call) for r in cont.results] == [("Task", 2.0, 1)]
    assert not cont.user_turn
    turn = j.join(view(4, 5.0, 6.0, [*back, *chat(TEXT, USER)[1:]], TEXT))
    assert (turn.conv, turn.how, turn.user_turn) == ("c1", "extends", True)
    # nobody waits now: an unrelated request is a new root, not a sub-agent
    other = j.join(view(5, 7.0, 8.0, chat(USER, system="other"), TEXT))
    assert (other.conv, other.how, other.parent) == ("c3", "new", None)
    assert (j.conversations, j.subagents, j.user_turns, j.tool_results) == (3, 1, 1, 1)


def test_a_subagent_is_joined_as_of_its_arrival() -> None:
    """The parent went on before the sub-agent's call ended: still the parent's child."""
    j = Joiner()
    j.join(view(1, 0.0, 1.0, chat(USER), TOOL))
    back = chat(USER, TOOL, {"role": "tool", "tool_call_id": "c1", "content": "r"})
    j.join(view(3, 3.0, 4.0, back, TEXT))  # ended before call 2, which arrived at 2.0
    sub = j.join(view(2, 2.0, 5.0, chat(USER, system="sub"), TEXT))
    assert (sub.how, sub.parent) == ("subagent", ("c1", 1))


def test_sessions_keep_agents_apart_and_join_a_compaction() -> None:
    j = Joiner()
    j.join(view(1, 0.0, 1.0, chat(USER), TOOL, session="a"))
    other = j.join(view(2, 1.5, 2.0, chat(USER, system="b"), TEXT, session="b"))
    assert (other.how, other.parent) == ("new", None)  # its own session: not a sub-agent
    j.join(view(3, 3.0, 4.0, chat(USER, TOOL, {"role": "tool", "tool_call_id": "c1",
                                              "content": "r"}), TEXT, session="a"))
    compact = j.join(view(4, 5.0, 6.0, chat({"role": "user", "content": "summary"}), TEXT,
                          session="a"))
    assert (compact.conv, compact.how, compact.prev, compact.shared) == ("c1", "cut", 3, 1)


def test_rewritten_older_messages_still_continue_the_conversation() -> None:
    j = Joiner()
    first = chat(USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"})
    j.join(view(1, 0.0, 1.0, first, TOOL))
    rewritten = chat(USER, {"role": "assistant", "content": "x (cleared)"},
                     {"role": "user", "content": "y"}, TOOL,
                     {"role": "tool", "tool_call_id": "c1", "content": "r"})
    cont = j.join(view(2, 2.0, 3.0, rewritten, TEXT))
    assert (cont.conv, cont.how, cont.shared) == ("c1", "cut", 2)
    assert [r.call for r in cont.results] == [1]
    assert next(b for b in rewritten if b.kind == RESULT).ref == H.ident("c1")
