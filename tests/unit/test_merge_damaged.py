"""`harness merge` on shards damaged after the run (a records or server-metrics part truncated,
garbage, empty or missing a column; a run.json field of the wrong kind): one line naming the
file, exit 2, nothing merged; never a traceback."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.selftest import measure


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two good shards of one run on the stub, made once; each case damages a copy."""
    root = tmp_path_factory.mktemp("shards")
    trace = measure.synthetic_trace(root / "t.parquet", 4, 2, 0.0, 2)
    stub = measure.start_stub(0.0, slots=4)
    start = time.time() + 0.5
    dirs = [root / f"s{i}" for i in range(2)]
    try:
        for i, d in enumerate(dirs):
            res = CliRunner().invoke(main, [
                "run", "--url", stub.url, "--trace", str(trace), "--policy", "keep",
                "--shard", f"{i}/2", "--start-at", f"{start}", "--out", str(d),
                "--scrape-interval", "0.05"])
            assert res.exit_code == 0, res.output
    finally:
        stub.stop()
    return dirs


def _first_part(shard: Path, folder: str) -> Path:
    return sorted((shard / folder).glob("part-*.parquet"))[0]


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _drop_event_column(p: Path) -> None:
    table = pq.read_table(p)
    pq.write_table(table.drop_columns(["event"]), p)


def _run_json(field: str, value: object) -> Callable[[Path], None]:
    def damage(shard: Path) -> None:
        doc = json.loads((shard / "run.json").read_text())
        doc[field] = value
        (shard / "run.json").write_text(json.dumps(doc))
    return damage


DAMAGES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "records part truncated": (lambda s: _truncate(_first_part(s, "records")),
                               ("records part", "cannot be read", "part-")),
    "records part garbage": (lambda s: _first_part(s, "records").write_bytes(b"\x00garbage" * 64),
                             ("records part", "cannot be read")),
    "records part zero bytes": (lambda s: _first_part(s, "records").write_bytes(b""),
                                ("records part", "cannot be read")),
    "records part without event": (lambda s: _drop_event_column(_first_part(s, "records")),
                                   ("records part without the column(s) event",)),
    "server-metrics part garbage": (
        lambda s: _first_part(s, "server_metrics").write_bytes(b"PAR1 not really PAR1"),
        ("server-metrics part", "cannot be read")),
    "run.json outcome a string": (_run_json("outcome", "lots"),
                                  ("run.json", "'outcome' must be an object, got str")),
    "run.json trace a string": (_run_json("trace", "t.parquet"),
                                ("run.json", "'trace' must be an object, got str")),
    "run.json host a number": (_run_json("host", 7), ("run.json", "'host' must be an object")),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_shard_is_named_in_one_line(shards: list[Path], tmp_path: Path,
                                              case: str) -> None:
    copies = [Path(shutil.copytree(s, tmp_path / s.name)) for s in shards]
    damage, words = DAMAGES[case]
    hurt = 0 if "server-metrics" in case else 1  # only shard 0 samples the server
    damage(copies[hurt])
    res = CliRunner().invoke(main, ["merge", *map(str, copies), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(w in lines[0] for w in words), lines[0]
    assert str(copies[hurt]) in lines[0]  # the shard named
    assert not (tmp_path / "m" / "records").exists()


def test_the_undamaged_shards_still_merge(shards: list[Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["merge", *map(str, shards), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
