"""The log importers' bounds on what they read and what they say: an error line quotes at most
QUOTE_CHARS of a value from the input and names the source file (never the output), sub-agents
nested past the limit are refused by the file that holds them, and a JSON Lines file is read a
line at a time with a cap on a line's length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.traces.importers._common import QUOTE_CHARS, quote

SID = "11111111-2222-3333-4444-555555555555"


def _import(fmt: str, path: Path, out: Path) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["traces", "import", fmt, str(path), "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


def _one_error_line(code: int, output: str) -> str:
    assert code == 2, output
    assert output.count("\n") == 1 and output.startswith("error: "), output
    return output


# ---------------------------------------------------------------- what an error quotes

def test_quote_keeps_a_short_value_and_cuts_a_long_one() -> None:
    assert quote("bash") == "'bash'"
    assert quote(12) == "12"
    long = quote("x" * 5000)
    assert long.startswith("'xxx") and long.endswith("... (5,002 characters)")
    assert len(long) < QUOTE_CHARS + 40
    assert quote("x" * 50, limit=10) == "'xxxxxxxxx... (52 characters)"


def test_atif_error_quotes_a_long_value_cut(tmp_path: Path) -> None:
    from tests.unit.test_import_atif import agent, doc, step, write
    src = write(tmp_path, doc([step("robot" * 400, "go", at=1), agent(10, 5, at=2)]))
    out = _one_error_line(*_import("atif", src, tmp_path / "out.parquet"))
    assert f"{src}: steps[0]: 'source' must be one of" in out, out
    assert "... (2,002 characters)" in out and len(out) < 400, out


def _nested_atif(depth: int) -> dict[str, object]:
    from tests.unit.test_import_atif import agent, doc, step
    top = doc([step("user", "go", at=1), agent(10, 5, at=2)])
    cur = top
    for i in range(depth):
        kid = doc([step("user", "go", at=1), agent(10, 5, at=2)], session=f"s{i}")
        cur["subagent_trajectories"] = [kid]
        cur = kid
    return top


def test_atif_embedded_sub_agents_too_deep_name_the_file(tmp_path: Path) -> None:
    src = tmp_path / "deep.json"
    src.write_text(json.dumps(_nested_atif(MAX_SUBAGENT_DEPTH + 6)))
    out = _one_error_line(*_import("atif", src, tmp_path / "out.parquet"))
    assert out == f"error: {src}: subagent_trajectories nested deeper than " \
        f"{MAX_SUBAGENT_DEPTH} levels (the limit)\n", out


def test_atif_deep_embedded_error_names_it_briefly(tmp_path: Path) -> None:
    data = _nested_atif(40)
    leaf: dict[str, object] = data
    for _ in range(40):
        leaf = leaf["subagent_trajectories"][0]  # type: ignore[index]
    leaf["steps"] = 7  # not a list: the 40th level is not a trajectory
    src = tmp_path / "deep.json"
    src.write_text(json.dumps(data))
    out = _one_error_line(*_import("atif", src, tmp_path / "out.parquet"))
    where = "/".join(["0"] * 40)
    assert out == f"error: {src}: subagent_trajectories[{where}]: expected an ATIF " \
        "trajectory (a JSON object with 'steps')\n", out


# ---------------------------------------------------------------- Claude Code sub-agent chains

def _claude_chain(root: Path, depth: int) -> Path:
    """A session whose sub-agent starts a sub-agent, `depth` levels down (2.1.x layout)."""
    from tests.unit.test_import_claude_code import T, text, use

    def spawn(t: T, name: str, child: str) -> None:
        t.say(2, f"{name}r1", [use(f"{name}t", "Task", subagent_type="Explore",
                                   prompt=f"go {child}")], 5, 0, 90, 5)
        t.result(40, f"{name}t", "found", tur={"status": "completed", "agentId": child,
                                               "totalDurationMs": 37000})
        t.say(42, f"{name}r2", [text("summary")], 5, 90, 10, 3)

    session = T().prompt(0, "explore")
    spawn(session, "m", "a0")
    path = session.write(root / "proj" / f"{SID}.jsonl")
    for i in range(depth):
        kid = T(agent=f"a{i}", side=True).prompt(2.5, f"go a{i}")
        if i < depth - 1:
            spawn(kid, f"a{i}", f"a{i + 1}")
        else:
            kid.say(4, f"a{i}x", [text("leaf")], 3, 0, 40, 2)
        kid.write(root / "proj" / SID / "subagents" / f"agent-a{i}.jsonl")
    return path


def test_claude_code_chain_at_the_limit_imports(tmp_path: Path) -> None:
    src = _claude_chain(tmp_path, MAX_SUBAGENT_DEPTH)
    code, output = _import("claude-code", src, tmp_path / "out.parquet")
    assert code == 0 and f"{MAX_SUBAGENT_DEPTH + 1} trajectories" in output, output


@pytest.mark.parametrize("depth", [MAX_SUBAGENT_DEPTH + 1, 200])
def test_claude_code_chain_too_deep_names_the_source_file(depth: int, tmp_path: Path) -> None:
    src = _claude_chain(tmp_path, depth)
    out_file = tmp_path / "out.parquet"
    out = _one_error_line(*_import("claude-code", src, out_file))
    deep = src.with_suffix("") / "subagents" / f"agent-a{MAX_SUBAGENT_DEPTH}.jsonl"
    assert out == f"error: {deep}: sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} levels " \
        f"(the limit): agent 'a{MAX_SUBAGENT_DEPTH}' is level {MAX_SUBAGENT_DEPTH + 1}\n", out
    assert str(out_file) not in out and not out_file.exists()
