"""`report`, `compare`, `history` and `export` on results directories damaged after the run (a
records part copied in twice, cut short, or stripped of its columns; run.json fields of the
wrong kind) and `report` on a capacity or advice root whose file is garbage or of the wrong
shape: one line naming the file, exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline" / "keep"


def _part(d: Path) -> Path:
    return sorted((d / "records").glob("part-*.parquet"))[0]


def _copy_part(d: Path) -> None:
    shutil.copy(_part(d), d / "records" / "part-99999.parquet")


def _only_event(d: Path) -> None:
    for p in (d / "records").glob("part-*.parquet"):
        pq.write_table(pq.read_table(p).select(["event"]), p)


def _cut(d: Path) -> None:
    p = _part(d)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])


def _field(name: str, value: object) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        doc = json.loads((d / "run.json").read_text())
        doc[name] = value
        (d / "run.json").write_text(json.dumps(doc))
    return damage


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "a records part twice": (_copy_part, "recorded twice"),
    "only the event column": (_only_event, "without the column(s) run_id, seq, t_ns"),
    "a records part cut short": (_cut, "unreadable records part"),
    "run.json host a number": (_field("host", 7), "'host' must be an object"),
    "run.json outcome a string": (_field("outcome", "done"), "'outcome' must be an object"),
    "run.json trace a string": (_field("trace", "x.parquet"), "'trace' must be an object"),
    "run.json not JSON": (lambda d: (d / "run.json").write_text("{nope"), "not valid JSON"),
}


def _commands(d: Path, tmp: Path) -> dict[str, list[str]]:
    return {"report": ["report", str(d), "--out", str(tmp / "r.html")],
            "compare": ["compare", str(BASELINE), str(d)],
            "history": ["history", str(d), "--out", str(tmp / "h.html")],
            "export": ["export", str(d)]}


@pytest.mark.parametrize("command", ["report", "compare", "history", "export"])
@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_results_are_named_in_one_line(tmp_path: Path, case: str,
                                               command: str) -> None:
    d = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    (d / "summary.json").unlink(missing_ok=True)  # read from the records, as a new run is
    damage, words = DAMAGES[case]
    damage(d)
    res = CliRunner().invoke(main, _commands(d, tmp_path)[command])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.output
    assert str(d) in lines[0]


@pytest.mark.parametrize("name,text,words", [
    ("capacity.json", "garbage{", "not valid JSON"),
    ("capacity.json", '{"kind": "capacity", "policies": 5}', "not the shape harness writes"),
    ("capacity.json", "[1, 2]", "expected a JSON object"),
    ("advice.json", '{"kind": "advice", "confirmed": 3}', "not the shape harness writes"),
])
def test_a_damaged_search_file_is_named(tmp_path: Path, name: str, text: str,
                                        words: str) -> None:
    (tmp_path / name).write_text(text)
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and name in lines[0], res.output
