"""Claude Code transcripts (`~/.claude/projects/<project>/<session>.jsonl`), with sub-agents.

A session file is one trajectory: each API response (its `assistant` lines sharing
`message.id`) an LLM step with `message.usage` (input_tokens + cache_read_input_tokens +
cache_creation_input_tokens = the prompt; output_tokens), the `tool_use` calls of a response
one pause, the user's prompts `human` pauses. Sub-agents, in every layout Claude Code wrote:
`agent-*.jsonl` beside the session (2.0.x), `<session>/subagents/agent-*.jsonl` (2.1.x), inline
`isSidechain` lines in the session file (1.0.x), or only copies in `progress` lines
(agent_progress). A sub-agent is linked to the Task (or Agent) call that started it by the
toolUseId its `agent-<id>.meta.json` names (2.1.x, in the main transcript or another
sub-agent's, its spawnDepth checked), by the agentId the call's result names, by the progress
lines' parentToolUseID, else by its first prompt being the call's `prompt` (a guess, counted);
it becomes a child trajectory of that call's `subagent` step.
Sidechains no call started (2.0.x warm-ups at start-up, prompt "Warmup") are trajectories of
their own, or left out with `-o warmups=skip`.
"""

from __future__ import annotations

from collections import Counter
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
from harness.traces.importers.claude_code_meta import meta_path, read_meta
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


def _root_key(f: ClaudeFile, s: Side) -> str:
    """The id of a sub-agent no call in the input started: <sessionId>/<agentId>."""
    return f"{s.session or f.stats.ident}/{s.agent_id or s.entries[0].uuid}"


def _depth(s: Side, default: int) -> int:
    """The spawn depth a sub-agent's meta file gives, else `default`."""
    return s.meta.spawn_depth or default if s.meta is not None else default


class _Links:
    """Where the sub-agents are found by a spawning call: by the call id their meta file
    names, by the call id progress copies name, by (session, agentId). A sub-agent with a
    meta file is found by its call id only."""

    def __init__(self, sides: list[tuple[ClaudeFile, Side]]) -> None:
        self.by_meta: dict[str, list[Side]] = {}
        for _, s in sides:
            if s.meta is not None:
                self.by_meta.setdefault(s.meta.tool_use_id, []).append(s)
        self.by_agent = {(s.session, s.agent_id): s for _, s in sides
                         if s.agent_id and not s.progress_of and s.meta is None}
        self.by_call = {s.progress_of: s for _, s in sides if s.progress_of}
        self.file_of = {id(s): f.stats.path for f, s in sides}


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
        self.rooted: set[int] = set()  # sub-agents no call reached: roots of their own
        self.how: Counter[str] = Counter()  # links made, by what found them
        self.meta_bad: list[str] = []  # meta files that could not be used
        self.meta_orphans: list[str] = []  # meta files naming a call no transcript holds
        self.depth_off: list[str] = []  # spawnDepth unlike the depth the link gives

    def read(self, paths: Sequence[Path]) -> None:
        sessions: dict[Path, str] = {}
        for path, owner in _files(paths):
            f = read_file(path)
            if owner is not None and f.session != sessions.get(owner.resolve()):
                continue  # an agent file of another session in the same folder
            sessions[path.resolve()] = f.session
            f.stats.ident = f.session or path.stem
            self._read_meta(f)
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

    def _read_meta(self, f: ClaudeFile) -> None:
        """Attach a sub-agent file's agent-<id>.meta.json to its conversation; a malformed one
        is counted and warned of, and the sub-agent is linked as if it had none."""
        path = meta_path(f.stats.path)
        if path is None or not path.exists():
            return
        try:
            meta = read_meta(path)
        except InputError as exc:
            self.meta_bad.append(str(exc))
            return
        own = f.stats.path.name[len("agent-"): -len(".jsonl")]
        sides = [s for s in f.sides if not s.progress_of]
        for s in sides:
            if s.agent_id == own or len(sides) == 1:
                s.meta = meta

    def link(self) -> None:
        """Each sub-agent call's conversation, where the input has it: from the mains down,
        then from the sub-agents no call reached (their own sub-agents link to them)."""
        lk = _Links(self.sides)
        self._walk(lk, [(f.session, c, 0, 0) for f, c in self.mains], True)
        convos = [c for _, c in self.mains] + [s.convo for _, s in self.sides if s.convo]
        called = {k.call_id for c in convos for r in c.responses for k in r.calls}
        rest = [(f, s) for f, s in self.sides if id(s) not in self.linked
                and s.convo is not None]
        for f, s in rest:
            if s.meta is not None and s.meta.tool_use_id not in called:
                self.meta_orphans.append(f"{f.stats.path.name}: {quote(s.meta.tool_use_id)}")
        # Parents before their children (by the depth the meta files give), so that a chain
        # whose main transcript is absent still hangs together under its first sub-agent.
        rest.sort(key=lambda fs: _depth(fs[1], 0))
        for f, s in rest:
            if id(s) in self.linked or s.convo is None:
                continue
            self.rooted.add(id(s))
            s.convo.key = _root_key(f, s)
            level = _depth(s, 1)
            self._walk(lk, [(s.session, s.convo, 0, level)], False)

    def _walk(self, lk: _Links, todo: list[tuple[str, Convo, int, int]], guess: bool) -> None:
        """Link the sub-agents the calls of `todo`'s conversations started, breadth first;
        (session, conversation, its nesting under the walk's root, its spawn depth)."""
        while todo:
            session, convo, depth, level = todo.pop(0)
            for r in convo.responses:
                for call in r.calls:
                    for side, how in self._sides_of(call, session, lk, guess):
                        if side.convo is None:
                            continue
                        if depth == MAX_SUBAGENT_DEPTH:  # refused here, naming the file
                            raise InputError(
                                f"{lk.file_of[id(side)]}: sub-agents nested deeper than "
                                f"{MAX_SUBAGENT_DEPTH} levels (the limit): agent "
                                f"{quote(side.agent_id or call.call_id)} is level {depth + 1}")
                        self.linked.add(id(side))
                        self.how[how] += 1
                        if side.meta and side.meta.spawn_depth not in (None, level + 1):
                            self.depth_off.append(
                                f"{lk.file_of[id(side)].name}: spawnDepth "
                                f"{side.meta.spawn_depth}, found {level + 1}")
                        kid = side.convo
                        kid.kind = call.kind or "subagent"
                        kid.key = f"{convo.key}/{side.agent_id or call.call_id[-8:]}"
                        call.children.append(kid)
                        if side.progress_of:
                            self._add_final(kid, call)
                        todo.append((side.session, kid, depth + 1, level + 1))

    def _sides_of(self, call: Call, session: str, lk: _Links, guess: bool
                  ) -> list[tuple[Side, str]]:
        """The sub-agents `call` started and how each is known: its meta file names the call
        (meta), the call's result or the progress lines name it (agent_id), or its first
        prompt is the call's (prompt: a guess, only from the mains down)."""
        if not call.spawn:
            return []
        free = [s for s in lk.by_meta.get(call.call_id, ()) if self._free(s)]
        if free:
            return [(s, "meta") for s in free]
        for side in (lk.by_call.get(call.call_id), lk.by_agent.get((session, call.agent_id))):
            if side is not None and self._free(side):
                return [(side, "agent_id")]
        if not guess or not call.prompt:
            return []
        return next(([(s, "prompt")] for _, s in self.sides if self._free(s) and s.meta is None
                     and s.prompt == call.prompt and s.session in (session, "")), [])

    def _free(self, side: Side) -> bool:
        return id(side) not in self.linked and id(side) not in self.rooted

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
            s.convo.key = _root_key(f, s)
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
                         "subagent_final_calls_added": imp.added_finals,
                         "subagents_linked_by_meta": imp.how["meta"],
                         "subagents_linked_by_id": imp.how["agent_id"],
                         "subagents_linked_by_prompt": imp.how["prompt"],
                         "subagent_meta_malformed": len(imp.meta_bad),
                         "subagent_meta_parent_missing": len(imp.meta_orphans),
                         "subagent_depth_mismatches": len(imp.depth_off)})
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
    if imp.meta_bad:
        out.append(summarize("sub-agent meta files unusable (their sub-agents are linked as "
                             "if they had none)", imp.meta_bad))
    if imp.meta_orphans:
        out.append(summarize("sub-agent meta files name a call (toolUseId) no transcript in "
                             "the input holds: those sub-agents are trajectories of their own",
                             imp.meta_orphans))
    if imp.depth_off:
        out.append(summarize("sub-agents whose meta file's spawnDepth differs from the depth "
                             "of the call its toolUseId names (the link is kept)", imp.depth_off))
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
            "a sub-agent is linked to the call that started it by its meta file's toolUseId "
            "(2.1.x agent-<id>.meta.json), else by the agentId the call's result names or the "
            "progress lines' parentToolUseID (exact: subagents_linked_by_meta, "
            "subagents_linked_by_id), else by its first prompt being the call's prompt (a "
            "guess: subagents_linked_by_prompt); a meta file's spawnDepth is checked against "
            "the depth of that call (subagent_depth_mismatches)",
            "a sub-agent known only from progress copies lacks its last response: it is "
            "added, estimated from the call's result (subagent_final_calls_added)",
            f"text is counted by {TOKEN_RULE} where a response has no usage",
        ],
        extra={"files": [s.entry() for s in stats], "totals": tot},
    )


IMPORTER = Format("claude-code", import_paths, many=True)
