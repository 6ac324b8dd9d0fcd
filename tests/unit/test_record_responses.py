"""The OpenAI Responses API through the recording proxy: a tool-using conversation (streamed or
not, resent whole or chained by previous_response_id) recorded as chat calls are, imported into
the same LLM and tool steps with the fake's usage; no text without --keep-text; malformed
streams recorded and counted, never a traceback."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from harness.proxy.answers import OPENAI_RESPONSES, FirstToken, api_of
from harness.proxy.hashing import Hasher, other_block
from harness.proxy.responses import Chains
from harness.proxy.store import EVENTS, META, TEXT, read_recording
from harness.traces.importers import import_trace
from harness.traces.validate import check_frame
from tests.unit.test_record_responses_fake import (
    RESPONSES,
    SECRET_REASONING,
    RAgent,
    RReply,
    responses_recording,
    stream_events,
)

SECRETS = ("SECRET-USER-words", "SECRET-TOOL-output", "SECRET-ARG", "SECRET-ANSWER",
           "SECRET-INSTRUCTIONS", SECRET_REASONING)


def calls(folder: Path) -> list[dict[str, Any]]:
    return [e for _, e in read_recording(folder).events if e["ev"] == "call"]


def counts(folder: Path) -> dict[str, int]:
    return dict(json.loads((folder / META).read_text())["counts"])


async def _session(tmp_path: Path, stream: bool, chain: bool, path: str = RESPONSES,
                   **kw: Any) -> float:
    """User asks, the model calls a tool (0.1 s), answers, the user thanks it. Returns the
    client's own gap from the first answer to the request with the tool's result."""
    async with responses_recording(tmp_path, **kw) as (fake, proxy, http):
        fake.replies.extend([
            RReply(tools=[("call_1", "bash", {"cmd": "SECRET-ARG"})], input_tokens=120,
                   output=15),
            RReply(text="SECRET-ANSWER done", input_tokens=160, cached=100, output=5),
            RReply(text="you are welcome", reasoning=False, input_tokens=190, cached=150,
                   output=3),
        ])
        a = RAgent(http, proxy.url, stream=stream, chain=chain, path=path,
                   instructions="SECRET-INSTRUCTIONS be careful")
        a.user("SECRET-USER-words list the files")
        await a.call()
        t0 = asyncio.get_running_loop().time()
        await asyncio.sleep(0.1)
        a.results({"call_1": "SECRET-TOOL-output a.txt"})
        gap = asyncio.get_running_loop().time() - t0
        await a.call()
        a.user("thanks")
        await a.call()
        if chain:  # the server got only the new items
            assert [len(r["input"]) for r in fake.requests] == [1, 1, 1]
            assert [r.get("previous_response_id") for r in fake.requests] == [
                None, "resp_1", "resp_2"]
    return gap


@pytest.mark.parametrize(("stream", "chain"), [(True, False), (False, False), (True, True),
                                               (False, True)],
                         ids=["streamed", "whole", "streamed-chained", "whole-chained"])
async def test_a_tool_using_conversation_is_recorded_and_imported(
        tmp_path: Path, stream: bool, chain: bool) -> None:
    gap = await _session(tmp_path, stream, chain)
    rec = tmp_path / "rec"
    first, second, third = calls(rec)
    assert {c["api"] for c in (first, second, third)} == {OPENAI_RESPONSES}
    assert [c["outcome"] for c in (first, second, third)] == ["ok"] * 3
    assert [(c["usage"]["prompt"], c["usage"]["cached"], c["usage"]["output"],
             c["usage"]["source"]) for c in (first, second, third)] == [
        (120, 0, 15, "usage"), (160, 100, 5, "usage"), (190, 150, 3, "usage")]
    assert [c["conv"] for c in (first, second, third)] == ["c1"] * 3
    assert [c["how"] for c in (first, second, third)] == ["new", "extends", "extends"]
    assert [c.get("chain") for c in (first, second, third)] == (
        [None, "known", "known"] if chain else [None] * 3)
    (tc,) = first["tool_calls"]
    assert tc[1] == "bash" and tc[0] != "call_1"  # the id hashed
    (res,) = second["results"]
    assert res[:2] == tc and res[3] == first["id"] and gap - 0.05 <= res[2] <= gap + 0.05
    assert (second["user_turn"], third["user_turn"]) == (False, True)
    assert [c.get("reasoning_items", 0) for c in (first, second, third)] == (
        [1, 1, 0] if chain else [1, 2, 2])  # the answer's, and those resent
    if stream:
        assert all(c["first_token"] is not None for c in (first, second, third))
    n = counts(rec)
    assert (n["calls"], n["ok"], n["conversations"], n["tool_results"], n["user_turns"]) == (
        3, 3, 1, 1, 1)
    assert n.get("other_requests", 0) == 0

    imp = import_trace("recording", rec, {})
    assert check_frame(imp.steps, "imported") == []
    llm = imp.steps[imp.steps["kind"] == "llm"]
    assert list(llm["output_tokens"]) == [15, 5, 3]
    tools = imp.steps[imp.steps["kind"] == "tool"]
    assert list(tools["tool_name"]) == ["bash", "user"]
    assert list(tools["tool_class"]) == ["sandbox", "human"]
    assert abs(float(tools["latency_s"].iloc[0]) - res[2]) < 1e-6
    totals = imp.provenance.extra["totals"]
    assert (totals["llm_steps"], totals["tool_calls"], totals["exact_latency"],
            totals["prompt_tokens"], totals["cached_tokens"], totals["output_tokens"],
            totals["human_pauses"], totals["cut"]) == (3, 1, 1, 470, 250, 23, 1, 0)


async def test_the_path_without_v1_is_recorded(tmp_path: Path) -> None:
    await _session(tmp_path, True, False, path="/responses")
    assert [c["path"] for c in calls(tmp_path / "rec")] == ["/responses"] * 3


@pytest.mark.parametrize("keep_text", [False, True], ids=["hashes", "keep-text"])
async def test_no_text_is_recorded_without_keep_text(tmp_path: Path, keep_text: bool) -> None:
    await _session(tmp_path, True, False, keep_text=keep_text)
    rec = tmp_path / "rec"
    written = b"".join(p.read_bytes() for p in (rec / EVENTS, rec / META))
    assert not any(s.encode() in written for s in SECRETS)
    assert stat.S_IMODE(rec.stat().st_mode) == 0o700
    for f in rec.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert (rec / TEXT).exists() == keep_text
    if keep_text:  # the conversation's text, never the reasoning's
        text = (rec / TEXT).read_bytes()
        assert all(s.encode() in text for s in SECRETS[:-1])
        assert SECRET_REASONING.encode() not in text


BAD = [  # mode, stream, outcome, error, replayed, the count it shows in
    ("bad-json", True, "ok", None, True, "bad_events"),
    ("unknown-event", True, "ok", None, True, "unknown_events"),
    ("unknown-item", True, "ok", None, True, "unknown_items"),
    ("unknown-item", False, "ok", None, True, "unknown_items"),
    ("no-end", True, "cut", "no_end_event", False, "cut"),
    ("failed", True, "ok", "server_error", False, None),
    ("failed", False, "ok", "server_error", False, None),
    ("error", True, "ok", "rate_limit_exceeded", False, None),
    ("no-shape", True, "unreadable", "unparsable_answer", False, "unreadable"),
    ("no-shape", False, "unreadable", "unparsable_answer", False, "unreadable"),
]


@pytest.mark.parametrize(("mode", "stream", "outcome", "error", "replayed", "counted"), BAD,
                         ids=[f"{b[0]}-{'stream' if b[1] else 'whole'}" for b in BAD])
async def test_a_malformed_answer_is_recorded_and_counted(
        tmp_path: Path, mode: str, stream: bool, outcome: str, error: str | None,
        replayed: bool, counted: str | None) -> None:
    async with responses_recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([RReply(text="first", input_tokens=50, output=4),
                             RReply(text="second", input_tokens=80, output=6, mode=mode)])
        a = RAgent(http, proxy.url, stream=stream)
        a.user("one")
        await a.call()
        a.user("two")
        async with http.post(proxy.url + RESPONSES, json=a.body()) as resp:
            assert resp.status == 200
            await resp.read()  # relayed as the upstream sent it
    rec = tmp_path / "rec"
    good, bad = calls(rec)
    assert good["outcome"] == "ok"
    assert (bad["outcome"], bad["error"]) == (outcome, error)
    n = counts(rec)
    if counted is not None:
        assert n[counted] == 1
    assert n.get("analysis_errors", 0) == 0
    if replayed:
        assert bad["usage"] == {"prompt": 80, "output": 6, "cached": 0, "source": "usage"}
    else:
        assert bad["usage"] is None and bad["tool_calls"] == [] and bad["answer"] == []
    imp = import_trace("recording", rec, {})
    llm = imp.steps[imp.steps["kind"] == "llm"]
    assert list(llm["output_tokens"]) == ([4, 6] if replayed else [4])


async def test_unknown_input_items_and_an_unknown_previous_response_are_counted(
        tmp_path: Path) -> None:
    async with responses_recording(tmp_path) as (_, proxy, http):
        for body in ({"input": [{"type": "item_reference", "id": "msg_x"},
                                {"role": "user", "content": [{"type": "input_text",
                                                              "text": "hi"}]},
                                {"type": 7}, "odd"]},
                     {"previous_response_id": "resp_not_recorded", "input": "go on"},
                     {"input": {"not": "a list"}, "conversation": {"id": "conv_1"}}):
            async with http.post(proxy.url + RESPONSES, json={"model": "fake", **body}) as r:
                assert r.status == 200
                await r.read()
    first, second, third = calls(tmp_path / "rec")
    assert first["unknown_items"] == 3 and first["outcome"] == "ok"
    assert (second["chain"], second["outcome"]) == ("unknown", "ok")
    assert (third["chain"], third["outcome"]) == ("new", "ok")
    n = counts(tmp_path / "rec")
    assert (n["unknown_items"], n["chain_unknown"], n["chain_new"]) == (3, 1, 1)


def test_the_responses_paths_and_first_token() -> None:
    assert api_of("POST", "/v1/responses") == OPENAI_RESPONSES
    assert api_of("POST", "/responses/") == OPENAI_RESPONSES
    for path in ("/v1/responses/resp_1", "/v1/responses/compact", "/v1/responses/x/cancel"):
        assert api_of("POST", path) is None
    assert api_of("GET", "/v1/responses") is None
    events = stream_events(RReply(text="hello there"), "resp_1")
    find = FirstToken(OPENAI_RESPONSES)
    hits = [i for i, e in enumerate(events) if find.feed(e)]
    # created, in_progress, reasoning added, reasoning done, message added, then the text
    assert hits[0] == 5
    calls_only = stream_events(RReply(reasoning=False, tools=[("c", "bash", {})]), "r")
    assert FirstToken(OPENAI_RESPONSES).feed(calls_only[2])  # a tool call's start
    odd = FirstToken(OPENAI_RESPONSES)
    assert not odd.feed(b'data: {"type": ["x"], "item": {"type": ["y"]}}\n\n')


def test_the_responses_held_for_chains_are_bounded() -> None:
    h = Hasher(b"k" * 32)
    chains = Chains(max_blocks=10)
    blocks = tuple(other_block(h, i) for i in range(4))
    for i in range(5):
        chains.remember({"conversation": {"id": "conv"}} if i == 4 else {}, f"r{i}", blocks)
    assert chains.prior({"previous_response_id": "r2"}) == ((), "unknown")  # dropped
    assert chains.prior({"previous_response_id": "r4"}) == (blocks, "known")
    assert chains.prior({"conversation": "conv"}) == (blocks, "known")
    assert chains.prior({"conversation": "other"}) == ((), "new")
    assert chains.prior({"previous_response_id": 7}) == ((), None)
    huge = tuple(other_block(h, i) for i in range(30))
    chains.remember({}, "big", huge)  # past the bound alone: the newest stays
    assert chains.prior({"previous_response_id": "big"}) == (huge, "known")
    assert chains.prior({"previous_response_id": "r4"}) == ((), "unknown")


async def test_a_client_that_closes_after_the_end_event_is_recorded_whole(
        tmp_path: Path) -> None:
    # Codex closes a stream once response.completed arrived, while the upstream still holds it
    # open: the call came whole, so it is `ok` (and counted), not `aborted`.
    async with responses_recording(tmp_path) as (fake, proxy, http):
        fake.linger_s = 0.5
        fake.replies.append(RReply(text="done", input_tokens=120, output=9))
        async with http.post(proxy.url + RESPONSES, json={
                "model": "fake", "stream": True, "input": [
                    {"type": "message", "role": "user", "content": "hi"}]}) as resp:
            seen = b""
            async for chunk in resp.content.iter_any():
                seen += chunk
                if b"response.completed" in seen and seen.endswith(b"\n\n"):
                    break  # leave with the connection still open upstream
            resp.close()
        await asyncio.sleep(0.8)
    (call,) = calls(tmp_path / "rec")
    assert call["outcome"] == "ok" and call["usage"]["prompt"] == 120
    assert counts(tmp_path / "rec")["closed_after_end"] == 1
