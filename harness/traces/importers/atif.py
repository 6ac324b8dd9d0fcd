"""ATIF trajectories (Agent Trajectory Interchange Format, ATIF-v1.x: Harbor, terminal-bench).

A file is one trajectory: `steps` of `source` system, user or agent. Each agent step is one
model call (`metrics.prompt_tokens`, `completion_tokens`, `cached_tokens`; without metrics, the
token rule on its text); its `tool_calls` are one pause, their results in `observation.results`
(by `source_call_id`; a result without one answers every call of the step). A later user step
with no tool call before it is the user's turn. Sub-trajectories named by
`subagent_trajectory_ref` (a tool call's result, or a system step's observation) are
sub-agents; `continued_trajectory_ref` continues the same trajectory in another file; steps
marked `is_copied_context` are the context a trajectory starts with, not new calls. Step
`timestamp`s time the pauses (approximately: the wall gap between steps); where a log has none
(Harbor's test outputs drop them), tool latency comes from the options and is marked inferred.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from harness.errors import InputError
from harness.traces.importers._common import LLM, Trajectory, build_frame, quote, take_options
from harness.traces.importers.atif_read import Doc, Resolver, looks_atif, make_doc
from harness.traces.importers.atif_report import provenance, warnings
from harness.traces.importers.atif_walk import Latencies, Reader, Walk, seconds_option
from harness.traces.importers.base import Format, Imported
from harness.traces.importers.builder import ENDING_TOOLS, Builder, Built, assign_starts, publish
from harness.traces.importers.otel_files import files_in_tree
from harness.traces.importers.otel_genai import PUBLISHED
from harness.traces.importers.otel_read import NS
from harness.userfiles import read_json

FORMAT = "atif"
OPTIONS = {"tool_latency": "1", "tool_latencies": "", "human_latency": "0"}


def _options(options: dict[str, str]) -> tuple[dict[str, str], Latencies]:
    opts = take_options(options, FORMAT, OPTIONS)
    per: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in opts["tool_latencies"].split(","))):
        name, eq, secs = item.rpartition("=")
        if not eq or not name.strip():
            raise InputError(f"{FORMAT} import: option tool_latencies takes NAME=SECONDS,..., "
                             f"got {quote(item)}")
        per[name.strip()] = seconds_option(secs, f"tool_latencies ({name.strip()})", FORMAT)
    return opts, Latencies(seconds_option(opts["tool_latency"], "tool_latency", FORMAT), per,
                           seconds_option(opts["human_latency"], "human_latency", FORMAT))


def _share_prefix(parent: Trajectory, pw: Walk, child: Trajectory, cw: Walk,
                  root: str) -> None:
    """A sub-trajectory that starts with a copy of its parent's first steps shares their
    tokens: both go in one prefix group, the child's prefix as long as the parent's prompt
    that held those steps (at most the child's first input)."""
    copied = [s for _, _, s in cw.seq]
    n = 0
    for s in copied:
        if s.get("is_copied_context") is not True or n >= len(pw.seq):
            break
        mine = pw.seq[n][2]
        if (s.get("source"), s.get("message")) != (mine.get("source"), mine.get("message")):
            break
        n += 1
    if not n:
        return
    held = next((r.prompt for r, pos in zip(pw.responses, pw.positions, strict=True)
                 if pos >= n and r.prompt is not None), None)
    first_child, first_parent = child.steps[0], parent.steps[0]
    if held is None or not isinstance(first_child, LLM) or not isinstance(first_parent, LLM):
        return
    share = min(held, first_child.input_tokens)
    if not share or not first_parent.input_tokens:
        return
    group = f"{FORMAT}/{root}"
    child.prefix_group, child.prefix_tokens = group, share
    if parent.prefix_group is None:
        parent.prefix_group, parent.prefix_tokens = group, first_parent.input_tokens


def _prefixes(built: Built, reader: Reader) -> None:
    """The prefix groups of sub-agents that start with a copy of their parent's steps."""
    by_id = {t.trajectory_id: t for t in built.trajectories}
    for t in built.trajectories:
        if t.parent_id is None:
            continue
        parent = by_id[t.parent_id]
        pw = reader.walks[id(built.convo[parent.trajectory_id])]
        cw = reader.walks[id(built.convo[t.trajectory_id])]
        _share_prefix(parent, pw, t, cw, built.root[t.trajectory_id])


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one ATIF file, or a folder of them."""
    return import_paths([path], options)


def import_paths(paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import ATIF files and folders; a file another one references is not a root of its own."""
    opts, opt = _options(options)
    docs: list[Doc] = []
    skipped: list[str] = []
    for f, from_folder in files_in_tree(paths, (".json", ".json.gz")):
        data = read_json(f)
        if from_folder and not looks_atif(data):
            skipped.append(str(f))  # a folder's other JSON (a run's config, results)
            continue
        docs.append(make_doc(f, str(f), data))
    if not docs:
        raise InputError(f"{FORMAT} import: no ATIF trajectory in {', '.join(map(str, paths))}")
    resolver = Resolver(docs)
    referenced = _referenced(docs, resolver)
    reader = Reader(resolver, opt)
    builder, built = Builder(ENDING_TOOLS), Built()
    for d in docs:
        reader.counter(d)
    if all(id(d) in referenced for d in docs):
        raise InputError(f"{FORMAT} import: every trajectory given is referenced by another "
                         "(their references form a cycle)")
    sessions = Counter(d.text("trajectory_id") or d.text("session_id") or d.path.stem
                       for d in docs if id(d) not in referenced)
    for d in docs:
        if id(d) in referenced:
            continue
        base = d.text("trajectory_id") or d.text("session_id") or d.path.stem
        if sessions[base] > 1:  # one session id in several files (copies, test outputs)
            base = f"{base}/{d.path.name}"
        convo = reader.read(d, base, set())
        if convo is not None:
            builder.build(convo, built)
    for c in reader.counts.values():
        publish(c, PUBLISHED)
    if not built.trajectories:
        raise InputError(f"{FORMAT} import: no agent step with a model call in "
                         f"{len(docs)} file(s): nothing to replay")
    _prefixes(built, reader)
    assign_starts(built, opts["priority"], opts["tenant"], NS)
    return Imported(build_frame(built.trajectories), provenance(FORMAT, docs, reader.counts,
                                                                opts, skipped),
                    warnings(reader.counts, skipped))


def _referenced(docs: list[Doc], resolver: Resolver) -> set[int]:
    """Documents of the import that another one names (a sub-agent or a continuation)."""
    out: set[int] = set()
    for d in docs:
        nxt = resolver.by_file(d, d.data.get("continued_trajectory_ref"))
        if nxt is not None and nxt is not d:
            out.add(id(nxt))
        for s in d.steps:
            obs = s.get("observation") if isinstance(s, dict) else None
            results = obs.get("results") if isinstance(obs, dict) else None
            for r in results if isinstance(results, list) else []:
                refs = r.get("subagent_trajectory_ref") if isinstance(r, dict) else None
                for ref in refs if isinstance(refs, list) else []:
                    child = resolver.subagent(d, ref) if isinstance(ref, dict) else None
                    if child is not None and child is not d:
                        out.add(id(child))
    return out


IMPORTER = Format("atif", import_paths, many=True)
