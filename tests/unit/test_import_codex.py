"""The Codex importer: hand-written rollouts with exact rows, bad input, and the public samples
(skipped where absent) checked against counts made here from the raw JSONL."""

from __future__ import annotations

import copy
import json
import re
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
from harness.traces.importers import Imported, import_trace, import_traces
from harness.traces.schema import COLUMNS, read_provenance
from harness.traces.validate import check_frame, validate_file
from tests.unit.fuzz_json import FUZZ_SETTINGS, imports_or_is_one_line, mutate

FMT = "codex"
SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "agent-logs" / "codex"
T0 = "2026-01-02T10:00:00"


def samples() -> list[Path]:
    """Every rollout of the public samples, or skip the test with the reason."""
    if not SAMPLES.is_dir():
        pytest.skip(f"public samples {SAMPLES} are absent (they live outside the repository)")
    return sorted(SAMPLES.rglob("*.jsonl"))


def at(s: float) -> str:
    """A timestamp `s` seconds after T0, as Codex writes them."""
    t = datetime.fromisoformat(T0).replace(tzinfo=UTC) + timedelta(seconds=s)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def line(s: float, kind: str, **payload: Any) -> dict[str, Any]:
    return {"timestamp": at(s), "type": kind, "payload": payload}


def meta(sid: str = "sess-1", **extra: Any) -> dict[str, Any]:
    return line(0, "session_meta", id=sid, timestamp=at(0), cwd="/w", originator="codex_cli_rs",
                cli_version="0.99.0", **extra)


def user(s: float, text: str = "do it") -> list[dict[str, Any]]:
    return [line(s, "response_item", type="message", role="user",
                 content=[{"type": "input_text", "text": text}]),
            line(s, "event_msg", type="user_message", message=text)]


def call(s: float, cid: str, name: str = "exec_command", args: str = '{"cmd":"ls"}'
         ) -> dict[str, Any]:
    return line(s, "response_item", type="function_call", name=name, arguments=args,
                call_id=cid)


def output(s: float, cid: str, wall: float | None = None, code: int = 0,
           body: str = "a b c") -> dict[str, Any]:
    head = f"Chunk ID: x\nWall time: {wall} seconds\n" if wall is not None else ""
    return line(s, "response_item", type="function_call_output", call_id=cid,
                output=f"{head}Process exited with code {code}\nOutput:\n{body}")


def usage(s: float, inp: int, out: int, cached: int = 0,
          total: tuple[int, int, int] | None = None) -> dict[str, Any]:
    last = {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out,
            "reasoning_output_tokens": 0, "total_tokens": inp + out}
    info: dict[str, Any] = {"last_token_usage": last, "model_context_window": 100000}
    if total is not None:
        info["total_token_usage"] = {"input_tokens": total[0], "cached_input_tokens": total[1],
                                     "output_tokens": total[2]}
    return line(s, "event_msg", type="token_count", info=info, rate_limits=None)


def answer(s: float, text: str = "done") -> dict[str, Any]:
    return line(s, "response_item", type="message", role="assistant",
                content=[{"type": "output_text", "text": text}])


def write(tmp_path: Path, lines: list[dict[str, Any]], name: str = "rollout-a.jsonl") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / name
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def valid(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def col(df: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return [None if pd.isna(v) else v for v in df[df["kind"] == kind][name]]


def counts(imp: Imported, i: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = imp.provenance.extra["files"][i]
    return out


BASIC = [
    meta(), *user(1), call(3, "c1"), usage(3.5, 1000, 50, total=(1000, 0, 50)),
    output(5, "c1", wall=1.25),
    usage(5.1, 1000, 50, total=(1000, 0, 50)),  # a repeated snapshot: not a new response
    call(7, "c2", args='{"cmd":"cat a"}'), call(7.1, "c3", args='{"cmd":"cat b"}'),
    usage(7.2, 1100, 30, cached=1000, total=(2100, 1000, 80)),
    output(8, "c2", wall=0.5), output(9.7, "c3"),  # c3: no wall time, timed from the log
    answer(11), usage(11.5, 1300, 40, cached=1100, total=(3400, 2100, 120)),
    *user(20, "next"), answer(22), usage(22.5, 1400, 10, cached=1300, total=(4800, 3400, 130)),
]


def test_rows_usage_and_latencies(tmp_path: Path) -> None:
    imp = import_trace(FMT, write(tmp_path, BASIC), {})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool"] * 3 + ["llm"]
    assert set(df["trajectory_id"]) == {"sess-1"} and (df["start_s"] == 0).all()
    llm = (df["kind"] == "llm").to_numpy()
    assert context_lengths(df).prompt[llm].tolist() == [1000, 1100, 1300, 1400]
    assert col(df, "input_tokens", "llm") == [1000, 50, 170, 60]
    assert col(df, "output_tokens", "llm") == [50, 30, 40, 10]
    assert col(df, "keep_tokens", "llm") == [None] * 4
    assert col(df, "tool_name", "tool") == ["exec_command", "exec_command+exec_command", "user"]
    assert col(df, "tool_class", "tool") == ["sandbox", "sandbox", "human"]
    # c1: its Wall time; c2+c3: the slower, c3 from the response's end (7.2 s) to 9.7 s;
    # the user's prompt 20 s less the last output at 11.5 s.
    assert col(df, "latency_s", "tool") == pytest.approx([1.25, 2.5, 8.5])
    c = counts(imp)
    assert (c["llm_calls"], c["tool_calls"], c["tool_results"], c["exact_durations"]) == (
        4, 3, 3, 2)
    assert (c["user_turns"], c["human_pauses"], c["tool_steps"]) == (2, 1, 2)
    assert (c["exact_latency"], c["approximate_latency"], c["exact_latency_share"]) == (
        1, 1, 0.5)
    assert c["prompt_tokens"] == 4800 and c["cached_tokens"] == 3400
    assert c["cached_share"] == round(3400 / 4800, 4)
    assert c["skipped_lines"]["event_msg:token_count (repeated)"] == 1
    assert imp.provenance.extra["totals"]["exact_latency"] == 1


def test_total_usage_only_and_errors(tmp_path: Path) -> None:
    """Without last_token_usage a response's usage is the growth of the totals."""
    lines = [meta(), *user(1), call(2, "c1"),
             line(2.5, "event_msg", type="token_count", info={"total_token_usage": {
                 "input_tokens": 500, "cached_input_tokens": 0, "output_tokens": 20}}),
             output(3, "c1", wall=0.2, code=2), answer(4),
             line(4.5, "event_msg", type="token_count", info={"total_token_usage": {
                 "input_tokens": 1100, "cached_input_tokens": 400, "output_tokens": 35}})]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert col(df, "input_tokens", "llm") == [500, 80] and col(df, "output_tokens", "llm") == [
        20, 15]
    assert col(df, "outcome", "tool") == ["error"] and counts(imp)["error_calls"] == 1


def test_compaction_keeps_the_cached_tokens(tmp_path: Path) -> None:
    lines = [meta(), *user(1), call(2, "c1"), usage(2.5, 5000, 100), output(3, "c1", wall=1.0),
             line(4, "compacted", message="summary", replacement_history=[]),
             call(5, "c2"), usage(5.5, 1200, 10, cached=800), output(6, "c2", wall=0.1),
             answer(7), usage(7.5, 1300, 5, cached=1200)]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert col(df, "keep_tokens", "llm") == [None, 800, None]
    assert col(df, "input_tokens", "llm") == [5000, 400, 90]
    assert counts(imp)["compactions"] == 1 and counts(imp)["cut_tokens_dropped"] == 4300


def test_shrinking_prompt_without_a_marker(tmp_path: Path) -> None:
    """A prompt below the previous prompt + output keeps the previous prompt when it still
    holds it (reasoning not sent back), else the cached tokens."""
    lines = [meta(), *user(1), call(2, "c1"), usage(2.5, 1000, 300), output(3, "c1", wall=1),
             call(4, "c2"), usage(4.5, 1200, 50, cached=900), output(5, "c2", wall=1),
             answer(6), usage(6.5, 700, 5, cached=600)]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert col(df, "keep_tokens", "llm") == [None, 1000, 600]
    assert col(df, "input_tokens", "llm") == [1000, 200, 100]
    c = counts(imp)
    assert (c["output_not_resent"], c["cuts"]) == (1, 1)


def test_abandoned_call_ends_and_continues(tmp_path: Path) -> None:
    lines = [meta(), *user(1), call(2, "c1"), usage(2.5, 1000, 50),
             line(3, "response_item", type="function_call_output", call_id="c1",
                  output="aborted"),
             line(3.1, "event_msg", type="turn_aborted", reason="interrupted"),
             *user(30, "try again"), call(31, "c2"), usage(31.5, 1200, 40, cached=1000),
             line(33, "event_msg", type="turn_aborted", reason="interrupted")]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert list(dict.fromkeys(df["trajectory_id"])) == ["sess-1", "sess-1~2"]
    first = df[df["trajectory_id"] == "sess-1"]
    assert col(first, "latency_s", "tool") == [None]
    assert col(first, "outcome", "tool") == ["abandoned"]
    second = df[df["trajectory_id"] == "sess-1~2"]
    assert col(second, "input_tokens", "llm") == [1200]  # a new context: the whole prompt
    assert col(second, "outcome", "tool") == ["abandoned"]  # no output by the end of the log
    starts = df.groupby("trajectory_id", sort=False)["start_s"].first().tolist()
    assert starts == [0.0, 30.0]
    assert second["prefix_group"].iloc[0] == "codex/main"
    assert second["prefix_tokens"].iloc[0] == 1000
    c = counts(imp)
    assert (c["continuations"], c["abandoned_calls"], c["tool_results"]) == (1, 2, 1)


def test_exec_end_duration_hosted_search_and_trailing(tmp_path: Path) -> None:
    lines = [meta(), *user(1),
             line(2, "response_item", type="web_search_call", status="completed",
                  action={"type": "search", "query": "q"}),
             call(3, "c1", name="shell"), usage(3.5, 900, 60),
             line(4, "response_item", type="function_call_output", call_id="c1",
                  output="plain text, no header"),
             line(4.2, "event_msg", type="exec_command_end", call_id="c1", exit_code=0,
                  duration={"secs": 2, "nanos": 500000000}),
             line(5, "response_item", type="custom_tool_call", name="apply_patch",
                  call_id="c2", input="*** Begin Patch"), usage(5.5, 1000, 20),
             line(6, "response_item", type="custom_tool_call_output", call_id="c2",
                  output=json.dumps({"output": "ok", "metadata": {"exit_code": 0,
                                                                  "duration_seconds": 0.7}})),
             line(7, "event_msg", type="patch_apply_end", call_id="c2", success=True)]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert col(df, "tool_name", "tool") == ["shell"] and col(df, "latency_s", "tool") == [2.5]
    c = counts(imp)
    assert (c["hosted_calls"], c["trailing_tools_dropped"], c["exact_durations"]) == (1, 1, 2)


def test_legacy_rollout_without_envelope(tmp_path: Path) -> None:
    """Mid-2025 rollouts: a header line, state markers, bare items, no usage, no times."""
    lines: list[dict[str, Any]] = [
             {"id": "legacy-1", "timestamp": "2025-08-20T13:20:47.060Z", "instructions": None},
             {"record_type": "state"},
             {"type": "message", "role": "user", "content": [
                 {"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "list the files please"}]},
             {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}',
              "call_id": "c1"},
             {"type": "function_call_output", "call_id": "c1",
              "output": json.dumps({"output": "a b", "metadata": {"exit_code": 0,
                                                                  "duration_seconds": 0.3}})},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "two files"}]},
             {"record_type": "state"}]
    imp = import_trace(FMT, write(tmp_path, lines), {})
    df = valid(imp)
    assert set(df["trajectory_id"]) == {"legacy-1"} and (df["start_s"] == 0).all()
    assert col(df, "latency_s", "tool") == [0.3]
    assert col(df, "output_tokens", "llm") == [11, 2]  # counted: the arguments, "two files"
    c = counts(imp)
    assert (c["llm_calls"], c["llm_calls_estimated"], c["user_turns"]) == (2, 2, 1)
    assert c["skipped_lines"]["record_type:state"] == 2


def test_subagent_rollout_and_arrivals(tmp_path: Path) -> None:
    parent = write(tmp_path, BASIC, "rollout-p.jsonl")
    child = [meta("kid", source={"subagent": {"thread_spawn": {"parent_thread_id": "sess-1",
                                                                "depth": 1}}}),
             *user(0), answer(1), usage(1.5, 300, 3)]
    child[0]["timestamp"] = child[0]["payload"]["timestamp"] = at(45)
    for x in child[1:]:
        x["timestamp"] = "2026-01-02T10:00:46.000Z"
    kid = write(tmp_path, child, "rollout-k.jsonl")
    imp = import_traces(FMT, [parent, kid], {"tenant": "t1", "priority": "batch"})
    df = valid(imp)
    starts = df.groupby("trajectory_id", sort=False)["start_s"].first()
    assert starts.to_dict() == {"sess-1": 0.0, "kid": 45.0}
    assert df["parent_id"].isna().all()
    assert set(df["tenant"]) == {"t1"} and set(df["priority"]) == {"batch"}
    assert imp.provenance.extra["files"][1]["subagents_unlinked"] == 1
    t = imp.provenance.extra["totals"]
    assert (t["files"], t["sessions"], t["trajectories"], t["llm_calls"]) == (2, 2, 2, 5)
    same = import_traces(FMT, [parent, tmp_path], {})  # a file twice is read once
    assert same.provenance.extra["totals"]["files"] == 2


def test_cli_import_and_describe(tmp_path: Path) -> None:
    src = write(tmp_path, BASIC)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert validate_file(out) == []
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == FMT
    r = CliRunner().invoke(main, ["traces", "describe", str(out)])
    assert r.exit_code == 0, r.output
    assert "exact_latency_share" in r.output and "llm_calls" in r.output
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(tmp_path / "none.jsonl"),
                                  "--out", str(out)])
    assert r.exit_code == 2 and "does not exist" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("text, where", [
    ("{not json\n", "line 1: not valid JSON"),
    ("[1, 2]\n", "line 1: expected a JSON object"),
    (json.dumps({"timestamp": T0, "type": "response_item", "payload": 3}) + "\n",
     "line 1: payload must be an object"),
    (json.dumps({"timestamp": "yesterday", "type": "event_msg", "payload": {}}) + "\n",
     "line 1: 'timestamp' must be an ISO 8601 time"),
    (json.dumps(line(1, "event_msg", name="x")) + "\n", "line 1: payload.type must be a string"),
    (json.dumps(line(0, "session_meta", cwd="/")) + "\n", "line 1: payload.id must be"),
    (json.dumps(call(1, "")) + "\n", "line 1: payload.call_id must be a string"),
    (json.dumps(line(1, "response_item", type="function_call", call_id="c")) + "\n",
     "line 1: payload.name must be a string"),
    (json.dumps(line(1, "event_msg", type="token_count", info=[])) + "\n",
     "line 1: payload.info must be an object"),
    (json.dumps(usage(1, -5, 3)) + "\n",
     "line 1: payload.info.last_token_usage: 'input_tokens' must be an integer >= 0"),
    (json.dumps(call(1, "c")) + "\n" + json.dumps(line(
        2, "event_msg", type="exec_command_end", call_id="c", duration=-1)) + "\n",
     "line 2: payload.duration: 'duration' must be a duration >= 0"),
    (json.dumps({"what": 1}) + "\n", "line 1: type must be a string"),
])
def test_malformed_is_one_line(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    msg = str(exc.value)
    assert msg.startswith(str(p)) and where in msg and "\n" not in msg


def test_no_response_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no model response"):
        import_trace(FMT, write(tmp_path, [meta(), *user(1)]), {})
    with pytest.raises(InputError, match="unknown option"):
        import_trace(FMT, write(tmp_path, BASIC), {"warmups": "skip"})
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match=r"no rollout-\*\.jsonl or \*\.jsonl files"):
        import_trace(FMT, tmp_path / "d", {})
    home = tmp_path / "home"
    write(home / "sessions" / "2026" / "01" / "02", BASIC, "rollout-x.jsonl")
    (home / "history.jsonl").write_text('{"session_id": "x", "ts": 1, "text": "hi"}\n')
    assert import_trace(FMT, home, {}).provenance.extra["totals"]["files"] == 1


@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_rollout_imports_or_is_one_line(tmp_path: Path, data: st.DataObject) -> None:
    doc = mutate(copy.deepcopy(BASIC), data, most=4)
    p = tmp_path / "f.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in doc))
    imports_or_is_one_line(FMT, p)


# ---------------------------------------------------------------- the public samples


def _raw_counts(path: Path) -> dict[str, Any]:
    """An importer-free account of a rollout: responses (token counts with new totals),
    their prompts, tool calls, outputs, exact durations, user turns."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    prompts: list[int] = []
    total = None
    calls: set[str] = set()
    outputs: dict[str, str] = {}
    ended: set[str] = set()
    users = 0
    for r in rows:
        p = r.get("payload", {})
        if r.get("type") == "event_msg" and p.get("type") == "token_count" and p.get("info"):
            new = p["info"]["total_token_usage"]
            if new != total:
                prompts.append(p["info"]["last_token_usage"]["input_tokens"])
            total = new
        elif p.get("type") in ("function_call", "custom_tool_call"):
            calls.add(p["call_id"])
        elif p.get("type") in ("function_call_output", "custom_tool_call_output"):
            outputs[p["call_id"]] = p["output"]
        elif p.get("type") == "exec_command_end" and p.get("duration") is not None:
            ended.add(p["call_id"])
        elif r.get("type") == "event_msg" and p.get("type") == "user_message":
            users += 1
    exact = {c for c, o in outputs.items()
             if re.search(r"^Wall time: ", o, re.M) or '"duration_seconds"' in o} | ended
    return {"llm": len(prompts), "prompts": prompts, "calls": len(calls),
            "results": len(calls & set(outputs)), "exact": len(calls & exact), "users": users}


# The reference counts of the samples' README: LLM calls, tool calls, with result, exact, users.
REFERENCE = {
    "rollout-2026-05-11T11-26-55-019e1625-789d-76c0-80ab-3724b5ddb799.jsonl": (66, 102, 102,
                                                                                 99, 2),
    "rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl": (3, 3, 3, 3, 1),
}


def test_public_samples_against_their_raw_counts() -> None:
    paths = samples()
    assert {p.name for p in paths} == set(REFERENCE)
    imp = import_traces(FMT, [SAMPLES], {})
    df = valid(imp)
    llm = (df["kind"] == "llm").to_numpy()
    prompt = context_lengths(df).prompt
    per = {Path(f["file"]).name: f for f in imp.provenance.extra["files"]}
    for p in paths:
        raw = _raw_counts(p)
        f = per[p.name]
        got = (f["llm_calls"], f["tool_calls"], f["tool_results"], f["exact_durations"],
               f["user_turns"])
        assert got == (raw["llm"], raw["calls"], raw["results"], raw["exact"], raw["users"])
        assert got == REFERENCE[p.name]
        rows = (df["trajectory_id"] == f["id"]).to_numpy()
        assert prompt[llm & rows].tolist() == raw["prompts"]  # every prompt replayed exactly
        assert f["llm_calls_estimated"] == 0 and f["continuations"] == 0
    t = imp.provenance.extra["totals"]
    assert (t["files"], t["trajectories"], t["llm_steps"]) == (2, 2, 69)
    assert t["exact_latency"] + t["approximate_latency"] == t["tool_steps"]
    assert 0.9 < t["exact_latency_share"] <= 1
