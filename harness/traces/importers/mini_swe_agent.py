"""mini-swe-agent trajectories (`*.traj.json` / `*.traj.json.gz`): one trajectory per file.

Each assistant message is an LLM call (`extra.response.usage`, `extra.timestamp` when the
response arrived); the tool messages after it are the commands it ran (`extra.timestamp` when
each finished, `extra.returncode`). Tool latency = tool timestamp - assistant timestamp.
The trajectory id is the instance id from the file name; importing a directory prefixes the
sub-folder (`run/instance`), since one instance is often run more than once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers._common import (
    LLM,
    Tool,
    Trajectory,
    build_frame,
    drop_trailing_tools,
    quote,
    summarize,
    take_options,
)
from harness.traces.importers.base import Format, Imported, one_path
from harness.traces.schema import Provenance
from harness.userfiles import is_count, is_seconds, read_json

FORMAT = "mini-swe-agent"
OPTIONS = {"start": "zero"}  # zero | recorded (offsets of the first response across files)
SUFFIXES = (".traj.json", ".traj.json.gz")

# Tool class of a command, as data. A command that writes files (MUTATING_PATTERNS, searched in
# the whole command) is `mutating`; otherwise its first word (after `cd DIR &&`, comment lines
# and VAR=value prefixes) is looked up in COMMAND_CLASSES; anything else runs in the sandbox.
COMMAND_CLASSES: dict[str, str] = {
    **dict.fromkeys(("cat", "grep", "egrep", "rg", "ls", "find", "head", "tail", "wc", "pwd",
                     "awk", "diff", "hexdump", "nl", "tree", "stat", "file", "which", "echo",
                     "sed", "git", "less", "more", "sort", "uniq", "cut", "du", "env"),
                    "local_read"),
    **dict.fromkeys(("python", "python3", "pytest", "pip", "pip3", "bash", "sh", "make",
                     "tox", "node", "npm", "for", "while", "if", "sqlfluff"), "sandbox"),
    **dict.fromkeys(("cp", "mv", "rm", "mkdir", "touch", "patch", "tee", "ln", "chmod"),
                    "mutating"),
    **dict.fromkeys(("conda", "apt-get", "apt"), "long_job"),
}
MUTATING_PATTERNS: tuple[str, ...] = (
    r"\bsed\s+(?:-\w+\s+)*-i",  # sed -i (in place)
    r"(?<![\d&>])>>?\s*(?!&|/dev/null)[^\s>&|;]",  # output redirected to a file
    r"\bgit\s+(?:apply|checkout|reset|stash|commit|am|restore|clean)\b",
    r"(?:^|[;&|]\s*)patch\b",
)
DEFAULT_CLASS = "sandbox"
# Classes that change the environment (the `mutating` column); a read does not.
MUTATING_CLASSES = frozenset({"mutating", "sandbox", "long_job"})
# When one assistant message ran several commands (merged into one tool step): the class shown.
CLASS_PRECEDENCE = ("mutating", "long_job", "sandbox", "local_read")

_MUTATING_RE = re.compile("|".join(MUTATING_PATTERNS))
_PREFIX_RE = re.compile(r"^(?:\s*(?:#[^\n]*\n|cd\s+\S+\s*(?:&&|;)|\w+=\S*\s+|timeout\s+\d+\s+))*")
# Heredoc bodies and quoted strings are data, not shell: `python -c "a > b"` writes no file.
_HEREDOC_RE = re.compile(r"<<-?\s*(['\"]?)(\w+)\1([^\n]*)\n.*?\n\s*\2[ \t]*(?=\n|$)", re.S)
_QUOTED_RE = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")


def classify(command: str) -> tuple[str, str]:
    """(tool_name, tool_class) of a shell command by COMMAND_CLASSES and MUTATING_PATTERNS."""
    body = _PREFIX_RE.sub("", command, count=1).strip()
    word = re.split(r"[\s;|&()]+", body, maxsplit=1)[0] if body else ""
    name = word.rsplit("/", 1)[-1] or "shell"
    shell = _QUOTED_RE.sub("''", _HEREDOC_RE.sub(r"<<\2\3", command))
    if _MUTATING_RE.search(shell):
        return name, "mutating"
    return name, COMMAND_CLASSES.get(name, DEFAULT_CLASS)


class _Stats:
    def __init__(self) -> None:
        self.clamped_input: list[str] = []
        self.clamped_output: list[str] = []
        self.negative_latency: list[str] = []
        self.trailing = 0
        self.empty: list[str] = []
        self.user_folded = 0
        self.no_tool_between = 0
        self.timeouts = 0


def _get(obj: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def _need(msg: Any, keys: tuple[str, ...], check: Any, where: str, what: str) -> Any:
    v = _get(msg, keys)
    if not check(v):
        raise InputError(f"{where}: {'.'.join(keys)} must be {what}, got {quote(v)}")
    return v


def _commands(msg: dict[str, Any]) -> list[str]:
    acts = _get(msg, ("extra", "actions"))
    if isinstance(acts, list) and acts:
        return [str(a.get("command", "")) for a in acts if isinstance(a, dict)]
    out = []
    for tc in msg.get("tool_calls") or []:
        try:
            out.append(str(json.loads(tc["function"]["arguments"]).get("command", "")))
        except (KeyError, TypeError, ValueError, AttributeError):
            out.append("")
    return out


def _tool_step(commands: list[str], a_ts: float, tools: list[tuple[int, dict[str, Any]]],
               src: Path, deadline: float | None, st: _Stats) -> Tool:
    named = [classify(c) for c in commands] or [("shell", DEFAULT_CLASS)]
    classes = {c for _, c in named}
    cls = next((c for c in CLASS_PRECEDENCE if c in classes), sorted(classes)[0])
    outcome = "ok"
    stamps: list[float] = []
    for i, m in tools:
        where = f"{src}: message {i} (tool)"
        stamps.append(_need(m, ("extra", "timestamp"), is_seconds, where, "a unix time"))
        rc = _need(m, ("extra", "returncode"),
                   lambda v: isinstance(v, int) and not isinstance(v, bool), where, "an integer")
        if _get(m, ("extra", "exception_type")) == "TimeoutExpired":
            outcome = "timeout"
            st.timeouts += 1
        elif rc != 0 and outcome == "ok":
            outcome = "error"
    latency = max(stamps) - a_ts
    if latency < 0:
        st.negative_latency.append(f"{src.name} message {tools[0][0]}: {latency:.3f} s")
        latency = 0.0
    if outcome == "timeout" and deadline is not None and latency > deadline:
        # The environment killed the command at its timeout and the agent went on with the
        # error; past its deadline a replayed tool would end the trajectory instead. Its
        # result reached the agent a little after the timeout: taken as at it.
        latency = deadline
    return Tool("+".join(n for n, _ in named), cls, round(latency, 6), outcome,
                cls in MUTATING_CLASSES, deadline)


def _convert(src: Path, data: Any, st: _Stats) -> tuple[list[LLM | Tool], float | None]:
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InputError(f"{src}: expected an object with a 'messages' list")
    msgs: list[Any] = data["messages"]
    timeout = _get(data, ("info", "config", "environment", "timeout"))
    deadline = float(timeout) if is_seconds(timeout) and timeout > 0 else None
    steps: list[LLM | Tool] = []
    prev: tuple[int, int] | None = None  # (prompt_tokens, completion_tokens) of the last call
    pending: tuple[list[str], float] | None = None  # commands and timestamp of the last call
    tools: list[tuple[int, dict[str, Any]]] = []
    first_ts: float | None = None
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"{src}: message {i}: expected an object with a 'role'")
        role = m["role"]
        if role == "tool":
            if pending is None:
                raise InputError(f"{src}: message {i} (tool): no assistant message before it")
            tools.append((i, m))
        elif role == "assistant":
            where = f"{src}: message {i} (assistant)"
            p = _need(m, ("extra", "response", "usage", "prompt_tokens"), is_count, where,
                      "an integer >= 0")
            c = _need(m, ("extra", "response", "usage", "completion_tokens"), is_count, where,
                      "an integer >= 0")
            ts = _need(m, ("extra", "timestamp"), is_seconds, where, "a unix time")
            if pending is not None:
                if tools:
                    steps.append(_tool_step(pending[0], pending[1], tools, src, deadline, st))
                else:  # two calls with no command between (a format error): instant feedback
                    st.no_tool_between += 1
                    steps.append(Tool("format_error", "local_read", 0.0, "error", False, None))
            first_ts = ts if first_ts is None else first_ts
            inp = p if prev is None else p - prev[0] - prev[1]
            if inp < 0:
                st.clamped_input.append(f"{src.name} message {i}: {inp}")
                inp = 0
            if c < 1:
                st.clamped_output.append(f"{src.name} message {i}: {c}")
            steps.append(LLM(inp, max(c, 1)))
            prev, pending, tools = (p, c), (_commands(m), ts), []
        elif role == "user" and pending is not None:
            st.user_folded += 1  # its tokens reach the next call through prompt_tokens
    if pending is not None and tools:
        steps.append(_tool_step(pending[0], pending[1], tools, src, deadline, st))
    st.trailing += drop_trailing_tools(steps)
    return steps, first_ts


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        # Every matching entry but a folder: read_json refuses one that is not a regular
        # file (a FIFO) by name rather than the import silently leaving it out.
        return sorted(p for p in path.rglob("*")
                      if not p.is_dir() and p.name.endswith(SUFFIXES))
    return [path]


def _traj_id(path: Path, src: Path) -> str:
    name = src.name
    for suf in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    if path.is_dir() and src.parent != path:
        return f"{src.parent.relative_to(path).as_posix()}/{name}"
    return name


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one trajectory file or every *.traj.json(.gz) under a directory."""
    opts = take_options(options, FORMAT, OPTIONS)
    if opts["start"] not in ("zero", "recorded"):
        raise InputError(f"{FORMAT} import: option start must be zero or recorded, "
                         f"got {opts['start']!r}")
    files = _files(path)
    if not files:
        raise InputError(f"{path}: no *.traj.json or *.traj.json.gz files")
    st = _Stats()
    trajs: list[Trajectory] = []
    firsts: list[float] = []  # each trajectory's first response time
    for src in files:
        steps, first_ts = _convert(src, read_json(src), st)
        if not steps or first_ts is None:
            st.empty.append(src.name)
            continue
        trajs.append(Trajectory(_traj_id(path, src), steps, priority=opts["priority"],
                                tenant=opts["tenant"]))
        firsts.append(first_ts)
    if not trajs:
        raise InputError(f"{path}: no trajectory with an LLM call")
    if opts["start"] == "recorded":
        t0 = min(firsts)
        for t, f in zip(trajs, firsts, strict=True):
            t.start_s = round(f - t0, 6)
    return Imported(build_frame(trajs), _provenance(files, opts, len(trajs), st), _warnings(st))


def _warnings(st: _Stats) -> list[str]:
    warnings = []
    if st.empty:
        warnings.append(summarize("files without any LLM call skipped", st.empty))
    if st.clamped_input:
        warnings.append(summarize("negative input tokens (prompt - previous prompt - previous "
                                  "completion) clamped to 0", st.clamped_input))
    if st.clamped_output:
        warnings.append(summarize("completions of 0 tokens raised to 1", st.clamped_output))
    if st.negative_latency:
        warnings.append(summarize("tool results timestamped before their call clamped to 0 s",
                                  st.negative_latency))
    return warnings


def _provenance(files: list[Path], opts: dict[str, str], trajectories: int,
                st: _Stats) -> Provenance:
    return Provenance(
        source_format=FORMAT,
        source_files=[str(f) for f in files],
        inferred={
            "input_tokens": "step 0: the first call's prompt_tokens; later: prompt_tokens - "
                            "previous prompt_tokens - previous completion_tokens, clamped at 0 "
                            "(reasoning tokens counted in a completion but not sent back make "
                            "it negative)",
            "output_tokens": "completion_tokens (at least 1)",
            "latency_s": "last tool message's extra.timestamp - the assistant message's "
                         "extra.timestamp (recorded; negatives clamped to 0)",
            "tool_class": "from the command: MUTATING_PATTERNS (sed -i, > file, git apply, "
                          "patch, writing heredocs) give 'mutating'; else the first word via "
                          f"COMMAND_CLASSES; else {DEFAULT_CLASS!r}",
            "tool_name": "the command's first word (several commands joined with '+')",
            "mutating": f"true for classes {', '.join(sorted(MUTATING_CLASSES))}",
            "outcome": "returncode 0: 'ok'; TimeoutExpired: 'timeout'; else 'error'",
            "deadline_s": "info.config.environment.timeout where recorded",
            "start_s": ("first response time minus the earliest across files"
                        if opts["start"] == "recorded" else "0 for every trajectory"),
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            f"{st.trailing} tool results after a trajectory's last LLM call (the run stopped "
            "on an API error) were dropped",
            f"{st.user_folded} user messages between calls (format-error feedback) have no "
            "step of their own: their tokens are in the next call's input",
            f"{st.no_tool_between} pairs of calls with no command between got an instant "
            "'format_error' tool step",
        ],
        extra={"files": len(files), "trajectories": trajectories, "skipped_empty": len(st.empty),
               "inputs_clamped": len(st.clamped_input),
               "outputs_clamped": len(st.clamped_output),
               "negative_latencies_clamped": len(st.negative_latency),
               "trailing_tools_dropped": st.trailing, "timeouts": st.timeouts},
    )


IMPORTER = Format("mini-swe-agent", one_path(import_path), many=False)
