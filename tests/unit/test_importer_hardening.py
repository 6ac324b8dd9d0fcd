"""Hostile input folders and files for the log importers: a symbolic link loop among the
inputs, and a gzip bomb (a small .gz that inflates without end). Each ends in one line and
exit 2 naming the path, never a traceback, and the bomb is never inflated whole."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import limits
from harness.cli import main
from harness.errors import InputError
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
