"""OpenAI Codex CLI rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`): one session a file.

Each line is `{timestamp, type, payload}`: `session_meta` (the session id, cli_version, source),
`response_item` (the model's input and output: messages, reasoning, `function_call` /
`custom_tool_call` / `local_shell_call` and their outputs paired by `call_id`,
`web_search_call`), `event_msg` (`token_count` after each model response, `user_message`,
`exec_command_end` / `mcp_tool_call_end` with a duration, `patch_apply_end`, `turn_aborted`,
`context_compacted`), `turn_context` and `compacted`. Rollouts of mid 2025 have no envelope: a
first line that is the session header, `{"record_type": "state"}` markers and bare response
items, without token counts or times.

A model response is what the model produced between two `token_count` events that report new
usage (a repeated snapshot counts once); its usage is `last_token_usage`, else the growth of
`total_token_usage`. A tool's exact duration is the `Wall time` its output states (`shell`,
`exec_command`, `write_stdin`), else the output JSON's `metadata.duration_seconds` (the
legacy `shell` tool, `apply_patch`), else `exec_command_end` / `mcp_tool_call_end`'s
`duration`. Web searches run on OpenAI's side within the response: counted, not a pause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers._common import build_frame, summarize, take_options
from harness.traces.importers.agent_log import (
    FileStats,
    inferred_fields,
    measure,
    skew_warning,
    totals,
)
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import Builder, Built, assign_starts
from harness.traces.importers.codex_parse import Rollout
from harness.traces.schema import Provenance
from harness.userfiles import TOKEN_RULE, real_path

FORMAT = "codex"
OPTIONS: dict[str, str] = {}
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _files(paths: Sequence[Path]) -> list[Path]:
    """The rollout files named, a folder meaning every rollout-*.jsonl under it (else every
    *.jsonl: renamed copies), sorted, each once. A rollout's name is Codex's, so ~/.codex's
    own history.jsonl and session_index.jsonl are not read as sessions."""
    unique: dict[Path, Path] = {}
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: does not exist")
        found = [p]
        if p.is_dir():
            found = sorted(q for q in p.rglob("rollout-*.jsonl") if not q.is_dir()) or sorted(
                q for q in p.rglob("*.jsonl") if not q.is_dir())
        if not found:
            raise InputError(f"{p}: no rollout-*.jsonl or *.jsonl files")
        for q in found:
            unique.setdefault(real_path(q), q)
    return list(unique.values())


def _session_id(stats: FileStats) -> str:
    """The session's id: session_meta's, else the UUID in the file name, else the name."""
    if stats.ident:
        return stats.ident
    m = _UUID_RE.findall(stats.path.name)
    stats.ident = m[-1] if m else stats.path.name.removesuffix(".jsonl")
    return stats.ident


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one Codex rollout, or every rollout under a folder."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import Codex rollouts (files, or folders such as ~/.codex/sessions): one trajectory per
    session, continued after any call that never returned."""
    opts = take_options(options, FORMAT, OPTIONS)
    builder, built = Builder(), Built()
    stats: list[FileStats] = []
    empty: list[str] = []
    for f in _files(paths):
        rollout = Rollout(f)
        convo = rollout.read()
        stats.append(rollout.stats)
        convo.key = _session_id(rollout.stats)
        if not convo.responses:
            empty.append(str(f))
            continue
        measure(convo, FORMAT)
        builder.build(convo, built)
    if not built.trajectories:
        raise InputError(f"{FORMAT} import: no model response in "
                         f"{', '.join(str(p) for p in paths)}")
    assign_starts(built, opts["priority"], opts["tenant"])
    roots = sum(t.parent_id is None for t in built.trajectories)
    tot = totals(stats, {"files": len(stats), "sessions": len(stats) - len(empty),
                         "trajectories": len(built.trajectories), "roots": roots})
    warnings = [summarize("files without a model response skipped", empty)] if empty else []
    if tot["continuations"]:
        warnings.append(f"{tot['continuations']} calls never returned in the middle of a "
                        "session: each ends its trajectory and the rest of the session is a "
                        "continuation trajectory (id ~2, ~3, ...)")
    warnings += skew_warning(stats)
    return Imported(build_frame(built.trajectories), _provenance(stats, tot), warnings)


def _provenance(stats: list[FileStats], tot: dict[str, Any]) -> Provenance:
    return Provenance(
        source_format=FORMAT,
        source_files=[str(s.path) for s in stats],
        inferred={
            **inferred_fields(FORMAT),
            "output_tokens": "last_token_usage.output_tokens (reasoning included), else the "
                             "growth of total_token_usage; at least 1; a response without a "
                             "token count: counted from its text",
            "latency_s (exact)": "the output's 'Wall time: X seconds' (shell, exec_command, "
                                 "write_stdin), else its JSON metadata.duration_seconds "
                                 "(legacy shell, apply_patch), else exec_command_end / "
                                 "mcp_tool_call_end duration",
            "trajectory_id": "session_meta id (else the UUID in the file name); a "
                             "continuation after a call that never returned: id~2, ~3, ...",
        },
        notes=[
            "a response is the model output up to a token_count event with new usage; "
            "repeated token_count snapshots are counted once (skipped_lines)",
            "web searches (web_search_call) run on OpenAI's side within the response: "
            "hosted_calls, not a pause",
            "a sub-agent's own rollout (session_meta source 'subagent') is imported as a "
            "trajectory of its own, arriving when it started: Codex's sub-agents run beside "
            "their parent, which goes on and waits for them with its own tool calls",
            f"text is counted by {TOKEN_RULE} where a response has no token count",
        ],
        extra={"files": [s.entry() for s in stats], "totals": tot},
    )


IMPORTER = Format("codex", import_paths, many=True)
