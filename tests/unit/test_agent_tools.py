"""Coding agents' tool names as trajectory classes, and parallel calls merged into one pause."""

from __future__ import annotations

import pytest

from harness.traces.importers._common import Tool
from harness.traces.importers.agent_tools import agent_tool_class, merge_parallel


@pytest.mark.parametrize("name,cls", [
    ("Read", "local_read"), ("Glob", "local_read"), ("TodoWrite", "local_read"),
    ("Edit", "mutating"), ("apply_patch", "mutating"), ("str_replace_editor", "mutating"),
    ("Bash", "sandbox"), ("exec_command", "sandbox"), ("shell", "sandbox"),
    ("WebFetch", "remote_read"), ("web_search_call", "remote_read"),
    ("Task", "subagent"), ("AskUserQuestion", "human"), ("ExitPlanMode", "human"),
    ("browser_click", "browser"), ("mcp__playwright__navigate", "browser"),
    ("mcp__github__create_issue", "mutating"), ("mcp__jira__get_ticket", "remote_read"),
    ("mcp__x__frobnicate", "remote_read"),  # an MCP tool is remote unless its name says
    ("get_weather", "remote_read"), ("frobnicate", "sandbox"),
])
def test_agent_tool_class(name: str, cls: str) -> None:
    assert agent_tool_class(name) == cls


def test_default_class() -> None:
    assert agent_tool_class("frobnicate", "long_job") == "long_job"


def test_one_call_is_itself() -> None:
    t = Tool("Read", "local_read", 0.2)
    assert merge_parallel([t]) is t


def test_parallel_calls_wait_for_the_slowest() -> None:
    merged = merge_parallel([Tool("Read", "local_read", 0.2),
                             Tool("Bash", "sandbox", 3.5, "error", deadline_s=10.0),
                             Tool("Edit", "mutating", 0.1, mutating=True)])
    assert merged == Tool("Read+Bash+Edit", "sandbox", 3.5, "error", True, 10.0)


def test_a_call_that_never_returns_holds_the_pause() -> None:
    merged = merge_parallel([Tool("Read", "local_read", 0.2),
                             Tool("WebFetch", "remote_read", None)])
    assert (merged.latency_s, merged.outcome, merged.tool_class) == (None, "abandoned",
                                                                     "remote_read")
    timed_out = merge_parallel([Tool("Bash", "sandbox", None, "timeout"),
                                Tool("Read", "local_read", 1.0)])
    assert (timed_out.latency_s, timed_out.outcome) == (None, "timeout")


def test_no_calls_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        merge_parallel([])
