"""The Claude Code importer: hand-written transcripts with exact rows (every sub-agent layout),
bad input, and the public samples (skipped where absent) checked against counts made here from
the raw JSONL."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import InputError
from harness.traces.context import context_lengths
from harness.traces.importers import Imported, import_trace
from harness.traces.schema import COLUMNS
from harness.traces.validate import check_frame, validate_file
from tests.unit.fuzz_json import FUZZ_SETTINGS, imports_or_is_one_line, mutate

FMT = "claude-code"
SAMPLES = (Path(__file__).resolve().parents[3] / "shared" / "traces" / "agent-logs"
           / "claude-code")
SID = "11111111-2222-3333-4444-555555555555"


def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip(f"public samples {SAMPLES} are absent (they live outside the repository)")
    return SAMPLES


def at(s: float) -> str:
    t = datetime(2025, 10, 1, 10, 0, tzinfo=UTC) + timedelta(seconds=s)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class T:
    """A transcript being written: lines chained by parentUuid."""

    def __init__(self, sid: str = SID, agent: str | None = None, side: bool = False) -> None:
        self.lines: list[dict[str, Any]] = []
        self.sid, self.agent, self.side = sid, agent, side
        self.n = 0

    def add(self, kind: str, s: float, **kw: Any) -> T:
        self.n += 1
        parent = self.lines[-1].get("uuid") if self.lines else None
        d: dict[str, Any] = {"parentUuid": parent, "isSidechain": self.side,
                             "userType": "external", "cwd": "/w", "sessionId": self.sid,
                             "version": "2.0.50", "type": kind,
                             "uuid": f"{self.agent or 'm'}-{self.n}", "timestamp": at(s), **kw}
        if self.agent:
            d["agentId"] = self.agent
        self.lines.append(d)
        return self

    def prompt(self, s: float, text: str, **kw: Any) -> T:
        return self.add("user", s, message={"role": "user", "content": text}, **kw)

    def say(self, s: float, mid: str, blocks: list[dict[str, Any]], inp: int, read: int = 0,
            made: int = 0, out: int = 1) -> T:
        usage = {"input_tokens": inp, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": made, "output_tokens": out}
        return self.add("assistant", s, requestId=f"req-{mid}", message={
            "id": mid, "type": "message", "role": "assistant", "model": "claude-x",
            "content": blocks, "usage": usage})

    def result(self, s: float, tid: str, text: str = "ok", error: bool | None = None,
               tur: Any = None) -> T:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tid, "content": text}
        if error is not None:
            block["is_error"] = error
        kw = {} if tur is None else {"toolUseResult": tur}
        return self.add("user", s, message={"role": "user", "content": [block]}, **kw)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in self.lines))
        return path


def use(tid: str, name: str, **inp: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": inp}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def valid(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def col(df: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return [None if pd.isna(v) else v for v in df[df["kind"] == kind][name]]


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


def counts(imp: Imported, name: str | None = None) -> dict[str, Any]:
    files = imp.provenance.extra["files"]
    out: dict[str, Any] = files[0] if name is None else next(
        f for f in files if Path(f["file"]).name == name)
    return out


def basic() -> T:
    t = T().add("file-history-snapshot", 0).prompt(1, "fix the bug")
    t.say(3, "r1", [{"type": "thinking", "thinking": "hmm"}], 3, 1000, 2000, 5)
    t.say(3.5, "r1", [text("I will look")], 3, 1000, 2000, 5)
    t.say(4, "r1", [use("t1", "Glob", pattern="*.py")], 3, 1000, 2000, 5)
    t.say(4.2, "r1", [use("t2", "Bash", command="ls")], 3, 1000, 2000, 40)
    t.result(4.3, "t1", "a.py", tur={"durationMs": 12, "numFiles": 1})
    t.result(6.2, "t2", "a.py b.py", error=False, tur={"interrupted": False})
    t.say(8, "r2", [use("t3", "Read", file_path="a.py")], 5, 3000, 100, 20)
    t.result(8.5, "t3", "print(1)")
    t.say(10, "r3", [text("fixed")], 4, 3100, 60, 7)
    t.add("summary", 11, summary="A title", leafUuid="elsewhere")
    t.prompt(25, "thanks, now test it")
    t.say(27, "r4", [text("done")], 6, 3100, 200, 3)
    return t


def test_rows_split_response_parallel_calls_and_user_turn(tmp_path: Path) -> None:
    imp = import_trace(FMT, basic().write(tmp_path / "p" / f"{SID}.jsonl"), {})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool"] * 3 + ["llm"]
    assert set(df["trajectory_id"]) == {SID}
    llm = (df["kind"] == "llm").to_numpy()
    assert context_lengths(df).prompt[llm].tolist() == [3003, 3105, 3164, 3306]
    assert col(df, "output_tokens", "llm") == [40, 20, 7, 3]
    assert col(df, "input_tokens", "llm") == [3003, 62, 39, 135]
    assert col(df, "tool_name", "tool") == ["Glob+Bash", "Read", "user"]
    assert col(df, "tool_class", "tool") == ["sandbox", "local_read", "human"]
    # Glob's durationMs, Bash from the response's end (4.2 s) to its result; Read the same;
    # the user's prompt from the last model output (10 s).
    assert col(df, "latency_s", "tool") == pytest.approx([2.0, 0.5, 15.0])
    assert col(df, "mutating", "tool") == [True, False, False]
    assert df["prefix_group"].iloc[0] == "claude-code/main" and df["prefix_tokens"].iloc[0] == 1000
    c = counts(imp)
    assert (c["llm_calls"], c["tool_calls"], c["tool_results"], c["exact_durations"]) == (
        4, 3, 3, 1)
    assert (c["user_turns"], c["human_pauses"], c["tool_steps"], c["approximate_latency"]) == (
        2, 1, 2, 2)
    assert c["skipped_lines"] == {"file-history-snapshot": 1, "summary": 1}
    assert c["cached_tokens"] == 1000 + 3000 + 3100 + 3100


def test_output_raised_to_its_content_within_the_next_prompt(tmp_path: Path) -> None:
    t = T().prompt(1, "write it")
    words = "one two three four five six seven eight nine ten"
    t.say(2, "r1", [use("t1", "Write", file_path="x", content=words)], 10, 0, 0, 1)
    t.result(3, "t1", "ok")
    t.say(4, "r2", [text("done")], 30, 0, 0, 2)
    imp = import_trace(FMT, t.write(tmp_path / "s.jsonl"), {})
    df = valid(imp)
    # Counted content: 29 tokens; the next prompt grew by 20, of which the result is 1.
    assert col(df, "output_tokens", "llm") == [19, 2]
    assert col(df, "input_tokens", "llm") == [10, 1]
    assert (counts(imp)["output_raised"], counts(imp)["output_raised_tokens"]) == (1, 18)


def test_compaction_clear_and_thinking_not_resent(tmp_path: Path) -> None:
    t = T().prompt(1, "go")
    t.say(2, "r1", [use("t1", "Bash", command="x")], 10, 5000, 0, 300)
    t.result(3, "t1", "out")
    t.say(4, "r2", [text("ok")], 10, 5100, 0, 50)  # 5110 < 5010 + 300: output not resent
    t.add("system", 5, subtype="compact_boundary", content="Conversation compacted")
    t.add("user", 5.1, isCompactSummary=True,
          message={"role": "user", "content": "This session is being continued ..."})
    t.prompt(6, "continue")
    t.say(7, "r3", [text("ok")], 10, 4000, 600, 20)
    t.prompt(8, "<command-name>/clear</command-name>\n<command-message>clear</command-message>")
    t.prompt(9, "new task")
    t.say(10, "r4", [text("ok")], 10, 3900, 100, 20)
    imp = import_trace(FMT, t.write(tmp_path / "s.jsonl"), {})
    df = valid(imp)
    assert col(df, "keep_tokens", "llm") == [None, 5100, 4000, 3900]
    c = counts(imp)
    assert (c["output_not_resent"], c["compactions"], c["clears"]) == (1, 1, 1)
    assert c["user_turns"] == 3


def test_subagent_in_its_own_file(tmp_path: Path) -> None:
    """2.1.x: <session>/subagents/agent-<id>.jsonl, the Task result naming its agentId."""
    t = T().prompt(0, "explore")
    t.say(2, "r1", [use("task1", "Task", subagent_type="Explore", prompt="look around")],
          5, 0, 9000, 50)
    t.result(40, "task1", "found it", tur={"status": "completed", "agentId": "a1",
                                          "totalDurationMs": 37000})
    t.say(42, "r2", [text("summary")], 5, 9000, 100, 30)
    session = t.write(tmp_path / "proj" / f"{SID}.jsonl")
    kid = T(agent="a1", side=True).prompt(2.5, "look around")
    kid.say(4, "k1", [use("k-t1", "Grep", pattern="x")], 3, 0, 4000, 20)
    kid.result(4.6, "k-t1", "x.py", tur={"durationMs": 600})
    kid.say(36, "k2", [text("found it")], 3, 4000, 60, 10)
    kid.write(tmp_path / "proj" / SID / "subagents" / "agent-a1.jsonl")
    imp = import_trace(FMT, session, {})
    df = valid(imp)
    assert list(dict.fromkeys(df["trajectory_id"])) == [SID, f"{SID}/a1"]
    parent = traj(df, SID)
    assert col(parent, "tool_class", "tool") == ["subagent"]
    assert col(parent, "tool_name", "tool") == ["Explore"]
    assert col(parent, "latency_s", "tool") == [4.0]  # result at 40 s, the child ended at 36 s
    child = traj(df, f"{SID}/a1")
    assert child.loc[0, "parent_id"] == SID and child.loc[0, "spawn_step"] == 1
    assert child.loc[0, "prefix_group"] is None  # its first call had no cache hit
    assert col(child, "latency_s", "tool") == [0.6]
    t2 = imp.provenance.extra["totals"]
    assert (t2["files"], t2["subagents"], t2["subagent_calls"], t2["subagent_steps"]) == (
        2, 1, 1, 1)
    assert counts(imp, "agent-a1.jsonl")["subagents"] == 1
    assert counts(imp, f"{SID}.jsonl")["exact_durations"] == 1


def test_agent_files_beside_the_session_and_warmups(tmp_path: Path) -> None:
    """2.0.x: agent-*.jsonl beside the session, linked by the Task's prompt; warm-ups."""
    d = tmp_path / "proj"
    t = T().prompt(10, "plan")
    t.say(12, "r1", [use("task1", "Task", prompt="make a plan")], 5, 100, 200, 9)
    t.result(30, "task1", "the plan", tur={"totalDurationMs": 17000})
    t.say(31, "r2", [text("ok")], 5, 300, 50, 9)
    session = t.write(d / f"{SID}.jsonl")
    kid = T(agent="b2", side=True).prompt(12.5, "make a plan")
    kid.say(14, "k1", [text("plan")], 3, 0, 500, 5)
    kid.write(d / "agent-b2.jsonl")
    warm = T(agent="w1", side=True).prompt(1, "Warmup")
    warm.say(2, "w", [text("ready")], 400, 0, 0, 30)
    warm.write(d / "agent-w1.jsonl")
    other = T(sid="other", agent="o1", side=True).prompt(1, "Warmup")
    other.say(2, "o", [text("ready")], 400, 0, 0, 30)
    other.write(d / "agent-o1.jsonl")
    imp = import_trace(FMT, session, {})
    df = valid(imp)
    assert list(dict.fromkeys(df["trajectory_id"])) == [SID, f"{SID}/b2", f"{SID}/w1"]
    assert traj(df, f"{SID}/b2").loc[0, "parent_id"] == SID
    warm_rows = traj(df, f"{SID}/w1")
    assert warm_rows["parent_id"].isna().all() and warm_rows.loc[0, "start_s"] == 0.0
    assert traj(df, SID).loc[0, "start_s"] == 9.0
    assert counts(imp, "agent-w1.jsonl")["warmups"] == 1
    assert "agent-o1.jsonl" not in {Path(f).name for f in imp.provenance.source_files}
    skipped = import_trace(FMT, session, {"warmups": "skip"})
    assert f"{SID}/w1" not in set(valid(skipped)["trajectory_id"])
    assert skipped.provenance.extra["totals"]["warmups_skipped"] == 1
    whole = import_trace(FMT, d, {})  # the folder: every session and agent file in it
    assert set(valid(whole)["trajectory_id"]) == {SID, f"{SID}/b2", f"{SID}/w1", "other/o1"}
    with pytest.raises(InputError, match="option warmups must be keep or skip"):
        import_trace(FMT, session, {"warmups": "no"})


def test_inline_sidechains_of_parallel_tasks(tmp_path: Path) -> None:
    """1.0.x: the sub-agents' lines are isSidechain lines of the session file, no agentId."""
    t = T().prompt(0, "split it")
    t.say(1, "r1", [use("tA", "Task", prompt="part A")], 5, 0, 100, 9)
    t.say(1.5, "r1", [use("tB", "Task", prompt="part B")], 5, 0, 100, 19)
    for name, s0 in (("A", 2.0), ("B", 2.1)):
        side = T(side=True)
        side.n = 100 if name == "A" else 200
        side.prompt(s0, f"part {name}")
        side.say(s0 + 1, f"s{name}1", [use(f"s{name}-t", "Read", file_path="f")], 3, 0, 50, 5)
        side.result(s0 + 1.2, f"s{name}-t", "x")
        side.say(s0 + (5 if name == "A" else 9), f"s{name}2", [text("ok")], 3, 50, 10, 5)
        t.lines += side.lines
    t.result(7.5, "tA", "A done", tur={"totalDurationMs": 6000})
    t.lines[-1]["parentUuid"] = "m-3"
    t.result(11.5, "tB", "B done", tur={"totalDurationMs": 10000})
    t.say(12, "r2", [text("both done")], 5, 100, 40, 9)
    imp = import_trace(FMT, t.write(tmp_path / "s.jsonl"), {})
    df = valid(imp)
    kids = [k for k in dict.fromkeys(df["trajectory_id"]) if k != SID]
    assert kids == [f"{SID}/tA", f"{SID}/tB"]
    assert set(df[df["parent_id"] == SID]["spawn_step"]) == {1}
    # Both children end (7.0 s, 11.1 s) before their results; the pause ends at 11.5 s.
    assert col(traj(df, SID), "latency_s", "tool") == pytest.approx([0.4])
    c = counts(imp)
    assert (c["llm_calls"], c["subagents"], c["subagent_calls"], c["tool_calls"]) == (6, 2, 2, 4)
    assert c["exact_durations"] == 2


def test_subagent_only_in_progress_lines(tmp_path: Path) -> None:
    """2.1.x without the sub-agent's file: progress lines copy its messages."""
    t = T().prompt(0, "plan")
    t.say(1, "r1", [use("task1", "Task", subagent_type="Plan", prompt="p")], 5, 0, 100, 9)
    copies = T(side=False)
    copies.prompt(1.1, "p")
    copies.say(2, "k1", [use("k-t", "Read", file_path="f")], 3, 200, 50, 5)
    copies.result(2.3, "k-t", "file text here")
    for c in copies.lines:
        t.add("progress", 0, parentToolUseID="task1", toolUseID="agent_msg_1",
              data={"type": "agent_progress", "agentId": "p1", "prompt": "p",
                    "message": {"type": c["type"], "message": c["message"],
                                "uuid": c["uuid"], "timestamp": c["timestamp"]}})
    t.add("progress", 0, data={"type": "hook_progress"}, parentToolUseID="x")
    t.result(9, "task1", "the final plan in six words", tur={"agentId": "p1",
                                                          "totalDurationMs": 8000})
    t.say(10, "r2", [text("ok")], 5, 100, 60, 9)
    imp = import_trace(FMT, t.write(tmp_path / "s.jsonl"), {})
    df = valid(imp)
    child = traj(df, f"{SID}/p1")
    assert list(child["kind"]) == ["llm", "tool", "llm"]
    # Its last response (not copied) is added: the results appended, the answer generated.
    assert col(child, "input_tokens", "llm") == [253, 3]
    assert col(child, "output_tokens", "llm") == [5, 6]
    assert child.loc[0, "prefix_group"] == "claude-code/Plan"
    assert col(traj(df, SID), "latency_s", "tool") == [0.0]
    c = counts(imp)
    assert (c["llm_calls"], c["llm_calls_estimated"], c["subagents"]) == (3, 1, 1)
    assert c["skipped_lines"] == {"progress:hook_progress": 1}
    assert imp.provenance.extra["totals"]["subagent_final_calls_added"] == 1


def test_rejected_call_ends_the_trajectory_and_the_session_continues(tmp_path: Path) -> None:
    t = T().prompt(0, "run it")
    t.say(1, "r1", [use("t1", "Bash", command="rm x")], 5, 0, 1000, 9)
    t.result(4, "t1", "The user doesn't want to proceed with this tool use.", error=True,
             tur="User rejected tool use")
    t.add("user", 4, message={"role": "user", "content": [
        text("[Request interrupted by user for tool use]")]})
    t.prompt(20, "do something else")
    t.say(21, "r2", [use("t2", "Task", prompt="nobody has it")], 5, 900, 200, 9)
    t.result(50, "t2", "done", tur={"totalDurationMs": 28500})
    t.say(51, "r3", [use("t3", "Bash", command="sleep 100")], 5, 1100, 40, 9)
    imp = import_trace(FMT, t.write(tmp_path / "s.jsonl"), {})
    df = valid(imp)
    first, rest = traj(df, SID), traj(df, f"{SID}~2")
    assert col(first, "outcome", "tool") == ["abandoned"]
    assert col(first, "latency_s", "tool") == [None]
    assert col(rest, "input_tokens", "llm")[0] == 1105  # a new context: the whole prompt
    # The Task's sub-agent is not in the input: a long job of its stated duration; the last
    # call has no result (the log ends): it never returns.
    assert col(rest, "tool_class", "tool") == ["long_job", "sandbox"]
    assert col(rest, "latency_s", "tool") == [28.5, None]
    assert rest.loc[0, "start_s"] == 20.0
    c = counts(imp)
    assert (c["continuations"], c["abandoned_calls"], c["subagent_calls"]) == (1, 2, 1)


def test_interrupted_tool_and_background_subagent(tmp_path: Path) -> None:
    t = T().prompt(0, "start")
    t.say(1, "r1", [use("bg", "Task", prompt="watch", run_in_background=True)], 5, 0, 900, 9)
    t.result(1.2, "bg", "launched", tur={"status": "async_launched", "agentId": "z9"})
    t.say(2, "r2", [use("t1", "Bash", command="make")], 5, 900, 20, 9)
    t.result(9, "t1", "[Request interrupted by user for tool use]", error=True)
    session = t.write(tmp_path / "p" / f"{SID}.jsonl")
    kid = T(agent="z9", side=True).prompt(1.3, "watch")
    kid.say(3, "k1", [text("watching")], 3, 0, 400, 5)
    kid.write(tmp_path / "p" / SID / "subagents" / "agent-z9.jsonl")
    imp = import_trace(FMT, session, {})
    df = valid(imp)
    parent = traj(df, SID)
    assert col(parent, "tool_class", "tool") == ["long_job", "sandbox"]
    assert col(parent, "latency_s", "tool") == pytest.approx([0.2, None])
    assert col(parent, "outcome", "tool") == ["ok", "abandoned"]
    assert traj(df, f"{SID}/z9")["parent_id"].isna().all()  # ran beside, not waited for
    t2 = imp.provenance.extra["totals"]
    assert (t2["async_subagent_calls"], t2["subagents_unlinked"]) == (1, 1)


def test_cli_import_and_describe(tmp_path: Path) -> None:
    src = basic().write(tmp_path / "s.jsonl")
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert validate_file(out) == []
    r = CliRunner().invoke(main, ["traces", "describe", str(out)])
    assert r.exit_code == 0, r.output
    assert "exact_latency_share" in r.output and "user_turns" in r.output


# ---------------------------------------------------------------- bad input


def _bad(lines: list[Any]) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


GOOD = basic().lines


@pytest.mark.parametrize("text_, where", [
    ("{nope\n", "line 1: not valid JSON"),
    (_bad([[1]]), "line 1: expected a JSON object"),
    (_bad([{"type": 5}]), "line 1: type must be a string"),
    (_bad([{**GOOD[1], "message": "hi"}]), "line 1: message must be an object"),
    (_bad([{**GOOD[1], "timestamp": "soon"}]), "line 1: 'timestamp' must be an ISO 8601"),
    (_bad([{**GOOD[2], "message": {**GOOD[2]["message"], "usage": {"input_tokens": -1}}}]),
     "line 1: message.usage: 'input_tokens' must be an integer >= 0"),
    (_bad([{**GOOD[2], "message": {**GOOD[2]["message"], "usage": [1]}}]),
     "line 1: message.usage must be an object"),
    (_bad([{**GOOD[4], "message": {**GOOD[4]["message"], "content": [{"type": "tool_use"}]}}]),
     "line 1: message.content: a tool_use needs a string 'id' and 'name'"),
    (_bad([GOOD[4], {**GOOD[6], "toolUseResult": {"durationMs": "fast"}}]),
     "line 2: toolUseResult: 'durationMs' must be a duration >= 0"),
    (_bad([{"type": "progress", "data": {"type": "agent_progress", "message": {
        "type": "user", "message": 3}}}]), "line 1: data.message.message must be an object"),
])
def test_malformed_is_one_line(tmp_path: Path, text_: str, where: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(text_)
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    msg = str(exc.value)
    assert msg.startswith(str(p)) and where in msg and "\n" not in msg


def test_nothing_to_import(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no model response"):
        import_trace(FMT, T().prompt(0, "hi").write(tmp_path / "s.jsonl"), {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no \*\.jsonl transcripts"):
        import_trace(FMT, tmp_path / "empty", {})


@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_transcript_imports_or_is_one_line(tmp_path: Path, data: st.DataObject) -> None:
    doc = mutate(copy.deepcopy(GOOD), data, most=4)
    p = tmp_path / "f.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in doc))
    imports_or_is_one_line(FMT, p)


# ---------------------------------------------------------------- the public samples


def _messages(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(line, conversation) of every user/assistant message of a file, progress copies
    included: the conversation is the agentId, an inline sidechain's first uuid, or main."""
    out: list[tuple[dict[str, Any], str]] = []
    root: dict[str, str] = {}
    for r in rows:
        if r.get("type") == "progress" and r["data"].get("type") == "agent_progress":
            out.append((r["data"]["message"], "progress:" + r["data"]["agentId"]))
        elif r.get("type") in ("user", "assistant"):
            if not r.get("isSidechain"):
                out.append((r, "main"))
                continue
            conv = r.get("agentId") or root.get(r.get("parentUuid") or "", r["uuid"])
            root[r["uuid"]] = conv
            out.append((r, conv))
    return out


def _raw_counts(path: Path) -> dict[str, Any]:
    """An importer-free account of a transcript file: responses and their prompts per
    conversation, tool calls, results, exact durations, sub-agents, user turns."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    msgs = _messages(rows)
    prompts: dict[str, dict[str, int]] = {}
    uses: set[str] = set()
    results: set[str] = set()
    exact: set[str] = set()
    turns, waiting = 0, False
    for r, conv in msgs:
        m = r["message"]
        content = m["content"] if isinstance(m.get("content"), list) else []
        if r["type"] == "assistant":
            u = m["usage"]
            prompts.setdefault(conv, {})[m["id"]] = (
                u["input_tokens"] + u["cache_read_input_tokens"]
                + u["cache_creation_input_tokens"])
            uses |= {b["id"] for b in content if b.get("type") == "tool_use"}
            if conv == "main" and waiting:
                turns, waiting = turns + 1, False
            continue
        ids = [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
        results |= set(ids)
        tur = r.get("toolUseResult")
        if isinstance(tur, dict) and len(ids) == 1 and any(
                k in tur for k in ("durationMs", "totalDurationMs", "durationSeconds")):
            exact.add(ids[0])
        said = m["content"] if isinstance(m.get("content"), str) else " ".join(
            b.get("text", "") for b in content if b.get("type") == "text")
        if conv == "main" and said and not ids and not r.get("isMeta") \
                and not said.startswith("[Request interrupted"):
            waiting = True
    sides = {c for _, c in msgs if c != "main"}
    return {"llm": sum(len(v) for v in prompts.values()), "calls": len(uses),
            "results": len(uses & results), "exact": len(uses & exact), "turns": turns,
            "subagents": len(sides), "prompts": prompts,
            "session": next((r["sessionId"] for r in rows if r.get("sessionId")), "")}


# The reference counts of the samples' README: LLM calls, tool calls, with result, exact,
# sub-agent conversations in the file, user turns.
REFERENCE = {
    "7f2abd2d-7cfc-4447-9ddd-3ca8d14e02e9.jsonl": (6, 4, 4, 0, 0, 2),
    "agent-0c4c3cf8.jsonl": (1, 0, 0, 0, 1, 0),
    "agent-90fa40b6.jsonl": (1, 0, 0, 0, 1, 0),
    "1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl": (7, 12, 12, 6, 0, 1),
    "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": (170, 167, 167, 7, 5, 2),
    "incremental-simple/turn-2.jsonl": (6, 2, 2, 2, 0, 4),
    "incremental-subagents/turn-2.jsonl": (11, 14, 14, 3, 0, 1),
    "agent-a485154.jsonl": (6, 20, 20, 3, 1, 0),
    "session-196820da.jsonl": (47, 65, 65, 2, 0, 13),
    "short.jsonl": (1, 2, 2, 0, 0, 1),
    "subagent.jsonl": (17, 25, 25, 8, 1, 2),
}


def _ref_key(path: Path) -> str:
    return path.name if path.name != "turn-2.jsonl" else f"{path.parent.name}/{path.name}"


def test_public_samples_against_their_raw_counts() -> None:
    base = samples()
    imp = import_trace(FMT, base, {})
    df = valid(imp)
    per = {Path(f["file"]): f for f in imp.provenance.extra["files"]}
    paths = sorted(base.rglob("*.jsonl"))
    assert sorted(per) == paths and {_ref_key(p) for p in paths} == set(REFERENCE)
    llm = (df["kind"] == "llm").to_numpy()
    prompt = context_lengths(df).prompt
    for p in paths:
        raw, f = _raw_counts(p), per[p]
        got = (f["llm_calls"], f["tool_calls"], f["tool_results"], f["exact_durations"],
               f["subagents"], f["user_turns"])
        assert got == (raw["llm"], raw["calls"], raw["results"], raw["exact"],
                       raw["subagents"], raw["turns"]), p
        assert got == REFERENCE[_ref_key(p)], p
        main = list(raw["prompts"].get("main", {}).values())
        if main:  # every prompt of the session is replayed exactly
            rows = (df["trajectory_id"] == f["id"]).to_numpy()
            if not rows.any():  # a second snapshot of a session already imported
                rows = (df["trajectory_id"] == f"{f['id']}-2").to_numpy()
            assert prompt[llm & rows].tolist() == main, p
    t = imp.provenance.extra["totals"]
    assert (t["files"], t["sessions"], t["continuations"]) == (11, 8, 0)
    # Sub-agents wired to the call that started them: five inline (1.0.x), one in its own
    # file (2.1.x), one from progress copies; the two warm-ups are roots of their own.
    children = df[df["parent_id"].notna()].groupby("trajectory_id")["parent_id"].first()
    assert len(children) == 7 and t["warmups"] == 2 and t["subagents_unlinked"] == 0
    assert t["subagent_steps"] == 4 and t["subagent_final_calls_added"] == 1
    kid = "e9fb405b-169f-40eb-9396-7e75076f045d/a485154"
    want = list(_raw_counts(next(p for p in paths if p.name == "agent-a485154.jsonl"))[
        "prompts"]["a485154"].values())
    assert prompt[llm & (df["trajectory_id"] == kid).to_numpy()].tolist() == want
    assert 0 < t["exact_latency_share"] < 1 and t["abandoned_calls"] == 2
