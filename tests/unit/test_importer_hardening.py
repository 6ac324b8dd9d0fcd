"""Hostile input folders and files for the log importers: a symbolic link loop among the
inputs, and a gzip bomb (a small .gz that inflates without end). Each ends in one line and
exit 2 naming the path, never a traceback, and the bomb is never inflated whole. Logs whose
times run backwards import with a clock-skew warning and count; a recording whose sub-agents'
parents form a cycle imports every conversation."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness import limits
from harness.cli import main
from harness.errors import InputError
from harness.traces.schema import read_provenance
from harness.userfiles import read_bytes, read_json

# Each format that takes folders, with a name its folder walk picks up.
LOOP_NAMES = {
    "codex": "rollout-loop.jsonl",
    "claude-code": "loop.jsonl",
    "otel-genai": "loop.json",
    "atif": "loop.json",
    "kv-cache-tester": "loop.json",
}


def _import(fmt: str, path: Path, out: Path) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["traces", "import", fmt, str(path), "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("fmt", sorted(LOOP_NAMES))
@pytest.mark.parametrize("shape", ["self", "pair"])
def test_symlink_loop_in_a_folder_is_named(fmt: str, shape: str, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    name = LOOP_NAMES[fmt]
    if shape == "self":  # a link to itself
        (folder / name).symlink_to(name)
    else:  # two links naming each other
        other = name.replace("loop", "loop2")
        (folder / name).symlink_to(other)
        (folder / other).symlink_to(name)
    (folder / "up").symlink_to(".")  # a folder loop: the walk must not follow it
    code, output = _import(fmt, folder, tmp_path / "out.parquet")
    assert code == 2, output
    assert output.count("\n") == 1, output
    assert "symbolic link loop" in output and str(folder) in output, output
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("fmt", sorted(LOOP_NAMES))
def test_symlink_loop_named_directly_is_named(fmt: str, tmp_path: Path) -> None:
    link = tmp_path / LOOP_NAMES[fmt]
    link.symlink_to(link.name)
    code, output = _import(fmt, link, tmp_path / "out.parquet")
    assert code == 2 and output == f"error: {link}: symbolic link loop (a link that leads back " \
        "to itself)\n", output


def test_dangling_link_is_named(tmp_path: Path) -> None:
    link = tmp_path / "gone.json"
    link.symlink_to(tmp_path / "missing.json")
    code, output = _import("atif", link, tmp_path / "out.parquet")
    assert code == 2 and output == f"error: {link}: symbolic link to nothing\n", output


CAP = 1 << 20  # a test-only cap: the real one (512 MiB) would take seconds to reach
BOMB = 64 << 20  # inflated size, 64 times the cap


def _bomb(path: Path, head: bytes, fill: bytes) -> Path:
    """A gzip file inflating to BOMB bytes, written a chunk at a time (~64 KB on disk)."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(head)
        chunk = fill * ((1 << 20) // len(fill))
        for _ in range(BOMB // len(chunk)):
            fh.write(chunk)
    return path


@pytest.fixture
def low_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(limits, "MAX_INFLATED_BYTES", CAP)
    return CAP


def test_the_cap_is_far_above_real_traces() -> None:
    # The largest real gzipped trace inflates to 3.6 MB (a kv-cache-tester conversation).
    assert limits.MAX_INFLATED_BYTES >= 100 * 4_000_000


def test_read_bytes_stops_at_the_cap(low_cap: int, tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "b.json.gz", b'{"a": "', b"x")
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"b\.json\.gz: inflates to more than 1 MiB"):
            read_bytes(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * low_cap, peak  # bounded by the cap, not by the 64 MiB inside
    with pytest.raises(InputError, match="inflates to more than"):
        read_json(bomb)


def test_read_bytes_under_the_cap(low_cap: int, tmp_path: Path) -> None:
    small = tmp_path / "s.json.gz"
    small.write_bytes(gzip.compress(b'{"a": 1}'))
    assert bytes(read_bytes(small)) == b'{"a": 1}'
    assert read_json(small) == {"a": 1}
    exact = tmp_path / "e.json.gz"
    exact.write_bytes(gzip.compress(b" " * (low_cap - 2) + b"[]"))
    assert read_json(exact) == []  # at the cap exactly: read


@pytest.mark.parametrize(("fmt", "name", "head", "fill"), [
    ("kv-cache-tester", "trace_0001.json.gz", b'{"id": "', b"x"),
    ("atif", "t.json.gz", b'{"schema_version": "ATIF-v1.4", "steps": [', b"{},"),
    ("otel-genai", "spans.json.gz", b'{"resourceSpans": [', b" "),
    ("otel-genai", "spans.jsonl.gz", b'{"a": "', b"y"),  # one endless line
    ("mini-swe-agent", "t.traj.json.gz", b'{"messages": "', b"z"),
])
def test_gzip_bomb_is_refused_by_name(fmt: str, name: str, head: bytes, fill: bytes,
                                      low_cap: int, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    bomb = _bomb(folder / name, head, fill)
    assert bomb.stat().st_size < low_cap  # small on disk, 64 times the cap inflated
    code, output = _import(fmt, folder, tmp_path / "out.parquet")
    assert code == 2, output
    assert output == f"error: {bomb}: inflates to more than 1 MiB, the limit on a gzipped " \
        "input\n", output


# ---------------------------------------------------------------- times that run backwards

def _skewed_codex(folder: Path) -> Path:
    from tests.unit.test_import_codex import answer, call, meta, output, usage, user, write
    return write(folder, [  # a result before its call, then a prompt before the last answer
        meta(), *user(1), call(10, "c1"), usage(10.5, 1000, 50, total=(1000, 0, 50)),
        output(4, "c1"), answer(20), usage(20.5, 1100, 20, cached=1000, total=(2100, 1000, 70)),
        *user(12, "next"), answer(30), usage(30.5, 1200, 10, cached=1100, total=(3300, 2100, 80)),
    ])


def _skewed_claude_code(folder: Path) -> Path:
    from tests.unit.test_import_claude_code import SID, T, text, use
    t = T().prompt(1, "fix it")
    t.say(10, "r1", [use("t1", "Bash", command="ls")], 3, 1000, 0, 5)
    t.result(4, "t1", "a.py")  # before its call
    t.say(20, "r2", [text("done")], 4, 1000, 20, 5)
    t.prompt(12, "and now?")  # before the answer it follows
    t.say(30, "r3", [text("nothing")], 4, 1030, 20, 5)
    return t.write(folder / f"{SID}.jsonl")


def _skewed_atif(folder: Path) -> Path:
    from tests.unit.test_import_atif import agent, doc, step, write
    folder.mkdir(parents=True, exist_ok=True)
    return write(folder, doc([
        step("user", "Fix the bug.", at=1), agent(100, 10, ("bash",), {"c0": "ok"}, at=10),
        agent(150, 5, at=5),  # the step that times bash comes 5 s before it
        step("user", "More.", at=2), agent(170, 7, at=20)]))


SKEWED = {"codex": (_skewed_codex, 2), "claude-code": (_skewed_claude_code, 2),
          "atif": (_skewed_atif, 2)}


@pytest.mark.parametrize("fmt", sorted(SKEWED))
def test_times_running_backwards_are_counted_and_warned(fmt: str, tmp_path: Path) -> None:
    make, n = SKEWED[fmt]
    src = make(tmp_path / "in")
    out = tmp_path / "out.parquet"
    code, output = _import(fmt, src, out)
    assert code == 0, output
    lines = [ln for ln in output.splitlines() if "clock skew" in ln]
    assert len(lines) == 1 and f"{src}: {n}" in lines[0], output
    prov = read_provenance(out)
    assert prov is not None
    assert prov.extra["files"][0]["clock_skew"] == n
    assert prov.extra["totals"]["clock_skew"] == n


@pytest.mark.parametrize("fmt", sorted(SKEWED))
def test_times_running_forward_record_no_skew(fmt: str, tmp_path: Path) -> None:
    from tests.unit import test_import_atif, test_import_claude_code, test_import_codex
    folder = tmp_path / "in"
    folder.mkdir()
    if fmt == "codex":
        src = test_import_codex.write(folder, test_import_codex.BASIC)
    elif fmt == "claude-code":
        src = test_import_claude_code.basic().write(folder / "s.jsonl")
    else:
        a = test_import_atif
        src = a.write(folder, a.doc([a.step("user", "Go.", at=1),
                                     a.agent(100, 10, ("bash",), {"c0": "ok"}, at=2),
                                     a.agent(150, 5, at=7)]))
    out = tmp_path / "out.parquet"
    code, output = _import(fmt, src, out)
    assert code == 0 and "clock skew" not in output, output
    prov = read_provenance(out)
    assert prov is not None and "clock_skew" not in prov.extra["files"][0]


# ---------------------------------------------------------------- recordings with parent cycles

def _recording_with_parents(tmp_path: Path, parents: dict[int, list[Any]]) -> Path:
    """A recording of a parent and its sub-agent, with the `parent` of calls rewritten."""
    import asyncio
    import json

    from harness.proxy.store import EVENTS
    from tests.unit.test_record_import import _parent_with_subagent
    asyncio.run(_parent_with_subagent(tmp_path, True))
    events = tmp_path / "rec" / EVENTS
    lines = []
    for raw in events.read_text().splitlines():
        e = json.loads(raw)
        if e.get("ev") == "call" and e.get("id") in parents:
            e["how"], e["parent"] = "subagent", parents[e["id"]]
        lines.append(json.dumps(e))
    events.write_text("\n".join(lines) + "\n")
    return tmp_path / "rec"


# The recording's calls: c1 is 1, 2, 3 and 6 (3 spawns c2), c2 is 4 and 5.
CYCLES = {"self": {4: ["c2", 5]}, "pair": {1: ["c2", 5]}}


@pytest.mark.parametrize("shape", sorted(CYCLES))
def test_recording_parent_cycles_import_every_conversation(shape: str, tmp_path: Path) -> None:
    rec = _recording_with_parents(tmp_path, CYCLES[shape])
    out = tmp_path / "out.parquet"
    code, output = _import("recording", rec, out)
    assert code == 0, output
    n = 1 if shape == "self" else 2  # each conversation on the cycle
    lines = [ln for ln in output.splitlines() if "a cycle" in ln]
    assert len(lines) == 1 and f"{rec}: {n}" in lines[0], output
    prov = read_provenance(out)
    assert prov is not None
    totals = prov.extra["totals"]
    assert totals["subagents_orphaned"] == n and totals["conversations"] == 2
    assert totals["trajectories"] == 2 and totals["llm_steps"] == 6  # no call dropped
