"""Importers: the real public traces (skipped where absent) and tiny hand-written inputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.traces.generator import generate
from harness.traces.importers import FORMATS, Format, Imported, import_trace
from harness.traces.importers.mini_swe_agent import classify
from harness.traces.importers.openai_chat import tool_class_of
from harness.traces.profiles import load_profile
from harness.traces.schema import COLUMNS, read_provenance
from harness.traces.validate import check_frame, validate_file
from harness.userfiles import TOKEN_RULE, count_tokens

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def traces(sub: str) -> Path:
    """A folder of the public traces, or skip the test with the reason."""
    p = TRACES / sub
    if not p.exists():
        pytest.skip(f"public trace {p} is absent (it lives outside the repository)")
    return p


def assert_canonical(imp: Imported) -> None:
    """Exactly the canonical columns, the generator's dtypes, and a valid workload."""
    df = imp.steps
    assert tuple(df.columns) == COLUMNS
    ref = generate(load_profile("mixed-tools"), 2, 0).dtypes
    for c in COLUMNS:
        if c != "prefix_group":  # all-null here: object, like the generator's all-null groups
            assert df[c].dtype == ref[c], c
    assert check_frame(df, "imported") == []
    assert imp.provenance.inferred and imp.provenance.source_files


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


# ---------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def infercept_merged() -> Imported:
    return import_trace("infercept", traces("infercept") / "merged_exp_uniform.json", {})


def test_infercept_real(infercept_merged: Imported) -> None:
    imp = infercept_merged
    assert_canonical(imp)
    df = imp.steps
    assert df["trajectory_id"].nunique() == 397
    assert len(df) == 3711
    ex = imp.provenance.extra
    assert ex["text_requests"] == 195
    assert ex["transitions_checked"] == 1657
    assert ex["invariant_violations"] == 0 and imp.warnings == []
    assert ex["trailing_calls_dropped"] == 184
    assert imp.provenance.extra["token_rule"] == TOKEN_RULE
    first = traj(df, "0a84bcdff8434b23971032489f44b90a")
    assert list(first["kind"]) == ["llm", "tool"] * 4 + ["llm"]
    assert (first.loc[0, "input_tokens"], first.loc[0, "output_tokens"]) == (392, 127)
    assert first.loc[1, "latency_s"] == pytest.approx(8.662702748551965e-05, abs=1e-6)
    assert first.loc[1, "tool_class"] == "augmentation"
    # The tool's api_token_length becomes the next call's input (invariant holds here).
    assert first.loc[2, "input_tokens"] == 21 and first.loc[4, "input_tokens"] == 23
    chat = traj(df, "0")  # a chatbot (text) request
    assert chat.loc[1, "tool_class"] == "human"
    assert chat.loc[1, "latency_s"] == pytest.approx(51.77142857142857)
    assert chat.loc[0, "input_tokens"] == 34 and chat.loc[0, "output_tokens"] == 50
    assert chat.loc[2, "input_tokens"] == 33


def test_infercept_one_tool_variant_and_directory() -> None:
    d = traces("infercept")
    imp = import_trace("infercept", d / "diverse_oneapi_merged_exp_uniform.json", {})
    assert_canonical(imp)
    assert imp.steps["trajectory_id"].nunique() == 397 and len(imp.steps) == 1191
    both = import_trace("infercept", d, {"arrival_rate": "2", "seed": "3"})
    assert_canonical(both)
    ids = both.steps["trajectory_id"]
    assert ids.nunique() == 794 and ids.str.startswith("merged_exp_uniform/").any()
    starts = both.steps.groupby("trajectory_id", sort=False)["start_s"].first().to_numpy()
    assert starts[0] == 0 and (np.diff(starts) >= 0).all() and starts[-1] > 100


def test_mini_swe_agent_real_directory() -> None:
    imp = import_trace("mini-swe-agent", traces("mini-swe-agent"), {})
    assert_canonical(imp)
    ex = imp.provenance.extra
    assert ex["files"] == 203 and ex["trajectories"] == 198 and ex["skipped_empty"] == 5
    assert imp.steps["trajectory_id"].nunique() == 198 and len(imp.steps) == 31564
    assert ex["inputs_clamped"] == 0
    assert ex["negative_latencies_clamped"] == 5 and ex["timeouts"] == 24
    assert ex["trailing_tools_dropped"] == 5
    assert any("clamped to 0 s" in w for w in imp.warnings)
    tools = imp.steps[imp.steps["kind"] == "tool"]
    assert (tools["latency_s"] >= 0).all()
    assert set(tools["tool_class"]) == {"local_read", "mutating", "sandbox", "long_job"}
    assert (tools["outcome"] == "timeout").sum() == 24
    assert 0.2 < tools["latency_s"].median() < 0.33
    assert "pr814_deepseek_lite_dev/sqlfluff__sqlfluff-1517" in set(imp.steps["trajectory_id"])


def test_mini_swe_agent_real_file() -> None:
    run = traces("mini-swe-agent") / "pr814_deepseek_lite_dev"
    f = run / "sqlfluff__sqlfluff-1517.traj.json.gz"
    imp = import_trace("mini-swe-agent", f, {})
    assert_canonical(imp)
    df = imp.steps
    assert set(df["trajectory_id"]) == {"sqlfluff__sqlfluff-1517"}
    assert (df.loc[0, "input_tokens"], df.loc[0, "output_tokens"]) == (2348, 108)
    assert df.loc[1, "tool_name"] == "find" and df.loc[1, "tool_class"] == "local_read"
    assert df.loc[1, "latency_s"] == pytest.approx(1775890959.5647595 - 1775890959.2711725,
                                                   abs=1e-6)
    assert df.loc[1, "deadline_s"] == 60.0
    assert df.loc[2, "input_tokens"] == 2757 - 2348 - 108
    assert (df["kind"] == "llm").sum() == 95  # info.model_stats.api_calls


def test_mooncake_real() -> None:
    d = traces("mooncake")
    imp = import_trace("mooncake", d / "conversation_trace.jsonl", {})
    assert_canonical(imp)
    ex = imp.provenance.extra
    assert (ex["requests"], ex["sessions"], ex["multi_turn_sessions"]) == (12031, 8099, 2027)
    assert ex["inputs_clamped"] == 422
    df = imp.steps
    assert (df["kind"] == "llm").sum() == 12031
    assert set(df.loc[df["kind"] == "tool", "tool_class"]) == {"human"}
    assert any("NOT tool time" in n for n in imp.provenance.notes)
    s0, s1 = traj(df, "conversation_trace-0000"), traj(df, "conversation_trace-0001")
    assert list(s0["input_tokens"]) == [6758] and list(s0["output_tokens"]) == [500]
    assert list(s1["kind"]) == ["llm", "tool", "llm"]
    assert s1.loc[0, "input_tokens"] == 7322 and s1.loc[2, "input_tokens"] == 21
    assert s1.loc[1, "latency_s"] == 48.0
    syn = import_trace("mooncake", d / "synthetic_trace.jsonl", {})
    assert_canonical(syn)
    assert (syn.provenance.extra["sessions"], syn.provenance.extra["inputs_clamped"]) == (2660,
                                                                                         1098)


def test_openai_chat_real_tau_bench() -> None:
    f = traces("tau-bench") / "gpt-4o-airline.json"
    imp = import_trace("openai-chat", f, {})
    assert_canonical(imp)
    df = imp.steps
    assert df["trajectory_id"].nunique() == 200 and len(df) == 4708
    assert df["trajectory_id"].iloc[0] == "task0-trial0"
    tools = df[df["kind"] == "tool"]
    assert (tools["outcome"] == "error").sum() == 72
    assert set(tools["tool_class"]) == {"human", "remote_read", "mutating", "local_read"}
    assert imp.provenance.extra["trailing_dropped"] == 200
    assert "synthetic" in imp.provenance.inferred["latency_s"]
    again = import_trace("openai-chat", f, {})
    other = import_trace("openai-chat", f, {"seed": "1"})
    pd.testing.assert_frame_equal(again.steps, df)
    assert not other.steps["latency_s"].equals(df["latency_s"])
    assert other.steps["input_tokens"].equals(df["input_tokens"])


# ---------------------------------------------------------------- CLI


def test_cli_import_then_validate_and_describe(tmp_path: Path, cli_runner: CliRunner) -> None:
    src = tmp_path / "w.json"
    src.write_text(json.dumps({"a": [
        {"prompt_tokens": 10, "completion_tokens": 5, "api_time": 0.5, "api_token_length": 3},
        {"prompt_tokens": 18, "completion_tokens": 2}]}))
    out = tmp_path / "w.parquet"
    r = cli_runner.invoke(main, ["traces", "import", "infercept", str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 trajectories, 3 steps" in r.output
    r = cli_runner.invoke(main, ["traces", "validate", str(out)])
    assert r.exit_code == 0 and "valid" in r.output
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == "infercept"
    r = cli_runner.invoke(main, ["traces", "describe", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(r.output)["tool_calls"] == 1


def test_cli_import_real_mooncake(tmp_path: Path, cli_runner: CliRunner) -> None:
    f = traces("mooncake") / "conversation_trace.jsonl"
    out = tmp_path / "m.parquet"
    r = cli_runner.invoke(main, ["traces", "import", "mooncake", str(f), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "warning: 422 continuing turns" in r.output
    assert validate_file(out) == []


def test_cli_malformed_input_is_one_line(tmp_path: Path, cli_runner: CliRunner) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
                   "{not json\n")
    r = cli_runner.invoke(main, ["traces", "import", "mooncake", str(src), "--out",
                                 str(tmp_path / "o.parquet")])
    assert r.exit_code == 2
    assert f"{src}: line 2: not valid JSON" in r.output
    assert "Traceback" not in r.output
    r = cli_runner.invoke(main, ["traces", "import", "infercept", str(tmp_path / "nope.json"),
                                 "--out", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = cli_runner.invoke(main, ["traces", "import", "mooncake", str(src), "-o", "bogus=1",
                                 "--out", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "unknown option(s) bogus" in r.output


@pytest.mark.parametrize("fmt, rel", [
    ("infercept", "infercept/merged_exp_uniform.json"),
    ("mini-swe-agent", "mini-swe-agent/pr816_deepseek_chat_dev"),
    ("mooncake", "mooncake/synthetic_trace.jsonl"),
    ("openai-chat", "tau-bench/gpt-4o-airline.json"),
])
def test_cli_import_every_real_format(tmp_path: Path, cli_runner: CliRunner, fmt: str,
                                      rel: str) -> None:
    src = traces(rel.split("/")[0]) / rel.split("/", 1)[1]
    out = tmp_path / "o.parquet"
    r = cli_runner.invoke(main, ["traces", "import", fmt, str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = cli_runner.invoke(main, ["traces", "validate", str(out)])
    assert r.exit_code == 0, r.output
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == fmt and prov.inferred


@pytest.mark.parametrize("fmt, name", [("mooncake", "t.jsonl"), ("openai-chat", "c.jsonl"),
                                       ("infercept", "w.json"),
                                       ("mini-swe-agent", "x.traj.json.gz")])
def test_binary_garbage_is_an_input_error(tmp_path: Path, fmt: str, name: str) -> None:
    p = tmp_path / name
    p.write_bytes(b"\xff\xfe\x00garbage\x9c" * 50)
    with pytest.raises(InputError) as exc:
        import_trace(fmt, p, {})
    assert str(p) in str(exc.value)


# ---------------------------------------------------------------- common


def test_token_rule() -> None:
    assert count_tokens("Hello, world! x_y 3.14") == 8
    assert count_tokens("") == 0
    assert "\\w+" in TOKEN_RULE


def test_every_format_has_a_module() -> None:
    assert set(FORMATS) == {"atif", "claude-code", "codex", "infercept", "kv-cache-tester",
                            "mini-swe-agent", "mooncake", "openai-chat", "otel-genai",
                            "recording"}
    for name, fmt in FORMATS.items():
        assert isinstance(fmt, Format) and fmt.name == name and callable(fmt.read), name


@pytest.mark.parametrize("opts, msg", [
    ({"priority": "urgent"}, "priority must be one of"),
    ({"seed": "x"}, "seed must be an integer"),
    ({"arrival_rate": "-1"}, "arrival_rate must be a number > 0"),
])
def test_bad_options(tmp_path: Path, opts: dict[str, str], msg: str) -> None:
    src = tmp_path / "w.json"
    src.write_text(json.dumps({"a": [{"prompt_tokens": 1, "completion_tokens": 1}]}))
    with pytest.raises(InputError, match=msg):
        import_trace("infercept", src, opts)


# ---------------------------------------------------------------- infercept, hand-written


def _infercept(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "w.json"
    p.write_text(json.dumps(data))
    return p


def test_infercept_invariant_violation_and_clamp(tmp_path: Path) -> None:
    p = _infercept(tmp_path, {
        "ok": [{"prompt_tokens": 10, "completion_tokens": 5, "api_time": 1, "api_token_length": 3},
               {"prompt_tokens": 18, "completion_tokens": 2}],
        "off": [{"prompt_tokens": 10, "completion_tokens": 5, "api_time": 0.2,
                 "api_token_length": 3},
                {"prompt_tokens": 20, "completion_tokens": 0, "api_time": 0.1,
                 "api_token_length": 1},
                {"prompt_tokens": 4, "completion_tokens": 1, "api_time": 9.0,
                 "api_token_length": 7}],
    })
    imp = import_trace("infercept", p, {"tool_class": "remote_read"})
    assert_canonical(imp)
    off = traj(imp.steps, "off")
    # Recorded next prompt - prompt - completion: 20 - 10 - 5 = 5 (api_token_length said 3).
    assert list(off["input_tokens"].dropna()) == [10, 5, 0]
    assert list(off["output_tokens"].dropna()) == [5, 1, 1]
    assert off.loc[1, "tool_class"] == "remote_read"
    ex = imp.provenance.extra
    assert (ex["invariant_violations"], ex["inputs_clamped"], ex["outputs_clamped"]) == (2, 1, 1)
    assert ex["trailing_calls_dropped"] == 1
    assert imp.warnings[0].startswith("2 of 3 segment transitions break the invariant")
    assert "'off' segment 1: 20 != 10 + 5 + 3" in imp.warnings[0]


def test_infercept_text_request(tmp_path: Path) -> None:
    p = _infercept(tmp_path, {"7": [
        {"prompt": "Hi there.", "completion": "Hello!", "api_token": " More, please",
         "api_time": 12.5},
        {"prompt": "Hi there.Hello! More, please", "completion": "Sure."}]})
    imp = import_trace("infercept", p, {})
    df = imp.steps
    assert list(df["input_tokens"].dropna()) == [3, 3]  # "Hi there ." / "More , please"
    assert list(df["output_tokens"].dropna()) == [2, 2]
    assert df.loc[1, "tool_class"] == "human" and df.loc[1, "latency_s"] == 12.5


@pytest.mark.parametrize("data, where", [
    ({"r1": [{"prompt_tokens": 5, "completion_tokens": 1, "api_time": 1,
              "api_token_length": 2}, {"prompt_tokens": 8}]}, "request 'r1' segment 1: missing "
                                                             "'completion_tokens'"),
    ({"r2": [{"prompt_tokens": 5, "completion_tokens": 1, "api_token_length": 2},
             {"prompt_tokens": 8, "completion_tokens": 1}]}, "request 'r2' segment 0: missing "
                                                             "'api_time'"),
    ({"r3": [{"prompt_tokens": 5, "completion_tokens": 1, "api_time": -1,
              "api_token_length": 2}, {"prompt_tokens": 8, "completion_tokens": 1}]},
     "request 'r3' segment 0: 'api_time' must be seconds >= 0"),
    ({"r4": [{"prompt_tokens": "5", "completion_tokens": 1}]},
     "request 'r4' segment 0: 'prompt_tokens' must be an integer >= 0"),
    ({"r5": []}, "request 'r5': expected a non-empty list"),
    ({"r6": [{"prompt": "a", "completion": "b", "api_token": "c", "api_time": 1},
             {"prompt_tokens": 3, "completion_tokens": 1}]}, "request 'r6': mixes text"),
    ([1, 2], "expected a JSON object"),
])
def test_infercept_malformed(tmp_path: Path, data: Any, where: str) -> None:
    p = _infercept(tmp_path, data)
    with pytest.raises(InputError) as exc:
        import_trace("infercept", p, {})
    assert str(p) in str(exc.value) and where in str(exc.value)


def test_infercept_bad_json_names_line(tmp_path: Path) -> None:
    p = tmp_path / "w.json"
    p.write_text('{"a": [\n  {"prompt_tokens": 1,,}\n]}')
    with pytest.raises(InputError, match=r"w\.json: not valid JSON at line 2"):
        import_trace("infercept", p, {})


# ---------------------------------------------------------------- mini-swe-agent, hand-written


def _assistant(prompt: int, completion: int, ts: float, command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "x",
            "extra": {"actions": [{"command": command}], "timestamp": ts,
                      "response": {"usage": {"prompt_tokens": prompt,
                                             "completion_tokens": completion}}}}


def _tool(ts: float, rc: int = 0, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "content": "out",
            "extra": {"timestamp": ts, "returncode": rc, **extra}}


def _write_traj(path: Path, messages: list[Any], gz: bool = False) -> Path:
    text = json.dumps({"messages": messages, "info": {"config": {"environment":
                                                                 {"timeout": 30}}}})
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_mini_swe_agent_small(tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "task"},
        _assistant(100, 20, 1000.0, "cd /testbed && grep -rn foo ."),
        _tool(1000.5),
        _assistant(150, 400, 1002.0, "sed -i 's/a/b/' x.py"),  # big completion: next clamps
        _tool(1001.9, rc=1),  # stamped before its call: latency clamped to 0
        _assistant(500, 10, 1004.0, "python run.py"),
        _tool(1064.0, rc=-1, exception_type="TimeoutExpired"),
        {"role": "user", "content": "format error"},
        _assistant(600, 5, 1070.0, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        {"role": "exit", "content": ""},
    ]
    f = _write_traj(tmp_path / "run" / "org__proj-1.traj.json.gz", msgs, gz=True)
    imp = import_trace("mini-swe-agent", f, {})
    assert_canonical(imp)
    df = imp.steps
    assert set(df["trajectory_id"]) == {"org__proj-1"}
    assert list(df["input_tokens"].dropna()) == [100, 30, 0, 90]
    tools = df[df["kind"] == "tool"].reset_index(drop=True)
    assert list(tools["tool_class"]) == ["local_read", "mutating", "sandbox"]
    assert list(tools["outcome"]) == ["ok", "error", "timeout"]
    # killed at the environment's 30-s timeout, its error the agent's result: it returns
    # at the timeout, so a replay goes on as the agent did
    assert list(tools["latency_s"]) == [0.5, 0.0, 30.0]
    assert list(tools["mutating"]) == [False, True, True]
    assert (tools["deadline_s"] == 30).all()
    ex = imp.provenance.extra
    assert (ex["inputs_clamped"], ex["negative_latencies_clamped"]) == (1, 1)
    assert any("org__proj-1.traj.json.gz message 6: -50" in w for w in imp.warnings)
    # Directory: ids keep the sub-folder so equal instance ids from two runs stay apart.
    _write_traj(tmp_path / "run2" / "org__proj-1.traj.json", msgs)
    both = import_trace("mini-swe-agent", tmp_path, {"start": "recorded"})
    assert set(both.steps["trajectory_id"]) == {"run/org__proj-1", "run2/org__proj-1"}


def test_mini_swe_agent_parallel_tools_merge(tmp_path: Path) -> None:
    a = _assistant(100, 20, 10.0, "")
    a["extra"]["actions"] = [{"command": "cat a"}, {"command": "git apply p.diff"}]
    msgs = [a, _tool(10.2), _tool(10.7, rc=2), _assistant(200, 5, 12.0, "ls")]
    imp = import_trace("mini-swe-agent", _write_traj(tmp_path / "p.traj.json", msgs), {})
    t = imp.steps.loc[1]
    assert (t["tool_name"], t["tool_class"], t["outcome"]) == ("cat+git", "mutating", "error")
    assert t["latency_s"] == pytest.approx(0.7)


@pytest.mark.parametrize("msgs, where", [
    ([{"role": "assistant", "content": "x", "extra": {"timestamp": 1.0}}],
     "message 0 (assistant): extra.response.usage.prompt_tokens must be"),
    ([_assistant(1, 1, 1.0, "ls"), {"role": "tool", "content": "x", "extra": {"returncode": 0}}],
     "message 1 (tool): extra.timestamp must be a unix time"),
    ([{"role": "tool", "content": "x"}], "message 0 (tool): no assistant message before it"),
    ([_assistant(1, 1, 1.0, "ls"), _tool(2.0, rc="0")],  # type: ignore[arg-type]
     "message 1 (tool): extra.returncode must be an integer"),
    ([{"content": "no role"}], "message 0: expected an object with a 'role'"),
])
def test_mini_swe_agent_malformed(tmp_path: Path, msgs: list[Any], where: str) -> None:
    f = _write_traj(tmp_path / "x.traj.json", msgs)
    with pytest.raises(InputError) as exc:
        import_trace("mini-swe-agent", f, {})
    assert str(f) in str(exc.value) and where in str(exc.value)


def test_mini_swe_agent_no_calls_or_files(tmp_path: Path) -> None:
    f = _write_traj(tmp_path / "e.traj.json", [{"role": "system", "content": "s"}])
    with pytest.raises(InputError, match="no trajectory with an LLM call"):
        import_trace("mini-swe-agent", f, {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no \\*.traj.json"):
        import_trace("mini-swe-agent", tmp_path / "empty", {})


@pytest.mark.parametrize("command, expected", [
    ("cat foo.py", ("cat", "local_read")),
    ("cd /testbed && sed -i 's/a/b/' x.py", ("sed", "mutating")),
    ("sed -n '1,20p' x.py", ("sed", "local_read")),
    ("python -c \"print(1 > 2)\"", ("python", "sandbox")),
    ("python reproduce.py 2>&1 | head -20", ("python", "sandbox")),
    ("cat <<'EOF' > t.py\nif a > b:\n    pass\nEOF", ("cat", "mutating")),
    ("echo hi > f.txt", ("echo", "mutating")),
    ("git diff", ("git", "local_read")),
    ("git apply fix.patch", ("git", "mutating")),
    ("# look around\nls -la", ("ls", "local_read")),
    ("FOO=1 pytest -x tests", ("pytest", "sandbox")),
    ("find . -name '*.py' 2>/dev/null", ("find", "local_read")),
    ("pip install -e .", ("pip", "sandbox")),
    ("conda install numpy", ("conda", "long_job")),
    ("./run_me.sh", ("run_me.sh", "sandbox")),
])
def test_mini_swe_agent_classify(command: str, expected: tuple[str, str]) -> None:
    assert classify(command) == expected


# ---------------------------------------------------------------- mooncake, hand-written


def _jsonl(tmp_path: Path, rows: list[Any]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_mooncake_sessions(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 1300, "output_length": 50, "hash_ids": [1, 2, 3]},
        {"timestamp": 4000, "input_length": 2000, "output_length": 40, "hash_ids": [1, 2, 4, 5]},
        # Extends row 0's full blocks too, but row 0 was already continued: a new session.
        {"timestamp": 5000, "input_length": 1400, "output_length": 0, "hash_ids": [1, 2, 6]},
        # Extends row 1's full blocks [1, 2, 4] (longest): continues that session.
        {"timestamp": 9000, "input_length": 2010, "output_length": 7,
         "hash_ids": [1, 2, 4, 9]},
        # One full block ([1]): below min_blocks, so never continued by the next row.
        {"timestamp": 9500, "input_length": 1000, "output_length": 3, "hash_ids": [1, 8]},
        {"timestamp": 9900, "input_length": 1600, "output_length": 2, "hash_ids": [1, 8, 11]},
    ]
    imp = import_trace("mooncake", _jsonl(tmp_path, rows), {})
    assert_canonical(imp)
    df = imp.steps
    assert sorted(df["trajectory_id"].unique()) == ["t-0", "t-1", "t-2", "t-3"]
    s0 = traj(df, "t-0")
    assert list(s0["kind"]) == ["llm", "tool", "llm", "tool", "llm"]
    assert list(s0["input_tokens"].dropna()) == [1300, 650, 0]  # 2010 - 2000 - 40 < 0
    assert list(s0["latency_s"].dropna()) == [3.0, 5.0]
    assert s0.loc[0, "start_s"] == 1.0 and (s0["tool_class"].dropna() == "human").all()
    assert traj(df, "t-1").loc[0, "output_tokens"] == 1  # output_length 0 raised to 1
    assert imp.provenance.extra["inputs_clamped"] == 1
    assert "line 4: -30" in imp.warnings[0]
    one = import_trace("mooncake", _jsonl(tmp_path, rows), {"min_blocks": "1"})
    assert one.steps["trajectory_id"].nunique() == 3  # the last row now continues [1, 8]
    # first requests [1, 2, 3], [1, 2, 6], [1, 8] and [1, 8, 11] share leading blocks: one
    # prefix group; each first request's prefix is the most full blocks it shares with another
    first = df.groupby("trajectory_id").first()
    assert set(first["prefix_group"]) == {"mooncake/1"}
    assert first["prefix_tokens"].to_dict() == {"t-0": 1024, "t-1": 1024, "t-2": 512,
                                                "t-3": 512}


@pytest.mark.parametrize("bad, where", [
    ({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []},
     "line 2: 'timestamp' must be milliseconds >= 0"),
    ({"timestamp": 1, "input_length": 1.5, "output_length": 1, "hash_ids": []},
     "line 2: 'input_length' must be an integer >= 0"),
    ({"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["a"]},
     "line 2: 'hash_ids' must be a list of integers"),
    ([1], "line 2: expected a JSON object"),
    ({"timestamp": 1, "input_length": 10**30, "output_length": 1, "hash_ids": []},
     "line 2: 'input_length' must be an integer >= 0"),
    ({"timestamp": 10**400, "input_length": 1, "output_length": 1, "hash_ids": []},
     "line 2: 'timestamp' must be milliseconds >= 0"),
])
def test_mooncake_malformed(tmp_path: Path, bad: Any, where: str) -> None:
    good = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}
    p = _jsonl(tmp_path, [good, bad])
    with pytest.raises(InputError) as exc:
        import_trace("mooncake", p, {})
    assert f"{p}: {where}" in str(exc.value)


def test_mooncake_large_is_fast(tmp_path: Path) -> None:
    """20,000 requests in long chains: session inference stays linear, not quadratic."""
    rng = np.random.default_rng(0)
    rows, chains = [], [[k * 1000] for k in range(200)]
    for n in range(20000):
        c = chains[int(rng.integers(0, 200))]
        c.append(10_000_000 + n)
        rows.append({"timestamp": n, "input_length": 512 * len(c) + 100, "output_length": 10,
                     "hash_ids": list(c)})
    imp = import_trace("mooncake", _jsonl(tmp_path, rows), {})
    assert imp.provenance.extra["sessions"] == 200


# ---------------------------------------------------------------- openai-chat, hand-written


def _chat(tmp_path: Path, convs: Any, name: str = "c.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(convs))
    return p


def _call(cid: str, name: str, args: str = "{}") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CONV = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Book it, please."},
    {"role": "assistant", "content": None,
     "tool_calls": [_call("c1", "get_user"), _call("c2", "book_flight", '{"id": 1}')]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"name\": \"Ann\"}"},
    {"role": "tool", "tool_call_id": "c2", "content": "Error: sold out"},
    {"role": "assistant", "content": "Sold out, sorry."},
    {"role": "user", "content": "Ok."},
    {"role": "assistant", "content": "Bye."},
    {"role": "user", "content": "###STOP###"},
]


def test_openai_chat_small(tmp_path: Path) -> None:
    imp = import_trace("openai-chat", _chat(tmp_path, {"id": "conv-a", "messages": CONV}), {})
    assert_canonical(imp)
    df = imp.steps
    assert list(df["kind"]) == ["llm", "tool", "llm", "tool", "llm"]
    assert set(df["trajectory_id"]) == {"conv-a"}
    # "You help ." + "Book it , please ." ; then '{ " name " : " Ann " }' + "Error : sold out".
    assert list(df["input_tokens"].dropna()) == [8, 13, 2]
    # Calls: "get_user { }" + 'book_flight { " id " : 1 }'; then "Sold out , sorry .".
    assert list(df["output_tokens"].dropna()) == [3 + 8, 5, 2]
    t = df.loc[1]
    assert (t["tool_name"], t["tool_class"], t["outcome"], t["mutating"]) == (
        "get_user+book_flight", "mutating", "error", True)
    assert df.loc[3, "tool_class"] == "human" and df.loc[3, "tool_name"] == "user"
    assert 10 <= float(df["latency_s"].iloc[3]) <= 60  # mixed-tools' human class: 10-60 s
    assert imp.provenance.extra["trailing_dropped"] == 1


def test_openai_chat_seed_and_profile(tmp_path: Path) -> None:
    p = _chat(tmp_path, [CONV, CONV])
    a = import_trace("openai-chat", p, {"seed": "5"}).steps
    b = import_trace("openai-chat", p, {"seed": "5"}).steps
    c = import_trace("openai-chat", p, {"seed": "6"}).steps
    pd.testing.assert_frame_equal(a, b)
    assert not a["latency_s"].equals(c["latency_s"])
    assert list(a["trajectory_id"].unique()) == ["c-0", "c-1"]
    flaky = import_trace("openai-chat", p, {"profile": "flaky-tools"})
    lat = flaky.provenance.inferred["latency_s"]
    assert "'human': 'mixed-tools:human'" in lat and "'mutating': 'flaky-tools:remote_read'" in lat
    with pytest.raises(InputError, match="nor human_profile 'flaky-tools' has a 'human'"):
        import_trace("openai-chat", p, {"profile": "flaky-tools", "human_profile": "flaky-tools"})
    with pytest.raises(InputError, match="has no tool class 'mutating' nor 'nope'"):
        import_trace("openai-chat", p, {"profile": "flaky-tools", "latency_class": "nope"})
    only_tools = [m for m in CONV[:6]]
    imp = import_trace("openai-chat", _chat(tmp_path, [only_tools], "t.json"),
                       {"profile": "flaky-tools"})
    assert imp.steps.loc[1, "deadline_s"] == 30.0  # flaky-tools' remote_read deadline


def test_openai_chat_jsonl_and_bare_messages(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"messages": CONV}) + "\n\n" + json.dumps(CONV) + "\n")
    imp = import_trace("openai-chat", p, {})
    assert imp.steps["trajectory_id"].nunique() == 2
    one = import_trace("openai-chat", _chat(tmp_path, CONV, "bare.json"), {})
    assert set(one.steps["trajectory_id"]) == {"bare-0"}


@pytest.mark.parametrize("msgs, where", [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],
     "conversation 0 message 1: tool result without a tool call before it"),
    ([{"role": "assistant", "content": "x", "tool_calls": [_call("c1", "f")]},
      {"role": "tool", "tool_call_id": "zz", "content": "x"}],
     "conversation 0 message 1: tool_call_id 'zz' matches no call"),
    ([{"role": "robot", "content": "x"}], "conversation 0 message 0: expected an object with"),
    ([{"role": "assistant", "content": 5}], "conversation 0 message 0: 'content' must be"),
    ([{"role": "assistant", "content": "x", "tool_calls": [{"function": {}}]}],
     "conversation 0 message 0: tool_calls[0] needs function.name"),
])
def test_openai_chat_malformed(tmp_path: Path, msgs: list[Any], where: str) -> None:
    p = _chat(tmp_path, [{"messages": msgs}])
    with pytest.raises(InputError) as exc:
        import_trace("openai-chat", p, {})
    assert f"{p}: {where}" in str(exc.value)


def test_openai_chat_tool_classes() -> None:
    assert tool_class_of("get_reservation_details", "x") == "remote_read"
    assert tool_class_of("cancelReservation", "x") == "mutating"
    assert tool_class_of("calculate", "x") == "local_read"
    assert tool_class_of("frobnicate", "remote_read") == "remote_read"
