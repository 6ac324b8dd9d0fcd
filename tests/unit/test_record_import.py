"""`harness traces import recording`: scripted agent sessions through the proxy (fake upstream,
real client requests), imported, with the trajectory's exact values checked against what the
test sent, what the fake answered and what the test itself measured."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.proxy.store import EVENTS, read_recording
from harness.traces.context import context_lengths
from harness.traces.importers import Imported, import_trace
from harness.traces.schema import read_provenance
from harness.traces.validate import check_frame
from tests.unit.test_record_fakes import CHAT, COMPLETIONS, MESSAGES, Agent, Reply, recording

FMT = "recording"


def valid(imp: Imported) -> pd.DataFrame:
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


def col(t: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return [None if pd.isna(v) else v for v in t[t["kind"] == kind][name]]


def raw_calls(folder: Path) -> list[dict[str, Any]]:
    return [e for _, e in read_recording(folder).events if e["ev"] == "call"]


async def _parent_with_subagent(tmp_path: Path, stream: bool) -> dict[str, float]:
    """Parent: parallel tools, a user turn, a Task whose sub-agent runs while it waits, then a
    tool it never gets back. Returns the client's own gaps (answer read -> next request)."""
    gaps: dict[str, float] = {}
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([
            Reply(text="", tools=[("call_a1", "bash", {"cmd": "ls"}),
                                  ("call_a2", "Read", {"path": "a.txt"})], prompt=100, output=20),
            Reply(text="done", prompt=150, output=10, cached=120),
            Reply(text="", tools=[("call_a3", "Task", {"prompt": "explore"})], prompt=180,
                  output=15),
            Reply(text="", tools=[("call_b1", "grep", {"q": "x"})], prompt=60, output=5),
            Reply(text="found it", prompt=80, output=6),
            Reply(text="", tools=[("call_a4", "wait_forever", {})], prompt=200, output=8),
        ])
        a = Agent(http, proxy.url, CHAT, stream)
        a.user("list the files")
        await a.call()
        await asyncio.sleep(0.15)
        a.results({"call_a1": "a.txt b.txt", "call_a2": "hello"})
        gaps["tools"] = await _timed(a)
        await asyncio.sleep(0.1)
        a.user("now delegate")
        gaps["user"] = await _timed(a)
        b = Agent(http, proxy.url, CHAT, stream, system="You are a sub-agent.")
        b.user("explore the tree")
        await b.call()
        await asyncio.sleep(0.05)
        b.results({"call_b1": "x.py"})
        gaps["grep"] = await _timed(b)
        gaps["b_end"] = b.ended_at
        await asyncio.sleep(0.05)
        a.results({"call_a3": "found it"})
        gaps["task"] = await _timed(a)
        gaps["after_b"] = a.sent_at - b.ended_at
    return gaps


async def _timed(agent: Agent) -> float:
    """Send the next call; the client's gap between the last answer and this request."""
    before = agent.ended_at
    await agent.call()
    return agent.sent_at - before


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_parent_tools_user_turn_subagent_and_abandoned(tmp_path: Path,
                                                             stream: bool) -> None:
    gaps = await _parent_with_subagent(tmp_path, stream)
    rec = tmp_path / "rec"
    imp = import_trace(FMT, rec, {})
    df = valid(imp)
    rid = read_recording(rec).meta["id"]
    parent, child = traj(df, f"{rid}/c1"), traj(df, f"{rid}/c1/c2")
    assert set(df["trajectory_id"]) == {f"{rid}/c1", f"{rid}/c1/c2"}
    assert list(parent["kind"]) == ["llm", "tool"] * 4
    assert col(parent, "input_tokens", "llm") == [100, 150 - 120, 180 - 160, 200 - 195]
    assert col(parent, "output_tokens", "llm") == [20, 10, 15, 8]
    assert col(parent, "keep_tokens", "llm") == [None] * 4
    assert col(parent, "tool_name", "tool") == ["bash+Read", "user", "Task", "wait_forever"]
    assert col(parent, "tool_class", "tool") == ["sandbox", "human", "subagent", "sandbox"]
    assert col(parent, "outcome", "tool") == ["ok", "ok", "ok", "abandoned"]
    lat = col(parent, "latency_s", "tool")
    # The proxy's wall times lie between the client's own gap and that plus the loopback's hops.
    assert gaps["tools"] <= lat[0] <= gaps["tools"] + 0.25
    assert gaps["user"] <= lat[1] <= gaps["user"] + 0.25
    assert gaps["after_b"] <= lat[2] + 0.005 and lat[2] <= gaps["after_b"] + 0.25
    assert lat[3] is None
    assert child.loc[0, "parent_id"] == f"{rid}/c1" and child.loc[0, "spawn_step"] == 5
    assert col(child, "input_tokens", "llm") == [60, 80 - 65]
    assert col(child, "tool_name", "tool") == ["grep"]
    assert gaps["grep"] <= col(child, "latency_s", "tool")[0] <= gaps["grep"] + 0.25
    llm = (parent["kind"] == "llm").to_numpy()
    assert context_lengths(parent).prompt[llm].tolist() == [100, 150, 180, 200]
    assert parent.loc[0, "start_s"] == 0.0 and set(child["start_s"]) == {0.0}
    # both first calls start with the same tools block: one prefix group
    calls = raw_calls(rec)
    first_a, first_b = calls[0], calls[3]
    assert first_a["blocks"][0][0] == first_b["blocks"][0][0]
    tools_tokens = first_a["blocks"][0][1]
    for t, first, prompt in ((parent, first_a, 100), (child, first_b, 60)):
        total = sum(b[1] for b in first["blocks"])
        assert t.loc[0, "prefix_group"] == f"recording/{first_a['blocks'][0][0][:12]}"
        assert t.loc[0, "prefix_tokens"] == round(tools_tokens * prompt / total)
    totals = imp.provenance.extra["totals"]
    assert (totals["calls"], totals["calls_ok"], totals["llm_steps"]) == (6, 6, 6)
    assert (totals["tool_calls"], totals["tool_results"], totals["exact_latency"]) == (5, 4, 4)
    assert totals["exact_latency_share"] == 0.8
    assert (totals["abandoned_tool_calls"], totals["subagents"], totals["human_pauses"]) == (
        1, 1, 1)
    assert (totals["subagent_steps"], totals["tool_pauses"], totals["conversations"]) == (
        1, 3, 2)
    assert totals["cached_tokens"] == 120 and totals["usage_exact"] == 6
    assert totals["prefix_groups"] == 1 and totals["extends"] == 4


async def test_anthropic_error_result_and_a_compaction_with_a_session(tmp_path: Path) -> None:
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([
            Reply(text="let me run it", tools=[("toolu_1", "Bash", {"command": "make"})],
                  prompt=300, output=12, cached=0),
            Reply(text="it failed", prompt=340, output=9, cached=310),
            Reply(text="summary noted", prompt=90, output=4, cached=40),
        ])
        a = Agent(http, proxy.url, MESSAGES, stream=True, session="sess-1")
        a.user("build the project please")
        await a.call()
        a.results({"toolu_1": "error: no rule"}, error=True)
        await a.call()
        a.messages = [{"role": "user", "content": "Summary: the build failed."}]
        await a.call()
    rec = tmp_path / "rec"
    imp = import_trace(FMT, rec, {})
    df = valid(imp)
    assert df["trajectory_id"].nunique() == 1
    assert col(df, "tool_class", "tool") == ["sandbox", "human"]
    assert col(df, "outcome", "tool") == ["error", "ok"]
    # the compacted context's new message is the user's: a user turn
    assert col(df, "tool_name", "tool") == ["Bash", "user"]
    third = raw_calls(rec)[2]
    assert (third["how"], third["prev"], third["shared"]) == ("cut", 2, 2)  # tools, system
    whole = [b[1] for b in read_blocks(rec, 3)]
    keep = round(sum(whole[:2]) * 90 / sum(whole))
    assert col(df, "keep_tokens", "llm") == [None, None, keep]
    assert col(df, "input_tokens", "llm") == [300, 340 - 312, 90 - keep]
    t = imp.provenance.extra["totals"]
    assert (t["cut"], t["cut_tokens_dropped"], t["human_pauses"]) == (1, 349 - keep, 1)
    assert t["cached_tokens"] == 350


def read_blocks(folder: Path, call_id: int) -> list[list[Any]]:
    """The whole request of a call, rebuilt here from the raw lines (prev + shared + new)."""
    by_id = {c["id"]: c for c in raw_calls(folder)}

    def request(cid: int) -> list[list[Any]]:
        c = by_id[cid]
        head = context(c["prev"])[:c["shared"]] if c["prev"] is not None else []
        return head + c["blocks"]

    def context(cid: int) -> list[list[Any]]:
        return request(cid)[:by_id[cid]["answer_from"]] + by_id[cid]["answer"]

    return request(call_id)


async def test_completions_continuation_timings_and_estimates(tmp_path: Path) -> None:
    prompt = "Once upon a time " * 40
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([Reply(text="there was a fox", prompt=160, output=4,
                                   usage="timings", cached=0),
                             Reply(text="The end", usage="none")])
        async with http.post(proxy.url + COMPLETIONS,
                             json={"prompt": prompt, "stream": True}) as r:
            await r.read()
        async with http.post(proxy.url + COMPLETIONS, json={
                "prompt": prompt + "there was a fox\nAnd then", "stream": True}) as r:
            await r.read()
    rec = tmp_path / "rec"
    calls = raw_calls(rec)
    assert calls[0]["usage"]["source"] == "timings"
    assert calls[1]["usage"]["source"] == "estimate" and calls[1]["how"] == "extends"
    est = calls[1]["usage"]["prompt"]
    # 4 words x 40, "there was a fox", "And then" by the token rule
    assert est == sum(b[1] for b in read_blocks(rec, 2)) == 160 + 4 + 2
    assert calls[1]["usage"]["output"] == 2  # two token-bearing events, two words
    imp = import_trace(FMT, rec, {})
    df = valid(imp)
    assert col(df, "input_tokens", "llm") == [160, est - 164]
    assert col(df, "keep_tokens", "llm") == [None, None]
    assert col(df, "tool_class", "tool") == ["human"]
    t = imp.provenance.extra["totals"]
    assert (t["usage_exact"], t["usage_estimated"]) == (1, 1)
    assert any("estimated" in w for w in imp.warnings)


async def test_cli_import_and_describe(tmp_path: Path) -> None:
    await _parent_with_subagent(tmp_path, True)
    out = tmp_path / "rec.parquet"
    runner = CliRunner()
    res = runner.invoke(main, ["traces", "import", FMT, str(tmp_path / "rec"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == FMT
    assert prov.extra["files"][0]["file"] == str(tmp_path / "rec")
    res = runner.invoke(main, ["traces", "describe", str(out)])
    assert res.exit_code == 0, res.output
    assert "sub-agents: 1 started by 1 subagent steps" in res.output
    assert "abandoned (never return): 1" in res.output


async def test_a_truncated_last_line_is_left_out(tmp_path: Path) -> None:
    await _parent_with_subagent(tmp_path, True)
    events = tmp_path / "rec" / EVENTS
    data = events.read_bytes()
    events.write_bytes(data[:-40])  # a killed proxy's half-written last line
    imp = import_trace(FMT, tmp_path / "rec", {})
    valid(imp)
    entry = imp.provenance.extra["files"][0]
    assert entry["truncated_last_line"] is True and entry["calls"] == 5
    assert any("cut short" in w for w in imp.warnings)


async def test_tool_calls_the_client_writes_and_their_subagent(tmp_path: Path) -> None:
    """A model that answers in text, an agent that writes the tool calls into its messages
    itself: the proxy sees each call only beside its result; the sub-agent that ran in such a
    pause is found by the importer."""
    async with recording(tmp_path) as (fake, proxy, http):
        fake.replies.extend([Reply(text="I will list", prompt=40, output=3),
                             Reply(text="delegating", prompt=60, output=2),
                             Reply(text="sub answer", prompt=20, output=2),
                             Reply(text="all done", prompt=90, output=2)])
        a = Agent(http, proxy.url, MESSAGES, stream=True)
        a.user("start")
        msg = await a.call()

        def own_call(cid: str, name: str) -> None:
            msg["content"].append({"type": "tool_use", "id": cid, "name": name, "input": {}})

        own_call("toolu_a", "Bash")
        await asyncio.sleep(0.05)
        a.results({"toolu_a": "listing"})
        gap_bash = await _timed(a)
        msg = a.messages[-1]
        own_call("toolu_b", "Task")
        await asyncio.sleep(0.1)  # the whole pause clearly longer than the wait after the child
        b = Agent(http, proxy.url, MESSAGES, stream=False, system="sub")
        b.user("look")
        await b.call()
        a.results({"toolu_b": "sub answer"})
        await asyncio.sleep(0.02)
        whole_pause = await _timed(a)
        after_b = a.sent_at - b.ended_at
    rec = tmp_path / "rec"
    calls = raw_calls(rec)
    assert [r[5] for r in calls[1]["results"]] == [1] and calls[1]["results"][0][1] == "Bash"
    assert (calls[2]["how"], calls[2]["parent"]) == ("new", None)  # the proxy could not know
    imp = import_trace(FMT, rec, {})
    df = valid(imp)
    rid = read_recording(rec).meta["id"]
    parent, child = traj(df, f"{rid}/c1"), traj(df, f"{rid}/c1/c2")
    assert col(parent, "tool_name", "tool") == ["Bash", "Task"]
    assert col(parent, "tool_class", "tool") == ["sandbox", "subagent"]
    lat = col(parent, "latency_s", "tool")
    assert gap_bash <= lat[0] <= gap_bash + 0.25
    assert after_b <= lat[1] + 0.005 and lat[1] <= after_b + 0.25 and lat[1] < whole_pause
    assert child.loc[0, "parent_id"] == f"{rid}/c1" and child.loc[0, "spawn_step"] == 3
    t = imp.provenance.extra["totals"]
    assert (t["client_tool_calls"], t["subagents_linked"], t["tool_results"]) == (2, 1, 2)
    assert t["exact_latency_share"] == 1.0
