"""Claude Code 2.1.x sub-agent links from `<session>/subagents/agent-<id>.meta.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.traces.importers import Imported, import_trace
from tests.unit.test_import_claude_code import FMT, SID, T, text, traj, use, valid

PROMPT = "Investigate the failing build and report what you find."


def _session(d: Path, call: str = "c0") -> Path:
    t = T().prompt(0, "why does the build fail?")
    t.say(1, "r1", [use(call, "Agent", subagent_type="general-purpose", prompt=PROMPT)],
          5, 0, 100, 9)
    t.result(60, call, "the cause")
    t.say(61, "r2", [text("done")], 5, 100, 40, 9)
    for line in t.lines:
        line["version"] = "2.1.197"
    return t.write(d / f"{SID}.jsonl")


def _agent(d: Path, aid: str, s0: float, spawn: str | None = None,
           meta: Any = None) -> None:
    """A sub-agent file (its first prompt always PROMPT); `spawn`: the id of the Agent call it
    makes (with PROMPT again); `meta`: its meta file's content (a dict, or raw text)."""
    k = T(agent=aid, side=True).prompt(s0, PROMPT)
    if spawn is None:
        k.say(s0 + 1, f"{aid}-r1", [text("found it")], 3, 0, 50, 5)
    else:
        k.say(s0 + 1, f"{aid}-r1", [use(spawn, "Agent", prompt=PROMPT)], 3, 0, 50, 5)
        k.result(s0 + 30, spawn, "found it")
        k.say(s0 + 31, f"{aid}-r2", [text("found it")], 3, 50, 10, 5)
    for line in k.lines:
        line["version"] = "2.1.197"
    sub = d / SID / "subagents"
    k.write(sub / f"agent-{aid}.jsonl")
    if meta is not None:
        raw = meta if isinstance(meta, str) else json.dumps(meta)
        (sub / f"agent-{aid}.meta.json").write_text(raw)


def _meta(call: str, depth: int) -> dict[str, Any]:
    return {"agentType": "general-purpose", "description": "dig", "toolUseId": call,
            "spawnDepth": depth}


def _parents(df: pd.DataFrame) -> dict[str, Any]:
    firsts = df.groupby("trajectory_id", sort=False).first()
    return {str(k): (None if pd.isna(v) else v) for k, v in firsts["parent_id"].items()}


def _totals(imp: Imported) -> dict[str, Any]:
    t: dict[str, Any] = imp.provenance.extra["totals"]
    return t


# A chain main -> e -> d -> c -> b -> a: the files sort in the reverse of the chain's order,
# and every agent's first prompt is the same, so matching prompts links the chain wrongly.
CHAIN = ["e", "d", "c", "b", "a"]


def _chain(d: Path, meta: bool = True) -> Path:
    session = _session(d)
    for depth, aid in enumerate(CHAIN, 1):
        child = CHAIN[depth] if depth < len(CHAIN) else None
        _agent(d, aid, depth * 2.0, f"c-{aid}" if child else None,
               _meta("c0" if depth == 1 else f"c-{CHAIN[depth - 2]}", depth) if meta else None)
    return session


def test_five_deep_chain_with_identical_prompts_links_by_meta(tmp_path: Path) -> None:
    imp = import_trace(FMT, _chain(tmp_path), {})
    df = valid(imp)
    want, parent = {SID: None}, SID
    for aid in CHAIN:
        want[f"{parent}/{aid}"] = parent
        parent = f"{parent}/{aid}"
    assert _parents(df) == want
    for tid, par in want.items():
        if par is not None:
            assert traj(df, tid).loc[0, "spawn_step"] == 1  # the parent's Agent call
    t = _totals(imp)
    assert (t["subagents_linked_by_meta"], t["subagents_linked_by_prompt"]) == (5, 0)
    assert (t["subagent_depth_mismatches"], t["subagents_unlinked"]) == (0, 0)
    assert not any("meta" in w for w in imp.warnings)


def test_same_chain_without_meta_is_guessed_and_counted(tmp_path: Path) -> None:
    """The older layout: no meta files, linked by first prompts, a guess that is counted (and
    here wrong: the main agent's call takes the first file with its prompt, the leaf)."""
    imp = import_trace(FMT, _chain(tmp_path, meta=False), {})
    df = valid(imp)
    assert _parents(df)[f"{SID}/a"] == SID
    t = _totals(imp)
    assert (t["subagents_linked_by_meta"], t["subagents_linked_by_prompt"]) == (0, 1)
    assert t["subagents_unlinked"] == 4
    assert any("subagents_linked_by_prompt" in n for n in imp.provenance.notes)


def test_depth_disagreement_is_counted_and_the_link_kept(tmp_path: Path) -> None:
    session = _session(tmp_path)
    _agent(tmp_path, "a1", 2, "c-a1", _meta("c0", 3))
    _agent(tmp_path, "a2", 4, None, _meta("c-a1", 4))
    imp = import_trace(FMT, session, {})
    assert _parents(valid(imp)) == {SID: None, f"{SID}/a1": SID, f"{SID}/a1/a2": f"{SID}/a1"}
    assert _totals(imp)["subagent_depth_mismatches"] == 2
    lines = [w for w in imp.warnings if "spawnDepth" in w]
    assert len(lines) == 1 and lines[0].startswith("2 sub-agents")


def test_meta_naming_no_call_leaves_the_agent_unlinked(tmp_path: Path) -> None:
    """A meta file whose toolUseId is in no transcript: a trajectory of its own, its own
    sub-agent still linked under it."""
    session = _session(tmp_path)
    _agent(tmp_path, "x1", 2, "c-x1", _meta("toolu_gone", 1))
    _agent(tmp_path, "x2", 4, None, _meta("c-x1", 2))
    imp = import_trace(FMT, session, {})
    df = valid(imp)
    assert _parents(df) == {SID: None, f"{SID}/x1": None, f"{SID}/x1/x2": f"{SID}/x1"}
    t = _totals(imp)
    assert (t["subagent_meta_parent_missing"], t["subagents_unlinked"]) == (1, 1)
    assert (t["subagents_linked_by_meta"], t["subagents_linked_by_prompt"]) == (1, 0)
    assert t["subagent_depth_mismatches"] == 0
    assert any("toolu_gone" in w for w in imp.warnings)
    # Only the sub-agents folder: the chain still hangs together under its first agent.
    (tmp_path / f"{SID}.jsonl").unlink()
    alone = import_trace(FMT, tmp_path / SID / "subagents", {})
    assert _parents(valid(alone)) == {f"{SID}/x1": None, f"{SID}/x1/x2": f"{SID}/x1"}


def test_malformed_meta_is_one_warning_and_falls_back_to_prompts(tmp_path: Path) -> None:
    session = _session(tmp_path)
    _agent(tmp_path, "m1", 2, "c-m1", "{not json")
    _agent(tmp_path, "m2", 4, "c-m2", {"spawnDepth": 2})
    _agent(tmp_path, "m3", 6, None, _meta("c-m2", True))
    imp = import_trace(FMT, session, {})
    df = valid(imp)
    assert _parents(df)[f"{SID}/m1"] == SID and len(_parents(df)) == 4
    t = _totals(imp)
    assert t["subagent_meta_malformed"] == 3
    assert (t["subagents_linked_by_meta"], t["subagents_linked_by_prompt"]) == (0, 3)
    lines = [w for w in imp.warnings if "meta files unusable" in w]
    assert len(lines) == 1 and "not valid JSON" in lines[0] and "toolUseId" in lines[0]


def test_meta_of_a_background_call_is_not_a_pause(tmp_path: Path) -> None:
    """An Agent call launched in the background does not hold its parent paused: the
    sub-agent its meta file names stays a trajectory of its own."""
    t = T().prompt(0, "go")
    t.say(1, "r1", [use("bg", "Agent", prompt=PROMPT)], 5, 0, 100, 9)
    t.result(1.5, "bg", "launched", tur={"status": "async_launched", "agentId": "b1"})
    t.say(3, "r2", [text("waiting")], 5, 100, 40, 9)
    session = t.write(tmp_path / f"{SID}.jsonl")
    _agent(tmp_path, "b1", 2, None, _meta("bg", 1))
    imp = import_trace(FMT, session, {})
    assert _parents(valid(imp)) == {SID: None, f"{SID}/b1": None}
    assert _totals(imp)["subagent_meta_parent_missing"] == 0
