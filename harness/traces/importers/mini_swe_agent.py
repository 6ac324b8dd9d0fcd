"""mini-swe-agent trajectories (`*.traj.json` / `*.traj.json.gz`): one trajectory per file.

Each assistant message is an LLM call (`extra.response.usage`, `extra.timestamp` when the
response arrived); the tool messages after it are the commands it ran (`extra.timestamp` when
each finished, `extra.returncode`). Tool latency = tool timestamp - assistant timestamp.
From 2.4, a response without a usable tool call is kept in the `user` message of the format
error the agent answered it with (`extra.response`, no timestamp): an LLM call too, the format
error the user's turn after it (a `human` step), the rejected output never sent back.
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
from harness.userfiles import TOKEN_RULE, count_tokens, is_count, is_seconds, read_json

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
        self.rejected_calls = 0  # 2.4.x responses kept in format-error user messages
        self.estimated = 0  # of those, calls whose usage was absent (estimated)


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


def _is_response(m: dict[str, Any]) -> bool:
    """A user message holding a model response (2.4.x: a response with no usable tool call is
    kept in the format-error message the agent answered it with, `extra.response`)."""
    return m["role"] == "user" and isinstance(m.get("extra"), dict) and "response" in m["extra"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(b.get("text")) if isinstance(b, dict) else _text(b)
                         for b in content)
    return ""


class _Run:
    """One file's messages becoming steps: each call and the pause before it."""

    def __init__(self, src: Path, deadline: float | None, st: _Stats) -> None:
        self.src, self.deadline, self.st = src, deadline, st
        self.steps: list[LLM | Tool] = []
        self.prev: tuple[int, int] | None = None  # (prompt, completion) of the last call
        self.pending: tuple[list[str], float] | None = None  # last call's commands and time
        self.tools: list[tuple[int, dict[str, Any]]] = []
        self.first_ts: float | None = None
        self.rejected = False  # the last call's response was a format error, not re-sent
        self.context = 0  # the context the steps so far build
        self.kept = 0  # the context before the last call's output
        self.appended: list[str] = []  # texts since the last call (to estimate a prompt)

    def pause(self) -> None:
        """The pause before the next call (if a call came before)."""
        if self.pending is None:
            return
        if self.tools:
            self.steps.append(_tool_step(self.pending[0], self.pending[1], self.tools,
                                         self.src, self.deadline, self.st))
        elif self.rejected:  # the agent answered the malformed response at once
            self.steps.append(Tool("user", "human", 0.0))
        else:  # two calls with no command between (a format error): instant feedback
            self.st.no_tool_between += 1
            self.steps.append(Tool("format_error", "local_read", 0.0, "error", False, None))

    def call(self, i: int, p: int, c: int, ts: float | None, commands: list[str],
             rejected: bool) -> None:
        """A call whose prompt had `p` tokens and whose response `c`; `rejected`: the response
        is not sent back (a 2.4.x format error)."""
        self.pause()
        if ts is not None and self.first_ts is None:
            self.first_ts = ts
        keep = None
        if self.rejected:  # its prompt holds the last one's, not that one's output
            keep, inp = self.kept, p - (self.prev[0] if self.prev else 0)
        else:
            inp = p if self.prev is None else p - self.prev[0] - self.prev[1]
        if inp < 0:
            self.st.clamped_input.append(f"{self.src.name} message {i}: {inp}")
            inp = 0
        if c < 1:
            self.st.clamped_output.append(f"{self.src.name} message {i}: {c}")
        self.steps.append(LLM(inp, max(c, 1), keep))
        self.kept = (self.context if keep is None else keep) + inp
        self.context = self.kept + max(c, 1)
        self.prev, self.tools, self.rejected = (p, c), [], rejected
        self.pending = (commands, ts if ts is not None else self._last_ts())
        self.appended = []

    def _last_ts(self) -> float:
        return self.pending[1] if self.pending is not None else 0.0

    def response(self, i: int, m: dict[str, Any]) -> None:
        """A 2.4.x user message holding a response: an LLM call (usage from the response where
        it has it, else estimated), then the format error it got as the user's turn."""
        where = f"{self.src}: message {i} (user, extra.response)"
        resp = m["extra"]["response"]
        usage = resp.get("usage") if isinstance(resp, dict) else None
        p = c = None
        if isinstance(usage, dict):
            for fld, out in (("prompt_tokens", False), ("completion_tokens", True),
                             ("input_tokens", False), ("output_tokens", True)):
                v = usage.get(fld)
                if v is None:
                    continue
                if not is_count(v):
                    raise InputError(f"{where}: usage.{fld} must be an integer >= 0, "
                                     f"got {quote(v)}")
                if out and c is None:
                    c = v
                elif not out and p is None:
                    p = v
        if p is None or c is None:
            self.st.estimated += 1
            if p is None:
                p = self.context + count_tokens("\n".join(self.appended))
            if c is None:
                c = max(1, count_tokens(_answer(resp)))
        ts = _get(m, ("extra", "timestamp"))
        if not is_seconds(ts):
            created = _get(resp, ("created",))
            ts = created if is_seconds(created) else None
        self.st.rejected_calls += 1
        self.call(i, p, c, ts, [], True)


def _answer(resp: Any) -> str:
    """The text of a response's first choice (what the model generated), for counting."""
    msg = _get(resp, ("choices",))
    first = msg[0] if isinstance(msg, list) and msg else None
    return _text(_get(first, ("message", "content"))) if isinstance(first, dict) else ""


def _convert(src: Path, data: Any, st: _Stats) -> tuple[list[LLM | Tool], float | None]:
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InputError(f"{src}: expected an object with a 'messages' list")
    msgs: list[Any] = data["messages"]
    timeout = _get(data, ("info", "config", "environment", "timeout"))
    deadline = float(timeout) if is_seconds(timeout) and timeout > 0 else None
    run = _Run(src, deadline, st)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"{src}: message {i}: expected an object with a 'role'")
        role = m["role"]
        if role == "tool":
            if run.pending is None:
                raise InputError(f"{src}: message {i} (tool): no assistant message before it")
            run.tools.append((i, m))
        elif role == "assistant":
            where = f"{src}: message {i} (assistant)"
            p = _need(m, ("extra", "response", "usage", "prompt_tokens"), is_count, where,
                      "an integer >= 0")
            c = _need(m, ("extra", "response", "usage", "completion_tokens"), is_count, where,
                      "an integer >= 0")
            ts = _need(m, ("extra", "timestamp"), is_seconds, where, "a unix time")
            run.call(i, p, c, ts, _commands(m), False)
        elif _is_response(m):
            run.response(i, m)
        elif role == "user" and run.pending is not None:
            st.user_folded += 1  # its tokens reach the next call through prompt_tokens
        if role in ("user", "tool") and not _is_response(m):
            run.appended.append(_text(m.get("content")))
    steps = run.steps
    if run.pending is not None and run.tools:
        steps.append(_tool_step(run.pending[0], run.pending[1], run.tools, src, deadline, st))
    st.trailing += drop_trailing_tools(steps)
    return steps, run.first_ts


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
    firsts: list[float | None] = []  # each trajectory's first response time
    for src in files:
        steps, first_ts = _convert(src, read_json(src), st)
        if not steps:
            st.empty.append(src.name)
            continue
        trajs.append(Trajectory(_traj_id(path, src), steps, priority=opts["priority"],
                                tenant=opts["tenant"]))
        firsts.append(first_ts)
    if not trajs:
        raise InputError(f"{path}: no trajectory with an LLM call")
    known = [f for f in firsts if f is not None]
    if opts["start"] == "recorded" and known:
        t0 = min(known)
        for t, f in zip(trajs, firsts, strict=True):
            t.start_s = 0.0 if f is None else round(f - t0, 6)
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
            *_rejected_notes(st),
        ],
        extra={"files": len(files), "trajectories": trajectories, "skipped_empty": len(st.empty),
               "inputs_clamped": len(st.clamped_input),
               "outputs_clamped": len(st.clamped_output),
               "negative_latencies_clamped": len(st.negative_latency),
               "trailing_tools_dropped": st.trailing, "timeouts": st.timeouts,
               **({"format_error_calls": st.rejected_calls,
                   "format_error_calls_estimated": st.estimated} if st.rejected_calls else {})},
    )


def _rejected_notes(st: _Stats) -> list[str]:
    """Notes on 2.4.x responses kept in format-error messages (none for files without)."""
    if not st.rejected_calls:
        return []
    return [f"{st.rejected_calls} responses kept in a format-error user message "
            "(extra.response, 2.4.x) are LLM calls, their usage from the response "
            f"({st.estimated} without usage estimated by {TOKEN_RULE}); the format error is "
            "the user's turn after it (a 'human' step of 0 s, the agent answering at once), "
            "and the next call's context drops the rejected output (keep_tokens), which is "
            "never sent back"]


IMPORTER = Format("mini-swe-agent", one_path(import_path), many=False)
