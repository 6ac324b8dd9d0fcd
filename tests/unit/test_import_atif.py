"""The atif importer: hand-written trajectories with exact rows, bad input, and the public samples
(skipped where absent) checked against counts made here from the raw JSON."""

from __future__ import annotations

import copy
import json
import re
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

FMT = "atif"
LOGS = Path(__file__).resolve().parents[3] / "shared" / "traces" / "agent-logs"
SAMPLES = LOGS / "atif"


def real() -> Path:
    """The public samples' folder, or skip the test with the reason."""
    if not SAMPLES.is_dir():
        pytest.skip(f"public samples {SAMPLES} are absent (they live outside the repository)")
    return SAMPLES


def ts(s: float) -> str:
    """An ISO time `s` seconds after 2025-01-01T00:00:00Z."""
    m, sec = divmod(s, 60)
    return f"2025-01-01T00:{int(m):02d}:{sec:06.3f}Z"


def agent(prompt: int | None, out: int | None, calls: tuple[str, ...] = (),
          results: dict[str, str] | None = None, at: float | None = None,
          cached: int | None = None, **extra: Any) -> dict[str, Any]:
    """An agent step: tool calls named `calls` (ids c0, c1, ...), results by call index."""
    s: dict[str, Any] = {"source": "agent", "message": "thinking about it"}
    if calls:
        s["tool_calls"] = [{"tool_call_id": f"c{i}", "function_name": n, "arguments": {"a": i}}
                           for i, n in enumerate(calls)]
    if results is not None:
        s["observation"] = {"results": [
            {"source_call_id": cid, "content": text} if cid else {"content": text}
            for cid, text in results.items()]}
    m = {k: v for k, v in (("prompt_tokens", prompt), ("completion_tokens", out),
                           ("cached_tokens", cached)) if v is not None}
    if m:
        s["metrics"] = m
    if at is not None:
        s["timestamp"] = ts(at)
    s.update(extra)
    return s


def step(source: str, message: Any, at: float | None = None, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"source": source, "message": message, **extra}
    if at is not None:
        s["timestamp"] = ts(at)
    return s


def doc(steps: list[Any], session: str = "s1", **top: Any) -> dict[str, Any]:
    for i, s in enumerate(steps, start=1):
        if isinstance(s, dict):
            s.setdefault("step_id", i)
    return {"schema_version": "ATIF-v1.5", "session_id": session,
            "agent": {"name": "terminus-2", "version": "2.0.0"}, "steps": steps, **top}


def write(folder: Path, d: Any, name: str = "trajectory.json") -> Path:
    p = folder / name
    p.write_text(json.dumps(d))
    return p


def valid(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


def col(t: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return [None if pd.isna(v) else v for v in t[t["kind"] == kind][name]]


def totals(imp: Imported) -> dict[str, Any]:
    out: dict[str, Any] = imp.provenance.extra["totals"]
    return out


def prompts(df: pd.DataFrame) -> list[int]:
    llm = (df["kind"] == "llm").to_numpy()
    return [int(x) for x in context_lengths(df).prompt[llm]]


# ---------------------------------------------------------------- hand-written trajectories

BASIC = [step("system", "You are an agent."), step("user", "Fix the bug."),
         agent(100, 10, ("read_file", "grep"), {"c0": "text", "c1": "lines"}),
         agent(150, 5, ("bash",), {"c0": "ok"}, cached=100),
         agent(170, 7)]


def test_rows_without_timestamps_take_the_options(tmp_path: Path) -> None:
    p = write(tmp_path, doc(copy.deepcopy(BASIC)))
    imp = import_trace(FMT, p, {"tool_latencies": "grep=2.5, bash=4"})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool"] * 2 + ["llm"]
    assert set(df["trajectory_id"]) == {"s1"} and (df["start_s"] == 0).all()
    assert col(df, "input_tokens", "llm") == [100, 40, 15]
    assert prompts(df) == [100, 150, 170]
    assert col(df, "tool_name", "tool") == ["read_file+grep", "bash"]
    assert col(df, "tool_class", "tool") == ["local_read", "sandbox"]
    assert col(df, "latency_s", "tool") == [2.5, 4.0]
    t = totals(imp)
    assert (t["llm_calls"], t["tool_calls"], t["tool_results"]) == (3, 3, 3)
    assert (t["latency_inferred"], t["exact_latency"], t["exact_latency_share"]) == (3, 0, 0.0)
    assert (t["user_turns"], t["parallel_pauses"], t["cached_tokens"]) == (1, 1, 100)
    assert imp.provenance.extra["files"][0]["version"] == "ATIF-v1.5 terminus-2 2.0.0"
    assert any("tool_latency" in w for w in imp.warnings)
    default = valid(import_trace(FMT, p, {"tool_latency": "0.25"}))
    assert col(default, "latency_s", "tool") == [0.25, 0.25]
    # v1.6 content parts, and no metrics: the token rule on the text.
    parts = doc([step("user", [{"type": "text", "text": "fix the bug"},
                               {"type": "image", "source": {"path": "a.png"}}]),
                 agent(None, None, ("bash",), {"c0": "one two three"},
                       message=[{"type": "text", "text": "run it now"}]),
                 agent(None, None)])
    est = valid(import_trace(FMT, write(tmp_path, parts, "parts.json"), {}))
    # Prompts: the appended text (3 tokens, then the result's 3); outputs: the message (3)
    # and the call: `bash {"a": 0}` (8).
    assert col(est, "input_tokens", "llm") == [3, 3]
    assert col(est, "output_tokens", "llm") == [11, 3]


def test_timestamps_time_pauses_and_arrivals(tmp_path: Path) -> None:
    steps = [step("user", "go", 0.0), agent(100, 10, ("bash",), {"": "out"}, at=1.0),
             agent(130, 5, at=4.5), step("user", "and now?", 64.5),
             agent(200, 3, ("web_search",), {"c0": "found"}, at=70.0), agent(260, 4, at=71.25)]
    a = write(tmp_path, doc(steps, "early"), "a.json")
    later = copy.deepcopy(steps)
    for s in later:
        s["timestamp"] = ts(float(s["timestamp"][17:-1]) + 30)
    b = write(tmp_path, doc(later, "late"), "b.json")
    imp = import_traces(FMT, [a, b], {"human_latency": "99"})
    df = valid(imp)
    first = traj(df, "early")
    assert col(first, "tool_name", "tool") == ["bash", "user", "web_search"]
    # Each pause is the gap from its agent step to the next step's timestamp.
    assert col(first, "latency_s", "tool") == pytest.approx([3.5, 60.0, 1.25])
    assert col(first, "tool_class", "tool") == ["sandbox", "human", "remote_read"]
    starts = df.groupby("trajectory_id", sort=False)["start_s"].first()
    assert starts.to_dict() == {"early": 0.0, "late": 30.0}
    t = totals(imp)
    assert (t["approx_latency"], t["latency_inferred"], t["human_latency_timed"]) == (4, 0, 2)
    assert (t["user_turns"], t["human_pauses"]) == (4, 2)


def test_subagent_files_with_copied_context(tmp_path: Path) -> None:
    child = doc([step("user", "Fix the bug.", is_copied_context=True),
                 agent(None, None, ("bash",), {"c0": "ok"}, is_copied_context=True),
                 step("user", "Summarise."), agent(80, 20)], "s1-summary",
                agent={"name": "summarizer", "version": "1"})
    write(tmp_path, child, "run.trajectory.summary.json")
    parent = doc([step("user", "Fix the bug."), agent(60, 6, ("bash",), {"c0": "ok"}),
                  agent(90, 6, ("bash",), {"c0": "ok"}),
                  step("system", "Summarised.", observation={"results": [
                      {"subagent_trajectory_ref": [{"session_id": "s1-summary",
                                                    "trajectory_path":
                                                        "trajectory.summary.json"}]}]}),
                  step("user", "Go on."), agent(50, 5)])
    p = write(tmp_path, parent, "run.trajectory.json")
    for imp in (import_trace(FMT, p, {}), import_trace(FMT, tmp_path, {})):
        df = valid(imp)
        assert list(dict.fromkeys(df["trajectory_id"])) == ["s1", "s1/s1-summary"]
        root = traj(df, "s1")
        assert col(root, "tool_name", "tool") == ["bash", "summarizer+bash"]
        assert col(root, "tool_class", "tool") == ["sandbox", "subagent"]
        # No timestamps: the parent waits for the child, then the bash call's option latency.
        assert col(root, "latency_s", "tool") == [1.0, 1.0]
        sub = traj(df, "s1/s1-summary")
        assert sub.loc[0, "parent_id"] == "s1" and sub.loc[0, "spawn_step"] == 3
        assert col(sub, "input_tokens", "llm") == [80] and len(sub) == 1
        # The copied steps are the parent's first two: the child shares the parent's prompt
        # that held them (90), at most its own first input; the parent its first prompt.
        assert (sub.loc[0, "prefix_group"], sub.loc[0, "prefix_tokens"]) == ("atif/s1", 80)
        assert (root.loc[0, "prefix_group"], root.loc[0, "prefix_tokens"]) == ("atif/s1", 60)
        # The handoff prompt (50) is below the context: a cut with nothing known kept.
        assert col(root, "keep_tokens", "llm") == [None, None, 0]
        per = {Path(f["file"]).name: f for f in imp.provenance.extra["files"]}
        assert per["run.trajectory.json"]["subagents"] == 1
        assert per["run.trajectory.summary.json"]["copied_steps"] == 2
        assert per["run.trajectory.summary.json"]["llm_calls"] == 1


def test_embedded_subagents_and_delegation_by_a_tool(tmp_path: Path) -> None:
    sub = {"schema_version": "ATIF-v1.7", "trajectory_id": "sub-1",
           "agent": {"name": "helper", "version": "1"},
           "steps": [step("user", "look"), agent(30, 3, ("grep",), {"c0": "x"}), agent(40, 2)]}
    parent = doc([step("user", "go"), agent(100, 10, ("Task",), None, observation={"results": [
        {"source_call_id": "c0", "content": "done",
         "subagent_trajectory_ref": [{"trajectory_id": "sub-1", "trajectory_path": None}]}]}),
                  agent(130, 5)], schema_version="ATIF-v1.7", subagent_trajectories=[sub])
    imp = import_trace(FMT, write(tmp_path, parent), {})
    df = valid(imp)
    root = traj(df, "s1")
    assert col(root, "tool_name", "tool") == ["helper+Task"]
    assert col(root, "tool_class", "tool") == ["subagent"]
    child = traj(df, "s1/sub-1")
    assert child.loc[0, "spawn_step"] == 1 and list(child["kind"]) == ["llm", "tool", "llm"]
    assert totals(imp)["subagents"] == 1 and totals(imp)["subagents_missing"] == 0
    # A reference that names nothing found stays a plain tool step.
    parent["subagent_trajectories"] = []
    imp = import_trace(FMT, write(tmp_path, parent), {})
    assert col(valid(imp), "tool_class", "tool") == ["long_job"]
    assert totals(imp)["subagents_missing"] == 1
    assert any("not found" in w for w in imp.warnings)


def test_continuation_is_the_same_trajectory(tmp_path: Path) -> None:
    write(tmp_path, doc([step("user", "Fix the bug.", is_copied_context=True),
                         step("user", "Continue from the summary."), agent(40, 4, ("bash",),
                                                                           {"c0": "ok"}),
                         agent(60, 2)], "s1"), "trajectory.cont-1.json")
    p = write(tmp_path, doc([step("user", "Fix the bug."), agent(300, 30, ("bash",),
                                                                {"c0": "ok"})],
                            continued_trajectory_ref="trajectory.cont-1.json"))
    imp = import_trace(FMT, tmp_path, {})
    df = valid(imp)
    assert set(df["trajectory_id"]) == {"s1"}
    assert prompts(df) == [300, 40, 60]
    assert col(df, "keep_tokens", "llm") == [None, 0, None]
    assert col(df, "tool_name", "tool") == ["bash", "bash"]
    t = totals(imp)
    assert (t["continuations"], t["copied_steps"], t["user_turns"], t["llm_calls"]) == (
        1, 1, 2, 3)
    assert import_trace(FMT, p, {}).steps.equals(imp.steps)


def test_declared_cut_errors_dispatch_and_abandoned(tmp_path: Path) -> None:
    steps = [step("user", "go"), agent(500, 50, ("read_file",), {"c0": "Error: no such file"}),
             step("system", "Compacted.", extra={"context_management": {
                 "type": "compaction", "boundary": "replace"}}),
             agent(700, 20, cached=120),
             agent(None, None, ("bash",), llm_call_count=0),
             agent(None, None, ("run_tests",))]
    imp = import_trace(FMT, write(tmp_path, doc(steps)), {})
    df = valid(imp)
    assert col(df, "keep_tokens", "llm") == [None, 120, None]
    assert col(df, "input_tokens", "llm")[:2] == [500, 580]
    assert col(df, "outcome", "tool") == ["error", "ok", "abandoned"]
    assert col(df, "tool_name", "tool") == ["read_file", "bash", "run_tests"]
    assert col(df, "latency_s", "tool") == [1.0, 1.0, None]
    t = totals(imp)
    assert (t["cuts_declared"], t["dispatch_steps"], t["errors"], t["abandoned"]) == (
        1, 1, 1, 1)
    assert (t["prompt_estimated"], t["output_estimated"], t["llm_calls"]) == (1, 1, 3)
    # An ending tool with no result after the last call is dropped, not abandoned.
    steps[-1] = agent(None, None, ("finish",))
    t = totals(import_trace(FMT, write(tmp_path, doc(steps)), {}))
    assert (t["abandoned"], t["trailing_tools_dropped"]) == (0, 1)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("d, where", [
    ([], "expected an ATIF trajectory"),
    ({"steps": "x"}, "expected an ATIF trajectory"),
    (doc([1]), "steps[0]: expected a JSON object"),
    (doc([step("robot", "hi")]), "steps[0]: 'source' must be one of system, user, agent"),
    (doc([agent(-1, 5)]), "steps[0]: 'metrics.prompt_tokens' must be a token count"),
    (doc([agent(5, 5, metrics=[1])]), "steps[0]: 'metrics' must be a JSON object"),
    (doc([step("user", "x", timestamp="yesterday")]), "'timestamp' must be an ISO 8601 time"),
    (doc([agent(5, 5, tool_calls=[{"tool_call_id": "a"}])]),
     "steps[0]: tool_calls[0]: needs 'function_name'"),
    (doc([agent(5, 5, observation={"results": "x"})]), "'results' must be a list"),
    (doc([agent(5, 5, llm_call_count="two")]), "'llm_call_count' must be a token count"),
    (doc([step("system", "x", observation={"results": [{"subagent_trajectory_ref": [3]}]}),
          agent(5, 5)]), "subagent_trajectory_ref[0]: expected a JSON object"),
    (doc([step("user", "x")]), "no agent step with a model call"),
    (doc([agent(5, 5)], subagent_trajectories="x"), "'subagent_trajectories' must be a list"),
])
def test_malformed_is_one_line(tmp_path: Path, d: Any, where: str) -> None:
    p = write(tmp_path, d, "bad.json")
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    msg = str(exc.value)
    assert (msg.startswith(str(p)) or msg.startswith(f"{FMT} import")) and where in msg
    assert "\n" not in msg


def test_bad_options_references_and_files(tmp_path: Path) -> None:
    p = write(tmp_path, doc(copy.deepcopy(BASIC)))
    for opts, what in (({"tool_latency": "-1"}, "option tool_latency must be seconds"),
                       ({"human_latency": "nan"}, "option human_latency must be seconds"),
                       ({"tool_latencies": "bash"}, "tool_latencies takes NAME=SECONDS"),
                       ({"profile": "x"}, "unknown option")):
        with pytest.raises(InputError, match=what):
            import_trace(FMT, p, opts)
    def ref(name: str) -> dict[str, Any]:
        return {"observation": {"results": [{"subagent_trajectory_ref": [
            {"trajectory_path": name}]}]}}

    with pytest.raises(InputError, match="already its ancestor"):
        import_trace(FMT, write(tmp_path, doc([agent(5, 5), step("system", "y",
                                                                 **ref("trajectory.json"))])),
                     {})
    loop = tmp_path / "loop"
    loop.mkdir()
    write(loop, doc([agent(5, 5), step("system", "x", **ref("b.json"))]), "a.json")
    write(loop, doc([agent(5, 5), step("system", "x", **ref("a.json"))]), "b.json")
    with pytest.raises(InputError, match="references form a cycle"):
        import_trace(FMT, loop, {})
    (tmp_path / "x.json").write_text("{broken")
    with pytest.raises(InputError, match=r"x\.json: not valid JSON at line 1"):
        import_trace(FMT, tmp_path / "x.json", {})
    d = tmp_path / "d"
    d.mkdir()
    write(d, {"config": True}, "config.json")  # a run's other JSON: skipped in a folder
    write(d, doc(copy.deepcopy(BASIC)), "agent.json")
    imp = import_trace(FMT, d, {})
    assert totals(imp)["skipped_files"] == 1 and len(imp.provenance.extra["files"]) == 1
    with pytest.raises(InputError, match="expected an ATIF trajectory"):
        import_trace(FMT, d / "config.json", {})








FUZZ = doc([step("user", "go", 0.0), agent(100, 10, ("read_file", "Task"), {
    "c0": "text", "c1": "done"}, at=1.0), agent(130, 5, at=3.0, cached=20),
    step("system", "sum", 4.0, observation={"results": [
        {"subagent_trajectory_ref": [{"trajectory_id": "sub-1"}]}]},
        extra={"context_management": {"boundary": "replace"}}),
    step("user", "more", 9.0), agent(90, 5, ("finish",), at=10.0)],
    schema_version="ATIF-v1.7",
    subagent_trajectories=[{"trajectory_id": "sub-1", "agent": {"name": "h", "version": "1"},
                            "steps": [step("user", "go", is_copied_context=True),
                                      agent(20, 2, at=5.0), agent(None, None, ("x",))]}])


@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_input_imports_or_is_one_line(tmp_path: Path, data: st.DataObject) -> None:
    d: Any = copy.deepcopy(FUZZ)
    mutate(d, data)
    p = tmp_path / "f.json"
    p.write_text(json.dumps(d))
    imports_or_is_one_line(FMT, p)


def test_cli_import_and_describe(tmp_path: Path) -> None:
    src = write(tmp_path, doc(copy.deepcopy(BASIC)))
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(src), "--out", str(out),
                                  "-o", "tool_latency=2"])
    assert r.exit_code == 0, r.output
    assert "1 trajectories, 5 steps" in r.output
    assert validate_file(out) == []
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == FMT
    assert "tool_latency (2 s)" in prov.inferred["latency_s"]
    r = CliRunner().invoke(main, ["traces", "describe", str(out)])
    assert r.exit_code == 0, r.output
    assert re.search(r"latency_inferred\s+3", r.output)
    assert re.search(r"exact_latency_share\s+0", r.output)
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(src), "--out", str(out),
                                  "-o", "tool_latency=x"])
    assert r.exit_code == 2 and "option tool_latency" in r.output
    assert "Traceback" not in r.output


# ---------------------------------------------------------------- the public samples


def _expect(d: dict[str, Any], refs_found: bool) -> dict[str, Any]:
    """An importer-free account of one ATIF file."""
    steps = [s for s in d["steps"] if not s.get("is_copied_context")]
    agents = [s for s in steps if s["source"] == "agent"]
    calls = results = subs = 0
    for s in steps:
        res = s.get("observation", {}).get("results", [])
        general = any("source_call_id" not in r and "content" in r for r in res)
        ids = {r.get("source_call_id") for r in res}
        for tc in s.get("tool_calls", []):
            calls += 1
            results += general or tc["tool_call_id"] in ids
        subs += sum(len(r.get("subagent_trajectory_ref", [])) for r in res)
    return {"llm_calls": len(agents), "tool_calls": calls, "tool_results": results,
            "exact_latency": 0, "subagents": subs if refs_found else 0,
            "user_turns": sum(s["source"] == "user" for s in steps),
            "prompts": [s["metrics"]["prompt_tokens"] for s in agents],
            "outputs": [s["metrics"]["completion_tokens"] for s in agents]}


def _readme_counts() -> dict[str, dict[str, int]]:
    """The README's reference counts of each atif file."""
    text = (LOGS / "README.md").read_text()
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^\| atif \| `atif/([^`]+)` \|.*?\| (\d+) LLM calls?, "
                         r"(\d+) tool calls? \((\d+) with result, (\d+) with exact duration\)"
                         r"(?:, (\d+) sub-agents?)?, (\d+) user turns? \|", text, re.M):
        out[m[1]] = {"llm_calls": int(m[2]), "tool_calls": int(m[3]),
                     "tool_results": int(m[4]), "exact_latency": int(m[5]),
                     "subagents": int(m[6] or 0), "user_turns": int(m[7])}
    return out


def test_public_samples_match_counts_from_the_raw_files() -> None:
    root = real()
    files = sorted(root.rglob("*.json"))
    assert len(files) == 6
    readme = _readme_counts()
    for f in files:
        d = json.loads(f.read_text())
        want = _expect(d, True)
        imp = import_trace(FMT, f, {})
        df = valid(imp)
        got = imp.provenance.extra["files"][0]
        name = str(f.relative_to(root))
        assert Path(got["file"]) == f
        for k in ("llm_calls", "tool_calls", "tool_results", "exact_latency", "subagents",
                  "user_turns"):
            assert got[k] == want[k] == readme[name][k], (name, k)
        llm_rows = traj(df, df["trajectory_id"].iloc[0])
        assert prompts(llm_rows) == want["prompts"], name
        assert col(llm_rows, "output_tokens", "llm") == want["outputs"], name
        assert got["latency_inferred"] + got["trailing_tools_dropped"] >= got["tool_calls"] - \
            got["abandoned"]
    whole = import_trace(FMT, root, {})
    df = valid(whole)
    t = totals(whole)
    assert (t["files"], t["llm_calls"], t["subagents"]) == (6, 16, 3)
    ids = list(dict.fromkeys(df["trajectory_id"]))
    assert len(ids) == 6 and sum(df.groupby("trajectory_id")["parent_id"].first().notna()) == 3
    main_id = "NORMALIZED_SESSION_ID/hello-world-context-summarization.trajectory.json"
    spawn = traj(df, main_id).iloc[5]
    assert spawn["tool_class"] == "subagent" and spawn["tool_name"].startswith(
        "terminus-2-summarization-summary+")
    kids = df[df["parent_id"] == main_id].groupby("trajectory_id")
    assert set(kids["spawn_step"].first()) == {5}
    # The summary and answers sub-agents start with the main run's first steps copied.
    assert set(kids["prefix_group"].first().dropna()) == {f"atif/{main_id}"}
