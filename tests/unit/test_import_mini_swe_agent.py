"""mini-swe-agent 2.4.x trajectories: responses kept in format-error user messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.traces.importers import Imported, import_trace
from harness.traces.schema import COLUMNS
from harness.traces.validate import check_frame

FMT = "mini-swe-agent"
FORMAT_ERROR = ("Tool call error:\n\n<error>\nNo tool calls found in the response. Every "
                "response MUST include at least one tool call.\n</error>\n\nHere is general "
                "guidance on how to submit correct toolcalls: ...")


def _response(p: int, c: int, created: int, content: str = "I think so.") -> dict[str, Any]:
    return {"id": f"r{created}", "created": created, "model": "m", "object": "chat.completion",
            "choices": [{"finish_reason": "stop", "index": 0,
                         "message": {"content": content, "role": "assistant",
                                     "tool_calls": None}}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}


def _rejected(p: int, c: int, created: int) -> dict[str, Any]:
    """What 2.4.x keeps of a response without a usable tool call: the format error the agent
    answered it with, the response (and its cost) in its extra."""
    return {"role": "user", "content": FORMAT_ERROR,
            "extra": {"interrupt_type": "FormatError", "cost": 0.001,
                      "response": _response(p, c, created)}}


def _assistant(p: int, c: int, ts: float, command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "THOUGHT", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": json.dumps({"command": command})}}],
        "extra": {"actions": [{"command": command, "tool_call_id": "call_1"}],
                  "response": _response(p, c, int(ts)), "cost": 0.001, "timestamp": ts}}


def _tool(ts: float) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": "<returncode>0</returncode>",
            "extra": {"raw_output": "", "returncode": 0, "timestamp": ts,
                      "exception_info": ""}}


def _write(path: Path, calls: list[dict[str, Any]], api_calls: int) -> Path:
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug."}, *calls,
            {"role": "exit", "content": "RepeatedFormatError",
             "extra": {"exit_status": "RepeatedFormatError", "submission": ""}}]
    data = {"info": {"model_stats": {"instance_cost": 0.004, "api_calls": api_calls},
                     "mini_version": "2.4.6", "exit_status": "RepeatedFormatError",
                     "config": {"environment": {"timeout": 60}}},
            "messages": msgs, "trajectory_format": "mini-swe-agent-1.1"}
    path.write_text(json.dumps(data))
    return path


def _frame(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def _opt(v: Any) -> Any:
    return None if pd.isna(v) else int(v)


def test_four_calls_with_format_errors_around_a_bash_step(tmp_path: Path) -> None:
    f = _write(tmp_path / "a__b-1.traj.json", [
        _rejected(1000, 50, 1000), _assistant(1100, 30, 1003.0, "ls -la"), _tool(1003.5),
        _rejected(1180, 40, 1005), _rejected(1260, 20, 1006)], 4)
    imp = import_trace(FMT, f, {})
    df = _frame(imp)
    assert list(df["kind"]) == ["llm", "tool", "llm", "tool", "llm", "tool", "llm"]
    llm = df[df["kind"] == "llm"]
    assert list(llm["input_tokens"]) == [1000, 100, 50, 80]
    assert list(llm["output_tokens"]) == [50, 30, 40, 20]
    # The rejected outputs are never sent back: the next call's context drops them.
    assert [_opt(v) for v in llm["keep_tokens"]] == [None, 1000, None, 1180]
    tools = df[df["kind"] == "tool"]
    assert list(zip(tools["tool_name"], tools["tool_class"], strict=True)) == [
        ("user", "human"), ("ls", "local_read"), ("user", "human")]
    assert list(tools["latency_s"]) == [0.0, 0.5, 0.0]
    ex = imp.provenance.extra
    assert (ex["format_error_calls"], ex["format_error_calls_estimated"]) == (3, 0)
    assert ex["trailing_tools_dropped"] == 0
    assert any("format-error user message" in n for n in imp.provenance.notes)


def test_three_format_errors_in_a_row(tmp_path: Path) -> None:
    """A run that ended on RepeatedFormatError without one tool call: 3 calls."""
    f = _write(tmp_path / "a__b-2.traj.json", [
        _rejected(900, 10, 2000), _rejected(980, 12, 2001), _rejected(1060, 9, 2002)], 3)
    imp = import_trace(FMT, f, {"start": "recorded"})
    df = _frame(imp)
    llm = df[df["kind"] == "llm"]
    assert len(llm) == 3 and list(llm["input_tokens"]) == [900, 80, 80]
    assert [_opt(v) for v in llm["keep_tokens"]] == [None, 900, 980]
    assert list(df[df["kind"] == "tool"]["tool_class"]) == ["human", "human"]
    assert (df["start_s"] == 0.0).all()


def test_response_without_usage_is_estimated(tmp_path: Path) -> None:
    """A response kept as text (its repr, where it could not be serialised) has no usage: the
    call is estimated from the text and counted."""
    raw = _rejected(0, 0, 0)
    raw["extra"]["response"] = "ModelResponse(id='x', choices=[...])"
    f = _write(tmp_path / "a__b-3.traj.json", [_assistant(500, 20, 10.0, "cat x"), _tool(11.0),
                                               raw, _assistant(700, 5, 13.0, "ls")], 3)
    imp = import_trace(FMT, f, {})
    df = _frame(imp)
    llm = df[df["kind"] == "llm"]
    assert len(llm) == 3 and list(llm["output_tokens"])[1] == 1
    assert imp.provenance.extra["format_error_calls_estimated"] == 1
    assert list(df[df["kind"] == "tool"]["tool_class"]) == ["local_read", "human"]
