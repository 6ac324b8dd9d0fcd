"""OpenAI-style chat logs: messages with `tool_calls` on assistant messages and `tool` results.

Structure comes from the messages; nothing here is timed, so latencies are synthetic: drawn from a
generator profile's tool class (option `profile`, default mixed-tools; option `seed`). An assistant
message is an LLM step. What follows it before the next assistant message is one pause: the tool
calls it made (parallel calls merged into one tool step, names joined with '+', latency the
slowest draw) or, when it made none, the user's reply (class `human`). Input tokens are the
messages appended since the previous call; every count is by the stated token rule.
Accepted files: a JSON list of conversations, one conversation, or JSONL (one per line); a
conversation is a list of messages or an object with `messages` (or tau-bench's `traj`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.limits import MAX_SECONDS
from harness.traces.generator import sample
from harness.traces.importers._common import (
    LLM,
    Tool,
    Trajectory,
    arrival_offsets,
    build_frame,
    opt_float,
    opt_int,
    take_options,
)
from harness.traces.importers.base import Format, Imported, one_path
from harness.traces.profiles import Profile, ToolClass, load_profile
from harness.traces.schema import Provenance
from harness.userfiles import TOKEN_RULE, count_tokens, read_json, read_jsonl

FORMAT = "openai-chat"
OPTIONS = {
    "profile": "mixed-tools",
    "seed": "0",
    "latency_class": "remote_read",  # profile class used when the profile lacks the step's class
    "default_class": "remote_read",  # class of a tool whose name matches no rule below
    "arrival_rate": "",
    "human_profile": "mixed-tools",  # times user replies when `profile` has no 'human' class
}
# Tool class from the first word of the tool's name (snake_case or camelCase), as data.
NAME_CLASSES: dict[str, str] = {
    **dict.fromkeys(("get", "search", "list", "find", "lookup", "read", "fetch", "query",
                     "check", "retrieve", "show", "view", "browse"), "remote_read"),
    **dict.fromkeys(("book", "cancel", "update", "modify", "create", "delete", "send",
                     "transfer", "set", "add", "remove", "write", "edit", "exchange", "return",
                     "place", "submit", "pay", "post", "put"), "mutating"),
    **dict.fromkeys(("calculate", "calculator", "think", "math", "compute"), "local_read"),
}
HUMAN = "human"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def tool_class_of(name: str, default: str) -> str:
    """Class of a tool by NAME_CLASSES on the first word of its name."""
    parts = re.split(r"[_\-.\s]+|(?<=[a-z])(?=[A-Z])", name.strip())
    return NAME_CLASSES.get(parts[0].lower() if parts else "", default)


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise InputError(f"{where}: 'content' must be a string, a list of parts or null")


def _calls(msg: dict[str, Any], where: str) -> list[tuple[str, str, int]]:
    """(id, name, tokens) of each tool call of an assistant message."""
    raw = msg.get("tool_calls") or []
    if not isinstance(raw, list):
        raise InputError(f"{where}: 'tool_calls' must be a list")
    out = []
    for k, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InputError(f"{where}: tool_calls[{k}] needs function.name")
        args = fn.get("arguments", "")
        args = args if isinstance(args, str) else json.dumps(args)
        out.append((str(tc.get("id", "")), fn["name"], count_tokens(fn["name"] + " " + args)))
    return out


class _Pause:
    """A pause being assembled; latency filled in after all draws."""

    def __init__(self, names: list[str], classes: list[str], error: bool) -> None:
        self.names, self.classes, self.error = names, classes, error


def _conversation(msgs: list[Any], where: str, default_class: str,
                  stats: dict[str, int]) -> list[LLM | _Pause]:
    steps: list[LLM | _Pause] = []
    pending = 0  # tokens appended since the last call
    calls: list[tuple[str, str, int]] | None = None  # calls of the last assistant message
    results: list[str] = []  # tool result texts since then
    users = 0
    for j, m in enumerate(msgs):
        w = f"{where} message {j}"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InputError(f"{w}: expected an object with a role in {', '.join(ROLES)}")
        role, text = m["role"], _text(m.get("content"), w)
        if role in ("tool", "function"):
            if not calls:
                raise InputError(f"{w}: tool result without a tool call before it")
            tcid = m.get("tool_call_id")
            if tcid and all(c[0] for c in calls) and str(tcid) not in {c[0] for c in calls}:
                raise InputError(f"{w}: tool_call_id {tcid!r} matches no call of the "
                                 "assistant message before it")
            results.append(text)
            pending += count_tokens(text)
        elif role != "assistant":
            users += calls is not None
            pending += count_tokens(text)
        else:
            mine = _calls(m, w)
            out = count_tokens(text) + sum(c[2] for c in mine)
            if calls is not None and not results and not users:  # nothing between: one call
                stats["merged_assistant"] += 1
                last = steps[-1]
                assert isinstance(last, LLM)
                last.output_tokens += out
                calls += mine
                continue
            if calls:
                if len(results) != len(calls):
                    stats["unanswered_calls"] += 1
                stats["user_folded"] += users > 0
                steps.append(_Pause([c[1] for c in calls],
                                    [tool_class_of(c[1], default_class) for c in calls],
                                    any(r.lstrip().lower().startswith("error") for r in results)))
            elif calls is not None:
                steps.append(_Pause(["user"], [HUMAN], False))
            if out < 1:
                stats["outputs_clamped"] += 1
            steps.append(LLM(pending, max(out, 1)))
            pending, calls, results, users = 0, mine, [], 0
    stats["trailing_dropped"] += calls is not None and (bool(results) or users > 0)
    return steps


def _conversations(src: Path) -> list[tuple[Any, Any]]:
    """(record, messages) per conversation in the file."""
    if src.suffix == ".jsonl":
        data: Any = [rec for _, rec in read_jsonl(src)]
    else:
        data = read_json(src)
        if isinstance(data, dict) or (isinstance(data, list) and data
                                      and isinstance(data[0], dict) and "role" in data[0]):
            data = [data]
    if not isinstance(data, list):
        raise InputError(f"{src}: expected a list of conversations")
    out = []
    for i, rec in enumerate(data):
        msgs = rec.get("messages", rec.get("traj")) if isinstance(rec, dict) else rec
        if not isinstance(msgs, list):
            raise InputError(f"{src}: conversation {i}: expected a list of messages "
                             "(or an object with 'messages' / 'traj')")
        out.append((rec, msgs))
    return out


def _traj_id(rec: Any, i: int, stem: str) -> str:
    if isinstance(rec, dict) and "task_id" in rec:
        return f"task{rec['task_id']}" + (f"-trial{rec['trial']}" if "trial" in rec else "")
    if isinstance(rec, dict) and isinstance(rec.get("id"), str | int):
        return str(rec["id"])
    return f"{stem}-{i}"


def _class_dist(profile: Profile, name: str, fallback: str,
                human_profile: str) -> tuple[str, ToolClass]:
    """(where it came from, the class) whose latency times steps of class `name`."""
    by_name = {c.name: c for c in profile.tool_classes}
    if name in by_name:
        return f"{profile.name}:{name}", by_name[name]
    if name == HUMAN:
        other = {c.name: c for c in load_profile(human_profile).tool_classes}
        if HUMAN in other:
            return f"{human_profile}:{HUMAN}", other[HUMAN]
        raise InputError(f"{FORMAT} import: neither profile {profile.name!r} nor "
                         f"human_profile {human_profile!r} has a {HUMAN!r} tool class")
    if fallback in by_name:
        return f"{profile.name}:{fallback}", by_name[fallback]
    raise InputError(f"{FORMAT} import: profile {profile.name!r} has no tool class {name!r} "
                     f"nor {fallback!r}; its classes: {', '.join(sorted(by_name)) or 'none'}")


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import a chat log (or a directory of *.json / *.jsonl logs) with synthetic latencies."""
    opts = take_options(options, FORMAT, OPTIONS)
    seed = opt_int(opts, "seed", FORMAT)
    rate = opt_float(opts, "arrival_rate", FORMAT)
    profile = load_profile(opts["profile"])
    files = (sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl"))
             if path.is_dir() else [path])
    if not files:
        raise InputError(f"{path}: no *.json or *.jsonl files")
    stats = dict.fromkeys(("merged_assistant", "unanswered_calls", "user_folded",
                           "outputs_clamped", "trailing_dropped", "empty"), 0)
    parsed = _parse(files, opts["default_class"], stats)
    if not parsed:
        raise InputError(f"{path}: no conversation with an assistant message")
    latencies = _Latencies(parsed, profile, opts, np.random.default_rng(seed))
    trajs = [Trajectory(tid, latencies.timed(steps), start_s=float(start),
                        priority=opts["priority"], tenant=opts["tenant"])
             for (tid, steps), start in zip(parsed, arrival_offsets(len(parsed), rate, seed),
                                            strict=True)]
    prov = _provenance(files, opts, profile, seed, rate, latencies.sources, len(parsed), stats)
    return Imported(build_frame(trajs), prov, _warnings(stats))


Parsed = list[tuple[str, list[LLM | _Pause]]]  # (trajectory id, steps) per conversation


def _parse(files: list[Path], default_class: str, stats: dict[str, int]) -> Parsed:
    """Every conversation with an assistant message, as steps (pauses not yet timed)."""
    parsed: Parsed = []
    seen: set[str] = set()
    for src in files:
        for i, (rec, msgs) in enumerate(_conversations(src)):
            tid = _traj_id(rec, i, src.stem)
            tid = f"{src.stem}/{tid}" if len(files) > 1 else tid
            if tid in seen:
                tid = f"{tid}#{i}"
            seen.add(tid)
            steps = _conversation(msgs, f"{src}: conversation {i}", default_class, stats)
            if not steps:
                stats["empty"] += 1
                continue
            parsed.append((tid, steps))
    return parsed


class _Latencies:
    """Synthetic latencies for the pauses, drawn per profile class in bulk (sorted class
    order: deterministic for a seed), handed out in step order."""

    def __init__(self, parsed: Parsed, profile: Profile, opts: dict[str, str],
                 rng: np.random.Generator) -> None:
        pauses = [s for _, steps in parsed for s in steps if isinstance(s, _Pause)]
        wanted = sorted({c for p in pauses for c in p.classes})
        # step class -> (profile:class it is timed by, that class)
        self.sources = {c: _class_dist(profile, c, opts["latency_class"], opts["human_profile"])
                        for c in wanted}
        self.dists = {c: tc for c, (_, tc) in self.sources.items()}
        self.draws = {c: iter(sample(self.dists[c].latency_s,
                                     sum(p.classes.count(c) for p in pauses), rng,
                                     MAX_SECONDS))
                      for c in wanted}

    def timed(self, steps: list[LLM | _Pause]) -> list[LLM | Tool]:
        """`steps` with each pause a Tool step of the next draws of its classes."""
        out: list[LLM | Tool] = []
        for s in steps:
            if isinstance(s, LLM):
                out.append(s)
                continue
            lat = max(float(next(self.draws[c])) for c in s.classes)
            cls = next((c for c in ("mutating", "remote_read") if c in s.classes), s.classes[0])
            dl = [d for d in (self.dists[c].deadline_s for c in s.classes) if d is not None]
            out.append(Tool("+".join(s.names), cls, round(lat, 6),
                            "error" if s.error else "ok", "mutating" in s.classes,
                            max(dl) if dl else None))
        return out


def _warnings(stats: dict[str, int]) -> list[str]:
    warnings = []
    if stats["unanswered_calls"]:
        warnings.append(f"{stats['unanswered_calls']} tool steps where the number of results "
                        "differs from the number of calls")
    if stats["outputs_clamped"]:
        warnings.append(f"{stats['outputs_clamped']} assistant messages of 0 tokens "
                        "raised to 1")
    if stats["empty"]:
        warnings.append(f"{stats['empty']} conversations without an assistant message skipped")
    return warnings


def _provenance(files: list[Path], opts: dict[str, str], profile: Profile, seed: int,
                rate: float | None, sources: dict[str, tuple[str, ToolClass]],
                conversations: int, stats: dict[str, int]) -> Provenance:
    used = {c: where for c, (where, _) in sources.items()}
    return Provenance(
        source_format=FORMAT,
        source_files=[str(f) for f in files],
        inferred={
            "input_tokens": f"messages since the previous call, counted by {TOKEN_RULE}",
            "output_tokens": "assistant content plus each tool call's name and arguments, "
                             "same rule (at least 1)",
            "latency_s": f"synthetic: drawn (seed {seed}) per step class from "
                         f"profile:class {used}; parallel calls take the slowest draw; the "
                         "profile's never-return and error rates are not applied",
            "deadline_s": "synthetic: deadline_s of the profile class the latency came from",
            "tool_class": "first word of the tool name via NAME_CLASSES, else "
                          f"{opts['default_class']!r}; a user reply is {HUMAN!r}; merged calls "
                          "show 'mutating' if any call is, then 'remote_read'",
            "tool_name": "the tool names joined with '+'; a user reply is 'user'",
            "outcome": "'error' when a result text starts with 'Error', else 'ok'",
            "mutating": "true when any merged call's class is 'mutating'",
            "start_s": (f"Poisson arrivals at {rate}/s, seed {seed}" if rate else
                        "0 for every conversation: the log has no times"),
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            "every latency is synthetic (the log records no times)",
            f"{stats['trailing_dropped']} conversations end with messages after the last "
            "assistant message: dropped, each trajectory ends at its last LLM call",
            f"{stats['merged_assistant']} assistant messages directly after another were "
            "merged into its LLM step",
            f"{stats['user_folded']} pauses had user messages as well as tool results: their "
            "tokens are in the next call's input",
        ],
        extra={"profile": profile.name, "seed": seed, "conversations": conversations, **stats},
    )


IMPORTER = Format("openai-chat", one_path(import_path), many=False)
