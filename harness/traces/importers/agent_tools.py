"""Coding agents' tools as the trajectory format's classes, and parallel calls as one pause.

Shared by the agent-log importers (Codex, Claude Code, OpenTelemetry GenAI, ATIF, recordings):
their tools are named by the agent (Claude Code's `Read`, Codex's `exec_command`, OpenHands'
`str_replace_editor`), not by what they do, so the class comes from a table of the names these
agents use, then from the first word of the name (`tool_class_of`), then a default.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.traces.importers._common import Tool
from harness.traces.importers.openai_chat import tool_class_of
from harness.traces.schema import TOOL_SUBAGENT

# Lower-cased tool names of Claude Code, Codex, OpenHands, terminus and common MCP servers.
AGENT_TOOL_CLASSES: dict[str, str] = {
    **dict.fromkeys((
        "read", "glob", "grep", "ls", "notebookread", "read_file", "list_dir", "list_files",
        "view_image", "todoread", "todowrite", "update_plan", "enterplanmode",
        "think", "finish", "skill", "toolsearch", "listmcpresourcestool",
        "readmcpresourcetool"), "local_read"),
    **dict.fromkeys((
        "write", "edit", "multiedit", "notebookedit", "apply_patch", "str_replace_editor",
        "write_file", "edit_file", "create_file", "replace"), "mutating"),
    **dict.fromkeys((
        "bash", "shell", "exec_command", "write_stdin", "local_shell", "local_shell_call",
        "bashoutput", "killshell", "killbash", "taskoutput", "taskstop", "execute_bash",
        "bash_command", "terminal", "run_command", "execute_command", "python", "ipython",
        "execute_ipython_cell", "unified_exec"), "sandbox"),
    **dict.fromkeys((
        "webfetch", "websearch", "web_search", "web_search_call", "web_fetch",
        "search_web", "visit_webpage", "fetch_url"), "remote_read"),
    **dict.fromkeys(("task", "agent"), TOOL_SUBAGENT),
    # ExitPlanMode waits for the user to approve the plan (minutes, in real sessions)
    **dict.fromkeys(("askuserquestion", "request_user_input", "ask_user", "exitplanmode"),
                    "human"),
}
BROWSER_PREFIXES = ("browser", "mcp__playwright", "mcp__puppeteer", "mcp__chrome")
# A sub-agent call (Task, Agent) whose conversation is not in the input: the parent still waits
# for it, minutes at a time, so it is a long job rather than a pause of the `subagent` class.
UNLINKED_SPAWN_CLASS = "long_job"


def agent_tool_class(name: str, default: str = "sandbox") -> str:
    """The trajectory class of an agent's tool `name`: the table of agents' own tool names,
    browser tools by prefix, an MCP tool (`mcp__server__tool`) by its tool part's first word,
    any other by its first word (`tool_class_of`), else `default`."""
    low = name.strip().lower()
    if low in AGENT_TOOL_CLASSES:
        return AGENT_TOOL_CLASSES[low]
    if low.startswith(BROWSER_PREFIXES):
        return "browser"
    if low.startswith("mcp__"):
        return tool_class_of(name.split("__")[-1], "remote_read")
    return tool_class_of(name, default)


def call_class(name: str) -> str:
    """The class of a call of tool `name` that started no sub-agent in the input: a launcher
    (Task, Agent) is a long job (UNLINKED_SPAWN_CLASS)."""
    cls = agent_tool_class(name)
    return UNLINKED_SPAWN_CLASS if cls == TOOL_SUBAGENT else cls


def merge_parallel(calls: Sequence[Tool]) -> Tool:
    """Calls made in one response, as the one pause the agent waits through: every name joined
    with '+', the slowest call's latency and class (never returning when any call never
    returns), mutating when any is, and the worst outcome (abandoned, timeout, error, ok)."""
    if not calls:
        raise ValueError("merge_parallel needs at least one call")
    if len(calls) == 1:
        return calls[0]
    never = [c for c in calls if c.latency_s is None]
    slowest = never[0] if never else max(calls, key=lambda c: c.latency_s or 0.0)
    order = ("ok", "error", "timeout", "abandoned")
    outcome = max((c.outcome for c in calls), key=lambda o: order.index(o) if o in order else 1)
    if never and outcome not in ("abandoned", "timeout"):
        outcome = "abandoned"
    deadlines = [c.deadline_s for c in calls if c.deadline_s is not None]
    return Tool("+".join(c.tool_name for c in calls), slowest.tool_class,
                None if never else slowest.latency_s, outcome,
                any(c.mutating for c in calls), max(deadlines) if deadlines else None)
