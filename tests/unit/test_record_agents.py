"""Sub-agents named by their agent header (Claude Code's x-claude-code-agent-id): a chain of
nested sub-agents whose first calls are identical, through the recording proxy in front of a
fake Anthropic /v1/messages server, recorded as one conversation per agent, each linked to the
Agent call that spawned it, and imported as that tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.proxy.store import EVENTS, TEXT, read_recording
from harness.traces.importers import import_trace
from tests.unit.test_record_fakes import MESSAGES, Agent, Reply, recording
from tests.unit.test_record_import import col, raw_calls, traj, valid

AGENT_ID = "x-claude-code-agent-id"
TASK = "explore the repository and report"  # every agent's first user message


async def _chain(tmp_path: Path, main_id: str | None, header: bool = True,
                 **kw: Any) -> None:
    """Main calls Agent; its sub-agent calls Agent again; the grandchild answers; each goes
    on with its result. All three start with the same request; one session."""
    async with recording(tmp_path, **kw) as (fake, proxy, http):
        fake.replies.extend([
            Reply(text="", tools=[("toolu_m", "Agent", {"prompt": TASK})], prompt=100,
                  output=10),
            Reply(text="", tools=[("toolu_c", "Agent", {"prompt": TASK})], prompt=100,
                  output=11),
            Reply(text="nothing there", prompt=100, output=12),
            Reply(text="child done", prompt=130, output=13),
            Reply(text="main done", prompt=140, output=14),
        ])

        def agent(ident: str | None) -> Agent:
            a = Agent(http, proxy.url, MESSAGES, stream=True, session="sess-1",
                      headers={AGENT_ID: ident} if ident and header else {})
            a.user(TASK)
            return a

        main, child, grand = agent(main_id), agent("agent-1"), agent("agent-2")
        await main.call()
        await child.call()
        await grand.call()
        child.results({"toolu_c": "nothing there"})
        await child.call()
        main.results({"toolu_m": "child done"})
        await main.call()


@pytest.mark.parametrize("main_id", [None, "agent-main"], ids=["main-without-id",
                                                               "main-with-id"])
async def test_a_chain_of_sub_agents_with_identical_first_calls(tmp_path: Path,
                                                                main_id: str | None) -> None:
    await _chain(tmp_path, main_id)
    rec = tmp_path / "rec"
    calls = raw_calls(rec)
    assert [(c["conv"], c["how"]) for c in calls] == [
        ("c1", "new"), ("c2", "subagent"), ("c3", "subagent"), ("c2", "extends"),
        ("c1", "extends")]
    assert [c["parent"] for c in calls[1:3]] == [["c1", 1], ["c2", 2]]
    assert [c["link"] for c in calls[1:3]] == ["agent", "agent"]
    assert calls[1]["parent_tool"] == calls[0]["tool_calls"][0][0]
    assert calls[2]["parent_tool"] == calls[1]["tool_calls"][0][0]
    assert len({c["agent"] for c in calls[:3]}) == 3
    assert read_recording(rec).meta["agent_headers"] == [AGENT_ID]
    imp = import_trace("recording", rec, {})
    df = valid(imp)
    rid = read_recording(rec).meta["id"]
    main, child, grand = (traj(df, f"{rid}/c1"), traj(df, f"{rid}/c1/c2"),
                          traj(df, f"{rid}/c1/c2/c3"))
    assert df["trajectory_id"].nunique() == 3
    assert list(main["kind"]) == list(child["kind"]) == ["llm", "tool", "llm"]
    assert list(grand["kind"]) == ["llm"]
    for t in (main, child):
        assert col(t, "tool_class", "tool") == ["subagent"]
        assert col(t, "tool_name", "tool") == ["Agent"]
    assert child.loc[0, "parent_id"] == f"{rid}/c1" and child.loc[0, "spawn_step"] == 1
    assert grand.loc[0, "parent_id"] == f"{rid}/c1/c2" and grand.loc[0, "spawn_step"] == 1
    assert col(grand, "output_tokens", "llm") == [12]
    t = imp.provenance.extra["totals"]
    assert (t["subagents"], t["subagents_by_agent_id"], t["subagents_guessed"]) == (2, 2, 0)
    assert (t["subagents_orphaned"], t["cut"], t["conversations"]) == (0, 0, 3)


async def test_without_the_header_identical_first_calls_are_one_conversation(
        tmp_path: Path) -> None:
    """The behaviour without agent headers is as before: what the header now tells apart."""
    await _chain(tmp_path, None, header=False)
    calls = raw_calls(tmp_path / "rec")
    assert {c["conv"] for c in calls} == {"c1"}
    assert all(c["agent"] is None and c["link"] is None for c in calls)


async def test_another_agent_header_can_be_named(tmp_path: Path) -> None:
    await _chain(tmp_path, None, agent_headers=("x-other-agent",))
    assert {c["conv"] for c in raw_calls(tmp_path / "rec")} == {"c1"}  # not read


async def test_a_link_to_a_parent_never_seen_leaves_the_child_top_level(
        tmp_path: Path) -> None:
    await _chain(tmp_path, None)
    rec = tmp_path / "rec"
    lines = (rec / EVENTS).read_bytes().splitlines()
    out = []
    for raw in lines:
        obj = orjson.loads(raw)
        if obj.get("ev") == "call" and obj.get("parent") == ["c1", 1]:
            obj["parent"] = ["c9", 1]
        out.append(orjson.dumps(obj))
    (rec / EVENTS).write_bytes(b"\n".join(out) + b"\n")
    imp = import_trace("recording", rec, {})
    df = valid(imp)
    rid = read_recording(rec).meta["id"]
    assert set(df["trajectory_id"]) == {f"{rid}/c1", f"{rid}/c2", f"{rid}/c2/c3"}
    assert pd.isna(traj(df, f"{rid}/c2").loc[0, "parent_id"])
    # the Agent call whose sub-agent is not in the recording: a long job, not a spawn
    assert col(traj(df, f"{rid}/c1"), "tool_class", "tool") == ["long_job"]
    t = imp.provenance.extra["totals"]
    assert (t["subagents_orphaned"], t["subagents_by_agent_id"], t["subagents_guessed"]) == (
        1, 1, 0)


@pytest.mark.parametrize("keep_text", [False, True], ids=["hashed", "keep-text"])
async def test_the_agent_id_is_hashed_unless_text_is_kept(tmp_path: Path,
                                                          keep_text: bool) -> None:
    await _chain(tmp_path, None, keep_text=keep_text)
    rec = tmp_path / "rec"
    assert b"agent-1" not in (rec / EVENTS).read_bytes()
    if keep_text:
        texts = [orjson.loads(x) for x in (rec / TEXT).read_bytes().splitlines()]
        assert [x.get("agent") for x in texts] == [None, "agent-1", "agent-2", "agent-1", None]


async def test_parallel_agent_calls_each_link_a_sub_agent(tmp_path: Path) -> None:
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([
            Reply(text="", tools=[("toolu_1", "Agent", {"prompt": TASK}),
                                  ("toolu_2", "Task", {"prompt": TASK})]),
            Reply(text="a done"), Reply(text="b done"), Reply(text="all done")])
        main = Agent(http, proxy.url, MESSAGES, session="sess-1")
        kids = [Agent(http, proxy.url, MESSAGES, session="sess-1", headers={AGENT_ID: i})
                for i in ("a", "b")]
        for a in (main, *kids):
            a.user(TASK)
        await main.call()
        for k in kids:
            await k.call()
        main.results({"toolu_1": "a done", "toolu_2": "b done"})
        await main.call()
    calls = raw_calls(tmp_path / "rec")
    assert [c["parent"] for c in calls[1:3]] == [["c1", 1], ["c1", 1]]
    assert [c["parent_tool"] for c in calls[1:3]] == [r for r, _ in calls[0]["tool_calls"]]
    df = valid(import_trace("recording", tmp_path / "rec", {}))
    assert df["trajectory_id"].nunique() == 3
    assert (df["spawn_step"].dropna() == 1).sum() == 2


async def test_a_new_agent_id_with_no_spawn_waiting_is_a_conversation_of_its_own(
        tmp_path: Path) -> None:
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([Reply(text="", tools=[("toolu_1", "bash", {"cmd": "ls"})])])
        main = Agent(http, proxy.url, MESSAGES, session="sess-1")
        other = Agent(http, proxy.url, MESSAGES, session="sess-1", headers={AGENT_ID: "x"})
        for a in (main, other):
            a.user(TASK)
            await a.call()
    calls = raw_calls(tmp_path / "rec")
    assert [(c["conv"], c["how"], c["parent"]) for c in calls] == [("c1", "new", None),
                                                                   ("c2", "new", None)]


def test_a_bad_agent_header_name_is_one_line_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["record", "--upstream", "http://127.0.0.1:9", "--out",
                                    str(tmp_path / "rec"), "--agent-header", "bad header"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [
        "error: --agent-header 'bad header' is not an HTTP header name"]
    assert not (tmp_path / "rec").exists()
