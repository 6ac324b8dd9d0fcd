"""Claude Code transcripts (`~/.claude/projects/<project>/<session>.jsonl`), with sub-agents.

A session file is one trajectory: each API response (its `assistant` lines sharing
`message.id`) an LLM step with `message.usage` (input_tokens + cache_read_input_tokens +
cache_creation_input_tokens = the prompt; output_tokens), the `tool_use` calls of a response
one pause, the user's prompts `human` pauses. Sub-agents, in every layout Claude Code wrote:
`agent-*.jsonl` beside the session (2.0.x), `<session>/subagents/agent-*.jsonl` (2.1.x), inline
`isSidechain` lines in the session file (1.0.x), or only copies in `progress` lines
(agent_progress). A sub-agent is linked to the Task (or Agent) call that started it by the
agentId its result names, by the progress lines' parentToolUseID, else by its first prompt
being the call's `prompt`; it becomes a child trajectory of that call's `subagent` step.
Sidechains no call started (2.0.x warm-ups at start-up, prompt "Warmup") are trajectories of
their own, or left out with `-o warmups=skip`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.traces.importers._common import build_frame, quote, summarize, take_options
from harness.traces.importers.agent_log import (
    FileStats,
    count_calls,
    inferred_fields,
    measure,
    raise_outputs,
    skew_warning,
    totals,
)
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import Builder, Built, assign_starts
from harness.traces.importers.claude_code_parse import ClaudeFile, Side, convo_of, read_file
from harness.traces.importers.form import Call, Convo, Response
from harness.traces.schema import Provenance
from harness.userfiles import TOKEN_RULE, real_path

FORMAT = "claude-code"
OPTIONS = {"warmups": "keep"}
WARMUP_PROMPT = "Warmup"


def _files(paths: Sequence[Path]) -> list[tuple[Path, Path | None]]:
    """(file, the session file it must belong to) of every transcript to read: a folder means
    every *.jsonl under it; a session file brings its sub-agent files (`<session>/subagents/`,
    and the `agent-*.jsonl` beside it whose sessionId is the session's)."""
    out: dict[Path, tuple[Path, Path | None]] = {}
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: does not exist")
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.jsonl") if not q.is_dir())
            if not found:
                raise InputError(f"{p}: no *.jsonl transcripts")
            for q in found:
                out.setdefault(real_path(q), (q, None))
            continue
        out.setdefault(real_path(p), (p, None))
        if p.name.startswith("agent-"):
            continue
        sub = p.with_suffix("") / "subagents"
        for q in sorted(sub.glob("*.jsonl")) if sub.is_dir() else []:
            out.setdefault(real_path(q), (q, None))
        for q in sorted(p.parent.glob("agent-*.jsonl")):
            out.setdefault(real_path(q), (q, p))
    return list(out.values())


class _Import:
    """The files of one import, their conversations and how they link."""

    def __init__(self, opts: dict[str, str]) -> None:
        self.opts = opts
        self.files: list[ClaudeFile] = []
        self.mains: list[tuple[ClaudeFile, Convo]] = []
        self.sides: list[tuple[ClaudeFile, Side]] = []
        self.linked: set[int] = set()
        self.empty: list[str] = []
        self.added_finals = 0

    def read(self, paths: Sequence[Path]) -> None:
        sessions: dict[Path, str] = {}
        for path, owner in _files(paths):
            f = read_file(path)
            if owner is not None and f.session != sessions.get(owner.resolve()):
                continue  # an agent file of another session in the same folder
            sessions[path.resolve()] = f.session
            f.stats.ident = f.session or path.stem
            self.files.append(f)
        # A sub-agent Claude Code wrote to its own file and copied into progress lines is
        # read from its file.
        filed = {(s.session, s.agent_id) for f in self.files for s in f.sides
                 if s.agent_id and not s.progress_of}
        for f in self.files:
            path = f.stats.path
            if f.main:
                main = convo_of(f.main, f.stats, f.stats.ident, "main", False, path)
                raise_outputs(main.responses, f.stats)
                self.mains.append((f, main))
            for s in f.sides:
                if s.progress_of and (s.session, s.agent_id) in filed:
                    f.stats.skipped["progress:agent_progress (in its sub-agent file)"] += len(
                        s.entries)
                    continue
                s.convo = convo_of(s.entries, f.stats, "", "subagent", True, path)
                raise_outputs(s.convo.responses, f.stats)
                f.stats.counts["subagents"] += 1
                self.sides.append((f, s))

    def link(self) -> None:
        """Each sub-agent call's conversation, where the input has it."""
        by_agent = {(s.session, s.agent_id): s for _, s in self.sides
                    if s.agent_id and not s.progress_of}
        by_call = {s.progress_of: s for _, s in self.sides if s.progress_of}
        file_of = {id(s): f.stats.path for f, s in self.sides}
        todo: list[tuple[str, Convo, int]] = [(f.session, c, 0) for f, c in self.mains]
        while todo:
            session, convo, depth = todo.pop(0)
            for r in convo.responses:
                for call in r.calls:
                    side = self._side_of(call, session, by_agent, by_call)
                    if side is None or side.convo is None:
                        continue
                    if depth == MAX_SUBAGENT_DEPTH:  # refused here, naming the source file
                        raise InputError(
                            f"{file_of[id(side)]}: sub-agents nested deeper than "
                            f"{MAX_SUBAGENT_DEPTH} levels (the limit): agent "
                            f"{quote(side.agent_id or call.call_id)} is level {depth + 1}")
                    self.linked.add(id(side))
                    kid = side.convo
                    kid.kind = call.kind or "subagent"
                    kid.key = f"{convo.key}/{side.agent_id or call.call_id[-8:]}"
                    call.children.append(kid)
                    if side.progress_of:
                        self._add_final(kid, call)
                    todo.append((side.session, kid, depth + 1))

    def _side_of(self, call: Call, session: str, by_agent: dict[tuple[str, str], Side],
                 by_call: dict[str, Side]) -> Side | None:
        if not call.spawn:
            return None
        for side in (by_call.get(call.call_id), by_agent.get((session, call.agent_id))):
            if side is not None and id(side) not in self.linked:
                return side
        if not call.prompt:
            return None
        return next((s for _, s in self.sides if id(s) not in self.linked
                     and s.prompt == call.prompt and s.session in (session, "")), None)

    def _add_final(self, kid: Convo, call: Call) -> None:
        """A sub-agent known from progress copies lacks its last response (the copies stop at
        its last tool results): added, estimated from the text (its answer is the call's
        result), ending when the call returned."""
        last = kid.responses[-1] if kid.responses else None
        if last is None or not last.calls or not all(k.has_result for k in last.calls):
            return
        kid.responses.append(Response(
            0, None, max(call.result_tokens, 1), None, None, call.result_ts,
            counted_in=sum(k.result_tokens for k in last.calls),
            counted_out=call.result_tokens))
        if call.result_ts is not None:
            kid.last_ts = max(kid.last_ts or call.result_ts, call.result_ts)
        self.added_finals += 1

    def build(self) -> Built:
        builder, built = Builder(), Built()
        for f, main in self.mains:
            if main.responses:
                measure(main, FORMAT)
                builder.build(main, built)
            else:
                self.empty.append(str(f.stats.path))
        for f, s in self.sides:
            if id(s) in self.linked or s.convo is None or not s.convo.responses:
                continue
            warm = s.prompt == WARMUP_PROMPT
            f.stats.counts["warmups" if warm else "subagents_unlinked"] += 1
            if warm and self.opts["warmups"] == "skip":
                f.stats.counts["warmups_skipped"] += 1
                continue
            s.convo.kind = "warmup" if warm else "subagent"
            s.convo.key = f"{s.session or f.stats.ident}/{s.agent_id or s.entries[0].uuid}"
            measure(s.convo, FORMAT)
            builder.build(s.convo, built)
        return built


def _call_counts(imp: _Import) -> None:
    """Each file's counts of results, exact durations, errors and abandoned calls."""
    convos: list[tuple[FileStats, Convo]] = [(f.stats, c) for f, c in imp.mains]
    convos += [(f.stats, s.convo) for f, s in imp.sides if s.convo is not None]
    for stats, convo in convos:
        count_calls((k for r in convo.responses for k in r.calls), stats.counts)


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one Claude Code session (with its sub-agent files), or every transcript under a
    folder (a project folder, or ~/.claude/projects)."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import Claude Code transcripts: session files and folders of them, with sub-agents."""
    opts = take_options(options, FORMAT, OPTIONS)
    if opts["warmups"] not in ("keep", "skip"):
        raise InputError(f"{FORMAT} import: option warmups must be keep or skip, "
                         f"got {opts['warmups']!r}")
    imp = _Import(opts)
    imp.read(paths)
    imp.link()
    built = imp.build()
    _call_counts(imp)
    if not built.trajectories:
        raise InputError(f"{FORMAT} import: no model response in "
                         f"{', '.join(str(p) for p in paths)}")
    assign_starts(built, opts["priority"], opts["tenant"])
    stats = [f.stats for f in imp.files]
    roots = sum(t.parent_id is None for t in built.trajectories)
    tot = totals(stats, {"files": len(stats), "sessions": len(imp.mains) - len(imp.empty),
                         "trajectories": len(built.trajectories), "roots": roots,
                         "subagent_final_calls_added": imp.added_finals})
    return Imported(build_frame(built.trajectories), _provenance(stats, tot, opts),
                    _warnings(imp, tot) + skew_warning(stats))


def _warnings(imp: _Import, tot: dict[str, Any]) -> list[str]:
    out = [summarize("sessions without a model response skipped", imp.empty)] if imp.empty \
        else []
    if tot["continuations"]:
        out.append(f"{tot['continuations']} calls never returned in the middle of a session: "
                   "each ends its trajectory and the rest of the session is a continuation "
                   "trajectory (id ~2, ~3, ...)")
    if tot["subagents_unlinked"]:
        out.append(f"{tot['subagents_unlinked']} sub-agent conversations no call in the input "
                   "started: imported as trajectories of their own")
    if tot["subagent_calls"] > tot["subagents"] - tot["subagents_unlinked"] - tot["warmups"]:
        out.append("sub-agent calls whose conversation is not in the input stay ordinary "
                   "tool steps (class long_job) with their duration")
    return out


def _provenance(stats: list[FileStats], tot: dict[str, Any], opts: dict[str, str]
                ) -> Provenance:
    return Provenance(
        source_format=FORMAT,
        source_files=[str(s.path) for s in stats],
        inferred={
            **inferred_fields(FORMAT),
            "output_tokens": "the largest output_tokens of the response's lines, raised to "
                             "the tokens counted in its own content where the log reports "
                             "less (output_raised), but never past the next prompt's growth; "
                             "at least 1",
            "latency_s (exact)": "toolUseResult totalDurationMs (a sub-agent call), "
                                 "durationMs or durationSeconds",
            "trajectory_id": "the sessionId; a sub-agent: <parent>/<agentId> (1.0.x inline: "
                             "<parent>/<the call id's end>); a warm-up or a sub-agent no call "
                             "started: <sessionId>/<agentId>; a continuation: ~2, ~3, ...",
        },
        notes=[
            "one response is the assistant lines sharing message.id: one LLM call, usage once",
            "summary lines are session titles (their leafUuid points anywhere, often at other "
            "sessions): skipped; compactions are isCompactSummary users and compact_boundary "
            "system lines; /clear cuts the context to the cached tokens",
            f"warm-up sidechains (prompt {WARMUP_PROMPT!r}, started by no call): "
            + ("trajectories of their own" if opts["warmups"] == "keep" else "left out")
            + " (option warmups)",
            "a sub-agent known only from progress copies lacks its last response: it is "
            "added, estimated from the call's result (subagent_final_calls_added)",
            f"text is counted by {TOKEN_RULE} where a response has no usage",
        ],
        extra={"files": [s.entry() for s in stats], "totals": tot},
    )


IMPORTER = Format("claude-code", import_paths, many=True)
