"""Both views of one real client session agree: a recording by `harness record` and the
client's own log, written by benchmarks/record_real_clients.py from the real client (its model's
answers scripted, the client, its log and the proxy real) and kept text-free in tests/data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.traces.compare_views import compare_views
from harness.traces.importers import import_trace
from harness.traces.schema import Provenance, write_trajectories

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "real-clients"
STRUCTURE = ("llm calls", "tool calls", "sub-agents", "max spawn depth", "parent links",
             "prompt tokens (sum)", "prompt tokens per call")


def test_codex_0_171_recording_and_rollout_agree() -> None:
    folder = FIXTURES / "codex-0.171.0"
    rec = import_trace("recording", folder / "recording", {})
    log = import_trace("codex", folder / "rollout.jsonl", {})
    files = log.provenance.extra["files"]
    assert [f["version"] for f in files] == ["0.171.0"]
    assert files[0]["llm_calls_estimated"] == 0  # the rollout's usage is exact
    result = compare_views(rec.steps, log.steps)
    assert result["summary"]["pairs"] == 1
    assert result["only_in_a"] == [] and result["only_in_b"] == []
    fields = {f["field"]: f for f in result["trees"][0]["fields"]}
    for name in STRUCTURE:
        assert fields[name]["verdict"] == "same", (name, fields[name])
    # two turns of one session: five calls, three shell commands and the user's second turn
    assert (fields["llm calls"]["a"], fields["tool calls"]["a"]) == (5, 4)
    assert fields["prompt tokens (sum)"]["a"] == 3000


@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.rglob("*") if p.is_file()),
                         ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_fixtures_are_text_free(path: Path) -> None:
    # prose is kept as 'x' runs of its length; ids, hashes, numbers and the scripted commands
    # (this project's own, not a user's) are all a fixture holds
    text = path.read_text()
    docs = ([json.loads(line) for line in text.splitlines() if line.startswith("{")]
            if path.suffix == ".jsonl" else [json.loads(text)])
    for doc in docs:
        for key in ("text", "output", "base_instructions", "user_instructions", "body",
                    "content", "prompt", "cwd"):
            assert not _prose(doc, key), (path.name, key)


def _prose(value: object, key: str) -> bool:
    """Whether a string under `key` anywhere in `value` holds a word of 3+ letters other than
    the lines an importer reads (Wall time, Process exited)."""
    if isinstance(value, dict):
        return any((k == key and isinstance(v, str) and _has_words(v)) or _prose(v, key)
                   for k, v in value.items())
    if isinstance(value, list):
        return any(_prose(v, key) for v in value)
    return False


def _has_words(text: str) -> bool:
    kept = re.compile(r"^(Wall time: [0-9.]+ seconds?|Process exited with code -?\d+)$")
    return any(re.search(r"[A-Za-wyz]{3,}", line) for line in text.split("\n")
               if not kept.match(line))


def test_the_recorded_codex_session_replays(tmp_path: Path) -> None:

    trace = tmp_path / "codex.parquet"
    runner = CliRunner()
    res = runner.invoke(main, ["traces", "import", "recording",
                               str(FIXTURES / "codex-0.171.0" / "recording"), "--out",
                               str(trace)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["simulate", "--trace", str(trace), "--policy", "keep",
                               "--slots", "1", "--ctx-per-slot", "8192",
                               "--out", str(tmp_path / "sim")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["trajectories"]["succeeded"] == summary["trajectories"]["total"] == 1


def _claude_views() -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = FIXTURES / "claude-code-2.1.197"
    rec = import_trace("recording", folder / "recording", {})
    log = import_trace("claude-code", folder / "transcripts", {})
    return rec.steps, log.steps


def test_claude_code_2_1_197_nested_subagents_agree_in_both_views() -> None:
    metas = sorted((FIXTURES / "claude-code-2.1.197" / "transcripts").rglob("*.meta.json"))
    assert sorted(json.loads(m.read_text())["spawnDepth"] for m in metas) == [1, 2, 3, 4, 5]
    rec, log = _claude_views()
    result = compare_views(rec, log)
    assert result["summary"]["pairs"] == 1
    fields = {f["field"]: f for f in result["trees"][0]["fields"]}
    for name in STRUCTURE:
        assert fields[name]["verdict"] == "same", (name, fields[name])
    # a chain of five sub-agents whose first calls are identical: one tree, every link
    assert (fields["sub-agents"]["a"], fields["max spawn depth"]["a"]) == (5, 5)
    assert fields["parent links"]["a"] == fields["parent links"]["b"]
    assert len(fields["parent links"]["a"]) == 5


def test_claude_code_views_replay_to_the_same_kv_memory_time(tmp_path: Path) -> None:
    got = []
    for name, steps in zip(("recording", "transcripts"), _claude_views(), strict=True):
        trace = write_trajectories(steps, tmp_path / f"{name}.parquet", Provenance(name, []))
        res = CliRunner().invoke(main, ["simulate", "--trace", str(trace), "--policy", "keep",
                                        "--slots", "8", "--ctx-per-slot", "8192", "--out",
                                        str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        s = json.loads((tmp_path / name / "summary.json").read_text())
        assert s["trajectories"]["succeeded"] == s["trajectories"]["total"] == 1  # one task
        got.append((s["memory_time_token_s"], s["kv_paused_peak_tokens"]))
    (mt_a, peak_a), (mt_b, peak_b) = got
    assert abs(mt_a / mt_b - 1) <= 0.05 and peak_a == peak_b


def test_mini_swe_agent_2_4_6_recording_and_trajectory_agree() -> None:
    folder = FIXTURES / "mini-swe-agent-2.4.6"
    rec = import_trace("recording", folder / "recording", {})
    log = import_trace("mini-swe-agent", folder / "trajectory.traj.json", {})
    result = compare_views(rec.steps, log.steps)
    fields = {f["field"]: f for f in result["trees"][0]["fields"]}
    # the recording's number of calls, the answer without a tool call among them (2.4.x keeps
    # it only in its format error's extra.response), and the same prompts
    for name in ("llm calls", "prompt tokens (sum)", "prompt tokens per call", "sub-agents"):
        assert fields[name]["verdict"] == "same", (name, fields[name])
    assert fields["llm calls"]["a"] == 4
    # the one difference: the submitting command ends the run; the proxy saw the agent wait on
    # it (a trailing step that never returned), the agent's own log drops it
    assert (fields["tool calls"]["a"], fields["tool calls"]["b"]) == (4, 3)
    last = rec.steps.iloc[-1]
    assert last["kind"] == "tool" and pd.isna(last["latency_s"])
    assert list(log.steps["tool_class"].dropna())[1] == "human"  # the format error: a user turn
