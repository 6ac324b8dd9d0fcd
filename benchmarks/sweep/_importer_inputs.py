"""Small valid inputs of every import format, and the ways the importer cases spoil them.

Each format has one sample: a document (a JSON value, or the values of a JSON Lines file) of
the shape the real traces have, written under the case's folder as `in/<name>` (a recording:
the folder `in/rec`, its `events.jsonl` the file spoiled). A spoiler takes the sample's
document and returns it changed; `encode` turns a document into the file's bytes.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.core import ROOT

RECORDING = ROOT / "tests" / "data" / "importer-inputs" / "recording" / "parent-subagent"
SHIPPED = ROOT / "traces" / "bench-small.parquet"

Doc = Any
Edit = Callable[[Doc], Doc]


def at(s: float, day: str = "2026-01-02") -> str:
    """An ISO time `s` seconds after 10:00 UTC on `day`."""
    m, sec = divmod(s, 60)
    return f"{day}T10:{int(m):02d}:{sec:06.3f}Z"


def _codex() -> Doc:
    def line(s: float, kind: str, **payload: Any) -> dict[str, Any]:
        return {"timestamp": at(s), "type": kind, "payload": payload}

    def usage(s: float, inp: int, out: int, cached: int, total: list[int]) -> dict[str, Any]:
        last = {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out,
                "reasoning_output_tokens": 0, "total_tokens": inp + out}
        return line(s, "event_msg", type="token_count", rate_limits=None, info={
            "last_token_usage": last, "model_context_window": 100000, "total_token_usage": {
                "input_tokens": total[0], "cached_input_tokens": total[1],
                "output_tokens": total[2]}})

    return [
        line(0, "session_meta", id="sess-1", timestamp=at(0), cwd="/w",
             originator="codex_cli_rs", cli_version="0.99.0"),
        line(1, "response_item", type="message", role="user",
             content=[{"type": "input_text", "text": "do it"}]),
        line(1, "event_msg", type="user_message", message="do it"),
        line(3, "response_item", type="function_call", name="exec_command",
             arguments='{"cmd":"ls"}', call_id="c1"),
        usage(3.5, 1000, 50, 0, [1000, 0, 50]),
        line(5, "response_item", type="function_call_output", call_id="c1",
             output="Process exited with code 0\nOutput:\na b c"),
        line(11, "response_item", type="message", role="assistant",
             content=[{"type": "output_text", "text": "done"}]),
        usage(11.5, 1300, 40, 1000, [2300, 1000, 90]),
    ]


def _claude_code() -> Doc:
    lines: list[dict[str, Any]] = []

    def add(kind: str, s: float, **kw: Any) -> None:
        lines.append({"parentUuid": lines[-1]["uuid"] if lines else None, "isSidechain": False,
                      "userType": "external", "cwd": "/w", "sessionId": "s-1",
                      "version": "2.0.50", "type": kind, "uuid": f"m-{len(lines) + 1}",
                      "timestamp": at(s, "2025-10-01"), **kw})

    def say(s: float, mid: str, block: dict[str, Any], inp: int, read: int, out: int) -> None:
        add("assistant", s, requestId=f"req-{mid}", message={
            "id": mid, "type": "message", "role": "assistant", "model": "claude-x",
            "content": [block], "usage": {"input_tokens": inp, "cache_read_input_tokens": read,
                                          "cache_creation_input_tokens": 0,
                                          "output_tokens": out}})

    add("user", 1, message={"role": "user", "content": "fix the bug"})
    say(4, "r1", {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
        3, 1000, 40)
    add("user", 6, message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
        toolUseResult={"durationMs": 1200})
    say(10, "r2", {"type": "text", "text": "fixed"}, 4, 1100, 7)
    return lines


def _atif() -> Doc:
    return {"schema_version": "ATIF-v1.5", "session_id": "s1",
            "agent": {"name": "terminus-2", "version": "2.0.0"}, "steps": [
                {"step_id": 1, "source": "user", "message": "Go.",
                 "timestamp": "2025-01-01T00:00:01.000Z"},
                {"step_id": 2, "source": "agent", "message": "thinking",
                 "tool_calls": [{"tool_call_id": "c0", "function_name": "bash",
                                 "arguments": {"a": 0}}],
                 "observation": {"results": [{"source_call_id": "c0", "content": "ok"}]},
                 "metrics": {"prompt_tokens": 100, "completion_tokens": 10},
                 "timestamp": "2025-01-01T00:00:02.000Z"},
                {"step_id": 3, "source": "agent", "message": "done",
                 "metrics": {"prompt_tokens": 150, "completion_tokens": 5},
                 "timestamp": "2025-01-01T00:00:07.000Z"}]}


def _span(n: int, name: str, start_ms: int, end_ms: int, parent: int | None,
          **attrs: Any) -> dict[str, Any]:
    def val(v: Any) -> dict[str, Any]:
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    t0 = 1_750_000_000_000_000_000
    return {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": f"{n:016x}",
            "parentSpanId": f"{parent:016x}" if parent else "", "name": name,
            "kind": "SPAN_KIND_INTERNAL", "startTimeUnixNano": str(t0 + start_ms * 10**6),
            "endTimeUnixNano": str(t0 + end_ms * 10**6), "status": {},
            "attributes": [{"key": k.replace("__", "."), "value": val(v)}
                           for k, v in attrs.items()]}


def _otel() -> Doc:
    calls = json.dumps([{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "c1", "name": "read_file", "arguments": {"q": 1}}]}])
    spans = [
        _span(1, "invoke_agent coder", 0, 10_000, None, gen_ai__operation__name="invoke_agent",
              gen_ai__agent__name="coder"),
        _span(2, "chat m", 0, 1000, 1, gen_ai__operation__name="chat",
              gen_ai__usage__input_tokens=100, gen_ai__usage__output_tokens=10,
              gen_ai__output__messages=calls),
        _span(3, "execute_tool read_file", 1010, 1510, 1, gen_ai__operation__name="execute_tool",
              gen_ai__tool__name="read_file", gen_ai__tool__call__id="c1"),
        _span(4, "chat m", 2100, 2500, 1, gen_ai__operation__name="chat",
              gen_ai__usage__input_tokens=150, gen_ai__usage__output_tokens=5),
    ]
    return {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"scope": {"name": "test-agent", "version": "1.0"}, "spans": spans}]}]}


def _kv() -> Doc:
    def req(t: float, inp: int, hashes: list[int], kind: str) -> dict[str, Any]:
        return {"t": t, "type": "n", "model": "m", "in": inp, "out": 5, "hash_ids": hashes,
                "input_types": [kind], "output_types": ["text"], "stop": "tool_use",
                "api_time": 1.0}

    return {"id": "c", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
            "tool_tokens": 50, "system_tokens": 20,
            "requests": [req(0, 128, [1, 2], "text"), req(3, 200, [1, 2, 3], "tool_result")]}


def _mini() -> Doc:
    def assistant(p: int, c: int, ts: float, command: str) -> dict[str, Any]:
        response = {"id": f"r{int(ts)}", "created": int(ts), "model": "m",
                    "object": "chat.completion", "choices": [
                        {"finish_reason": "stop", "index": 0, "message": {
                            "content": "ok", "role": "assistant", "tool_calls": None}}],
                    "usage": {"prompt_tokens": p, "completion_tokens": c,
                              "total_tokens": p + c}}
        return {"role": "assistant", "content": "THOUGHT", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": command})}}],
            "extra": {"actions": [{"command": command, "tool_call_id": "call_1"}],
                      "response": response, "cost": 0.001, "timestamp": ts}}

    tool = {"role": "tool", "tool_call_id": "call_1", "content": "<returncode>0</returncode>",
            "extra": {"raw_output": "", "returncode": 0, "timestamp": 1001.0,
                      "exception_info": ""}}
    return {"info": {"model_stats": {"instance_cost": 0.004, "api_calls": 2},
                     "mini_version": "2.4.6", "exit_status": "Submitted",
                     "config": {"environment": {"timeout": 60}}},
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "Fix the bug."},
                         assistant(100, 5, 1000.0, "ls"), tool,
                         assistant(120, 6, 1003.0, "cat a")],
            "trajectory_format": "mini-swe-agent-1.1"}


def _mooncake() -> Doc:
    return [{"timestamp": 0, "input_length": 1200, "output_length": 50, "hash_ids": [0, 1, 2]},
            {"timestamp": 5000, "input_length": 1800, "output_length": 40,
             "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 9000, "input_length": 700, "output_length": 20, "hash_ids": [7, 8]}]


def _infercept() -> Doc:
    return {"req-a": [{"prompt_tokens": 392, "completion_tokens": 127, "api_time": 0.5,
                       "api_token_length": 21},
                      {"prompt_tokens": 540, "completion_tokens": 47}],
            "req-b": [{"prompt_tokens": 406, "completion_tokens": 123}]}


def _openai_chat() -> Doc:
    return [{"messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "rain"},
        {"role": "assistant", "content": "It rains in Oslo."}]}]


def _recording() -> Doc:
    return [json.loads(ln) for ln in (RECORDING / "events.jsonl").read_text().splitlines()]


@dataclass(frozen=True)
class Sample:
    """A format's valid input: its file name under `in/`, its document, JSON Lines or not,
    and how many trajectories and steps it imports to."""

    name: str
    build: Callable[[], Doc]
    jsonl: bool
    rows: int


SAMPLES: dict[str, Sample] = {
    "atif": Sample("t.json", _atif, False, 3),
    "claude-code": Sample("s-1.jsonl", _claude_code, True, 3),
    "codex": Sample("rollout-a.jsonl", _codex, True, 3),
    "infercept": Sample("w.json", _infercept, False, 4),
    "kv-cache-tester": Sample("c.json", _kv, False, 3),
    "mini-swe-agent": Sample("i.traj.json", _mini, False, 3),
    "mooncake": Sample("t.jsonl", _mooncake, True, 4),
    "openai-chat": Sample("c.json", _openai_chat, False, 3),
    "otel-genai": Sample("t.json", _otel, False, 3),
    "recording": Sample("events.jsonl", _recording, True, 11),
}


def encode(fmt: str, doc: Doc) -> bytes:
    """A document as its file's bytes (NaN written as JSON's common extension, NaN)."""
    if SAMPLES[fmt].jsonl:
        return "".join(json.dumps(x) + "\n" for x in doc).encode()
    return json.dumps(doc).encode()


def target(fmt: str) -> str:
    """The path the import is given, relative to the case's folder."""
    return "in/rec" if fmt == "recording" else f"in/{SAMPLES[fmt].name}"


def spoiled(fmt: str) -> str:
    """The file a spoiled input is written to, relative to the case's folder."""
    return "in/rec/events.jsonl" if fmt == "recording" else target(fmt)


def write_input(work: Path, fmt: str, data: bytes | None, name: str | None = None) -> Path:
    """Writes the format's input with `data` as its file (None: no file) under `work/in`;
    a recording gets its recording.json beside. Returns the file's path."""
    folder = work / "in"
    if fmt == "recording":
        folder = folder / "rec"
        folder.mkdir(parents=True)
        shutil.copy(RECORDING / "recording.json", folder / "recording.json")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or SAMPLES[fmt].name)
    if data is not None:
        path.write_bytes(data)
    return path


def valid_bytes(fmt: str, edit: Edit | None = None) -> bytes:
    """The sample's bytes, after `edit` changed its document."""
    doc = copy.deepcopy(SAMPLES[fmt].build())
    if edit is not None:
        doc = edit(doc)
    return encode(fmt, doc)


# ---------------------------------------------------------------- hostile files

_MIB = 1 << 20


def gzip_bomb(path: Path, inflated: int) -> None:
    """A gzip file inflating to `inflated` bytes of blank lines (JSON whitespace, lines of a
    MiB, so only the cap on inflating trips), written as repeated members of one compressed
    MiB: small and quick to write however large it inflates."""
    member = gzip.compress(b" " * (_MIB - 1) + b"\n", compresslevel=9)
    with path.open("wb") as fh:
        for _ in range(-(-inflated // _MIB)):
            fh.write(member)


def long_line(path: Path, length: int) -> None:
    """A file whose first line is `length` NUL bytes, written sparsely (no disk taken)."""
    with path.open("wb") as fh:
        fh.seek(length)
        fh.write(b"\n")


def deep(levels: int) -> bytes:
    """A JSON array nested `levels` deep."""
    return b"[" * levels + b"]" * levels


def truncated_gzip(data: bytes) -> bytes:
    """`data` gzipped, cut off halfway."""
    z = gzip.compress(data)
    return z[: len(z) // 2]


def raw_deflate(data: bytes) -> bytes:
    """`data` deflated without the gzip header: bytes a .gz name promises but does not hold."""
    return zlib.compress(data)


def fifo(path: Path) -> None:
    """A FIFO at `path`: reading it waits for a writer that never comes."""
    os.mkfifo(path)


def gzipped(data: bytes) -> bytes:
    """`data` gzipped whole."""
    return gzip.compress(data)
