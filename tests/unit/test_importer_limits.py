"""The log importers' bounds on what they read and what they say: an error line quotes at most
QUOTE_CHARS of a value from the input and names the source file (never the output), sub-agents
nested past the limit are refused by the file that holds them, and a JSON Lines file is read a
line at a time with a cap on a line's length."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import limits
from harness.cli import main
from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.traces.importers import import_trace
from harness.traces.importers._common import ERROR_CHARS, QUOTE_CHARS, clip_error, quote
from harness.userfiles import read_jsonl, read_lines

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


# ---------------------------------------------------------------- JSON Lines, a line at a time

def _lines(path: Path, lines: list[bytes]) -> Path:
    data = b"".join(lines)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_a_line_past_its_cap_is_named(name: str, tmp_path: Path) -> None:
    p = _lines(tmp_path / name, [b'{"a": 1}\n', b'{"b": "' + b"x" * 100 + b'"}\n'])
    assert read_jsonl(p, line_cap=200) == [(1, {"a": 1}), (2, {"b": "x" * 100})]
    with pytest.raises(InputError, match=rf"^{p}: line 2 is longer than 100 bytes, the limit "
                                         "on a line of JSON Lines$"):
        read_jsonl(p, line_cap=100)
    lines = read_lines(p, line_cap=9)  # one line at a time: the first is read, then refused
    assert next(lines) == (1, b'{"a": 1}\n')
    with pytest.raises(InputError, match="line 2 is longer than 9 bytes"):
        next(lines)


def test_a_gzipped_stream_past_its_cap_is_named(tmp_path: Path) -> None:
    p = _lines(tmp_path / "t.jsonl.gz", [b'{"a": 1}\n'] * 1000)
    assert len(read_jsonl(p, inflated_cap=9000)) == 1000  # exactly at the cap: read
    with pytest.raises(InputError, match=rf"^{p}: inflates to more than 8,999 bytes, the limit on "
                                         "a gzipped input$"):
        read_jsonl(p, inflated_cap=8999)


def test_a_bad_line_is_named_by_number(tmp_path: Path) -> None:
    p = _lines(tmp_path / "t.jsonl", [b'{"a": 1}\n', b"\n", b"{bad\n"])
    with pytest.raises(InputError, match=rf"^{p}: line 3: not valid JSON: "):
        read_jsonl(p)
    p = _lines(tmp_path / "u.jsonl", [b'{"a": 1}\n', b'"\xff"\n'])
    with pytest.raises(InputError, match=rf"^{p}: not UTF-8 text \(after line 1\)$"):
        read_jsonl(p)
    p = tmp_path / "v.jsonl.gz"
    p.write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match=rf"^{p}: cannot read: "):
        read_jsonl(p)


def test_otel_jsonl_gz_line_past_the_real_cap_is_one_line(tmp_path: Path) -> None:
    """A .jsonl.gz of one endless line (65 KB on disk, 65 MiB inflated) is refused at the
    line cap, a line at a time: it used to be inflated whole and split (1.2 GB RSS for a
    500 MiB line under the inflated cap; 0.34 GB now)."""
    p = tmp_path / "spans.jsonl.gz"
    with gzip.open(p, "wb", compresslevel=1) as fh:
        fh.write(b'{"resourceSpans": "')
        for _ in range(limits.MAX_LINE_BYTES // (1 << 20) + 1):
            fh.write(b"x" * (1 << 20))
    out = _one_error_line(*_import("otel-genai", p, tmp_path / "out.parquet"))
    assert out == f"error: {p}: line 1 is longer than 64 MiB, the limit on a line of JSON " \
        "Lines\n", out


def test_otel_jsonl_holding_one_document_on_several_lines_imports(tmp_path: Path) -> None:
    from tests.unit.test_import_otel_genai import BASIC, otlp
    one = tmp_path / "one.json"
    one.write_text(json.dumps(otlp(BASIC)))
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text(json.dumps(otlp(BASIC), indent=2))
    want = import_trace("otel-genai", one, {}).steps
    got = import_trace("otel-genai", pretty, {}).steps
    assert got["kind"].tolist() == want["kind"].tolist()
    assert got["input_tokens"].tolist() == want["input_tokens"].tolist()


def test_a_deep_place_is_cut_in_the_middle_of_one_line(tmp_path: Path) -> None:
    """kv-cache-tester names a place by its chain of sub-agents: 60 levels of long agent ids
    made a line of ~20,000 characters; it is cut in the middle, keeping the file and the
    fault, and each id to QUOTE_CHARS."""
    from tests.unit.test_import_kv_cache_tester import OK, sub, write
    inner: list[dict[str, object]] = [{**OK, "in": "seven"}]
    for i in range(60):
        inner = [OK, sub(f"agent-{i}-" + "z" * 300, "Explore", 1, 5, inner)]
    src = write(tmp_path, inner)
    out = _one_error_line(*_import("kv-cache-tester", src, tmp_path / "out.parquet"))
    assert out.startswith(f"error: {src}: requests[1] (sub-agent agent-59-zzz"), out
    assert out.endswith("(308 characters)): requests[0]: 'in' must be an integer >= 0, got "
                        "'seven'\n"), out
    assert " ... " in out and len(out) <= ERROR_CHARS + 20, len(out)


def test_clip_error_keeps_a_short_line() -> None:
    assert clip_error("a: b") == "a: b"
    assert clip_error("h" * 50 + "t" * 50, limit=10) == "hhhhhh ... tttt"
