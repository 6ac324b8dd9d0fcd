"""Both views of one real client session agree: a recording by `harness record` and the
client's own log, written by benchmarks/record_real_clients.py from the real client (its model's
answers scripted, the client, its log and the proxy real) and kept text-free in tests/data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.traces.compare_views import compare_views
from harness.traces.importers import import_trace

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
    for line in path.read_text().splitlines():
        doc = json.loads(line) if line.startswith("{") and path.suffix == ".jsonl" else None
        if doc is None:
            continue
        for key in ("text", "output", "base_instructions", "user_instructions", "body"):
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
    from click.testing import CliRunner

    from harness.cli import main

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
