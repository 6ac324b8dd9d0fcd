"""What the proxy hands over about each call, and the one thread that turns it into events.

The proxy's event loop only stamps times and keeps the bytes; parsing the request and the
answer, hashing the blocks, joining the call to its conversation and writing its lines happen on
one recorder thread, in the order calls end (so a continuation is joined after the call it
continues), off the path the bytes take.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness.proxy.answers import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_RESPONSES,
    Answer,
    Usage,
    answer_text,
    parse_answer,
)
from harness.proxy.conversations import CallView, Joiner, lcp
from harness.proxy.hashing import (
    Block,
    Hasher,
    anthropic_blocks,
    anthropic_message_blocks,
    completion_blocks,
    openai_chat_blocks,
    openai_message_blocks,
)
from harness.proxy.responses import (
    Chains,
    ItemCounts,
    head_blocks,
    input_items,
    item_blocks,
    kept_request,
    parse_responses,
    responses_text,
)
from harness.proxy.store import RecordingWriter
from harness.userfiles import count_tokens

# Call outcomes: the answer came whole; the upstream answered with a status other than 2xx
# (an error, a redirect: never followed); it could not be reached or gave no answer (the client
# got a 502); its stream broke off; the client went away; the proxy was stopped while the call
# ran; it answered 2xx with nothing the API's answer could be read from (no body, bytes of no
# JSON of the API's shape, a body its Content-Encoding does not decode, a body that is not a
# stream and is longer than the proxy keeps: kept.KEEP_HEAD). Only `ok` is replayed.
OUTCOMES = ("ok", "http_error", "unreachable", "cut", "aborted", "stopped", "unreadable")


@dataclass
class CallMeta:
    """One recorded call as the proxy sees it (times in s since the recording began)."""

    id: int
    api: str
    path: str
    arrival: float
    session: str | None
    end: float = 0.0
    first_token: float | None = None
    status: int | None = None
    outcome: str = "ok"
    error: str | None = None
    sse: bool = False
    encoding: str | None = None
    dropped: int = 0  # bytes of the answer past what the proxy keeps (harness.proxy.kept)
    agent: str | None = None  # the value of its agent header (a sub-agent's id)


def _r(t: float | None) -> float | None:
    return None if t is None else round(t, 6)


class Recorder:
    """Owns the recording: its writer, the hasher (and its salt), the joiner and the counts.
    The proxy calls `arrived`, `ended` and `passed` from its loop; each returns at once."""

    def __init__(self, folder: Path, meta: dict[str, Any], keep_text: bool) -> None:
        self.t0 = time.monotonic()
        self.keep_text = keep_text
        self._hasher = Hasher()
        self._joiner = Joiner()
        self._chains = Chains()  # the Responses API's responses a request may name
        self._writer = RecordingWriter(folder, meta, keep_text)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="harness-record")
        self.counts: Counter[str] = Counter()
        self._warned = False
        # The first write that failed (a full disk): nothing more is written after it, so the
        # events file ends with what came before (its last line at most cut short).
        self.write_error: OSError | None = None
        self.unwritten = 0  # events (and texts) not written since

    def now(self) -> float:
        return time.monotonic() - self.t0

    def arrived(self, m: CallMeta) -> None:
        self._pool.submit(self._write, {
            "ev": "request", "id": m.id, "api": m.api, "path": m.path, "t": _r(m.arrival)})

    def passed(self, method: str, path: str, status: int | None, arrival: float,
               end: float) -> None:
        """A request passed through without being recorded as a call."""
        self._pool.submit(self._write, {
            "ev": "other", "method": method, "path": path, "status": status,
            "t": _r(arrival), "end": _r(end)})
        self.counts["other_requests"] += 1

    def ended(self, m: CallMeta, request: bytes, response: bytes | None) -> None:
        self.counts["calls"] += 1  # its outcome is counted once its answer is read
        self._pool.submit(self._record, m, request, response)

    def close(self) -> dict[str, Any]:
        """Finish the pending work, close the files; the counts written into recording.json.
        An OSError naming the file when a write failed during the recording or now."""
        self._pool.shutdown(wait=True)
        summary = {"stopped_unix": round(time.time(), 6), "duration_s": _r(self.now()),
                   "counts": self.summary()}
        if self.write_error is not None:  # recording.json says the events file is short
            summary["unrecorded_events"] = self.unwritten
        try:
            self._writer.close(summary)
        except OSError as exc:
            self.write_error = self.write_error or exc
        err = self.write_error
        if err is not None:
            lost = f"; {self.unwritten} events not recorded" if self.unwritten else ""
            raise OSError(err.errno, f"{err.strerror or err}{lost}", err.filename)
        return summary

    def summary(self) -> dict[str, int]:
        j = self._joiner
        return {**{k: int(v) for k, v in sorted(self.counts.items())},
                "conversations": j.conversations, "subagents": j.subagents,
                "user_turns": j.user_turns, "tool_results": j.tool_results}

    # ---------------------------------------------------------------- the recorder thread

    def _record(self, m: CallMeta, request: bytes, response: bytes | None) -> None:
        try:
            event = self._call_event(m, request, response)
        except Exception as exc:  # a recording never stops for one call it cannot read
            event = {**self._base(m), "analysis_error": type(exc).__name__}
            self.counts["analysis_errors"] += 1
            if not self._warned:
                self._warned = True
                print(f"warning: call {m.id} could not be analysed ({type(exc).__name__}); "
                      "it is recorded without its context", file=sys.stderr, flush=True)
        self.counts[m.outcome] += 1
        self._write(event)

    def _write(self, obj: dict[str, Any], text: bool = False) -> None:
        """Write one event (or text) line; the first failure is said in one line on stderr,
        and from then on nothing is written (the proxy goes on relaying calls)."""
        if self.write_error is not None:
            self.unwritten += 1
            return
        try:
            (self._writer.text if text else self._writer.event)(obj)
        except OSError as exc:
            self.write_error = exc
            self.unwritten += 1
            print(f"warning: cannot write {exc.filename}: {exc.strerror or exc}; calls are "
                  "still relayed, but no longer recorded", file=sys.stderr, flush=True)

    def _base(self, m: CallMeta) -> dict[str, Any]:
        return {"ev": "call", "id": m.id, "api": m.api, "path": m.path, "stream": m.sse,
                "arrival": _r(m.arrival), "first_token": _r(m.first_token),
                "end": _r(m.end), "status": m.status, "outcome": m.outcome, "error": m.error}

    def _call_event(self, m: CallMeta, request: bytes, response: bytes | None
                    ) -> dict[str, Any]:
        h = self._hasher
        answer, unreadable = _read_answer(m, response)
        if (m.outcome == "aborted" and m.sse and answer.complete and unreadable is None
                and not m.dropped):
            # The client went away after the stream's end event had reached it (clients close
            # a finished stream at once, before the upstream's own end): the answer came whole.
            m.outcome = "ok"
            self.counts["closed_after_end"] += 1
        if m.outcome == "ok" and unreadable is not None:
            m.outcome, m.error = "unreadable", unreadable
        elif m.outcome == "ok" and m.api == OPENAI_RESPONSES and m.sse and not answer.complete:
            # no response.completed, .incomplete, .failed nor error: the stream was cut short
            m.outcome, m.error = "cut", "no_end_event"
        event = self._base(m)
        body = _json_object(request)
        # a local server names its model by its file's path: the file's name is enough
        model = answer.model.rsplit("/", 1)[-1] if answer.model and answer.model.startswith(
            "/") else answer.model
        event.update(model=model and model[:200], finish=answer.finish)
        if m.error is None and answer.error_type is not None:
            event["error"] = answer.error_type
        if m.dropped:  # a stream kept in part: its message is not whole, its end is read
            event["answer_dropped"] = m.dropped
        if answer.long_lines:  # skipped unread (answers.MAX_SSE_LINE)
            event["long_lines"] = answer.long_lines
            self.counts["long_lines"] += answer.long_lines
        if body is None:
            event["unparsed"] = True
            self.counts["unparsed"] += 1
            return event
        if m.api == OPENAI_RESPONSES:
            blocks, head = self._responses_blocks(body, answer, event)
        else:
            blocks, head = _request_blocks(m.api, body, h), 0
        ok = m.outcome == "ok" and answer.message is not None
        # a stream kept in part: its message is not whole, so its blocks are not hashed
        answer_from, answer_blocks = _answer_blocks(m.api, body, blocks, answer, h) \
            if ok and not m.dropped else (len(blocks), [])
        if m.api == OPENAI_RESPONSES and ok and not m.dropped:
            self._chains.remember(body, answer.ident, tuple(blocks[head:] + answer_blocks))
        usage = answer.usage or (_estimate(m.api, blocks, answer) if ok else None)
        if usage is not None and usage.source == "estimate":
            self.counts["usage_estimated"] += 1
        calls = tuple((h.ident(cid), name) for cid, name in answer.tool_calls) if ok else ()
        session = None if m.session is None else h.ident("session\0" + m.session)
        agent = None if m.agent is None else h.ident("agent\0" + m.agent)
        context = tuple(b.hash for b in blocks[:answer_from]) + tuple(
            b.hash for b in answer_blocks)
        joined = self._joiner.join(CallView(
            m.id, m.arrival, m.end, session, tuple(blocks), context, calls, ok,
            1 if m.api == OPENAI_COMPLETIONS else 0, agent))
        event.update(
            usage=None if usage is None else {"prompt": usage.prompt, "output": usage.output,
                                              "cached": usage.cached, "source": usage.source},
            session=session, agent=agent, conv=joined.conv, how=joined.how, prev=joined.prev,
            shared=joined.shared, parent=None if joined.parent is None else list(joined.parent),
            link=joined.link, parent_tool=joined.parent_tool,
            blocks=[b.to_json() for b in blocks[joined.shared:]],
            answer_from=answer_from, answer=[b.to_json() for b in answer_blocks],
            tool_calls=[list(c) for c in calls],
            results=[[r.ref, r.name, round(r.wall_s, 6), r.call, int(r.error), int(r.client)]
                     for r in joined.results],
            user_turn=joined.user_turn)
        if self.keep_text:
            kept = kept_request(body) if m.api == OPENAI_RESPONSES else body
            self._write({"id": m.id, "request": kept, "answer": answer.message,
                         **({} if m.agent is None else {"agent": m.agent})}, text=True)
        return event

    def _responses_blocks(self, body: dict[str, Any], answer: Answer,
                          event: dict[str, Any]) -> tuple[list[Block], int]:
        """A Responses API request's blocks (the response or conversation it names first)
        and how many of them lead its items (tools, instructions); what its items and its
        answer held besides, into `event` and the counts."""
        counts = ItemCounts()
        head = head_blocks(body, self._hasher)
        prior, chain = self._chains.prior(body)
        blocks = head + list(prior) + item_blocks(input_items(body), self._hasher, counts)
        if chain is not None:
            event["chain"] = chain
            self.counts[f"chain_{chain}"] += 1
        extra = {"reasoning_items": counts.reasoning + answer.reasoning,
                 "unknown_items": counts.unknown + answer.unknown_items,
                 "unknown_events": answer.unknown_events,
                 "bad_events": answer.bad_events}
        for key, n in extra.items():
            if n:
                event[key] = n
                self.counts[key] += n
        return blocks, len(head)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _read_answer(m: CallMeta, response: bytes | None) -> tuple[Answer, str | None]:
    """The answer, and why none could be read from it (None when one could)."""
    if not response:
        return Answer(), "empty_answer"
    if m.dropped and (m.encoding or not m.sse):
        return Answer(), "answer_too_large"  # a whole body (or compressed) cut: not readable
    if m.encoding:
        try:  # gzip or zlib (47: either, by its header), else raw deflate
            response = zlib.decompress(response, 47 if m.encoding != "deflate" else 15)
        except zlib.error:
            try:
                response = zlib.decompress(response, -15)
            except zlib.error:
                return Answer(), "undecodable_body"
    answer = parse_responses(response, m.sse) if m.api == OPENAI_RESPONSES else parse_answer(
        m.api, response, m.sse)
    return answer, None if answer.readable else "unparsable_answer"


def _request_blocks(api: str, body: dict[str, Any], h: Hasher) -> list[Block]:
    if api == OPENAI_CHAT:
        return openai_chat_blocks(body, h)
    if api == ANTHROPIC:
        return anthropic_blocks(body, h)
    return completion_blocks(body.get("prompt"), h)


def _answer_blocks(api: str, body: dict[str, Any], blocks: list[Block], answer: Answer,
                   h: Hasher) -> tuple[int, list[Block]]:
    """Where the context after the call leaves the request's blocks, and its blocks from
    there: the answer's (chat, messages), or a completions prompt + text cut again."""
    if api == OPENAI_CHAT:
        return len(blocks), openai_message_blocks(answer.message, h)
    if api == ANTHROPIC:
        return len(blocks), anthropic_message_blocks(answer.message, h)
    if api == OPENAI_RESPONSES:
        items = answer.message if isinstance(answer.message, list) else []
        return len(blocks), item_blocks(items, h, ItemCounts())
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return len(blocks), []
    ctx = completion_blocks(prompt + str(answer.message or ""), h)
    keep = lcp(tuple(b.hash for b in blocks), tuple(b.hash for b in ctx))
    return keep, ctx[keep:]


def _estimate(api: str, blocks: list[Block], answer: Answer) -> Usage:
    """Usage where the answer has none: the blocks' tokens, and the larger of the stream's
    token-bearing events and the answer's tokens by the rule."""
    text = responses_text(answer.message) if api == OPENAI_RESPONSES else answer_text(
        api, answer.message)
    out = max(answer.token_events, count_tokens(text))
    return Usage(sum(b.tokens for b in blocks), out, None, "estimate")
