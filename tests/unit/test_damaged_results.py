"""`report`, `compare`, `history` and `export` on results directories damaged after the run (a
records part copied in twice, cut short, or stripped of its columns; run.json fields of the
wrong kind) and `report` on a capacity or advice root whose file is garbage or of the wrong
shape: one line naming the file, exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from html import unescape
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.metrics.summary import summarize_dir
from harness.report.data import load_run

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


# Damage that leaves something to report: `report` makes the report of what reads.
SALVAGED = ("a records part twice", "run.json host a number", "run.json outcome a string",
            "run.json trace a string", "run.json not JSON")


@pytest.mark.parametrize("command", ["report", "compare", "history", "export"])
@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_results_are_named_in_one_line(tmp_path: Path, case: str,
                                               command: str) -> None:
    if command == "report" and case in SALVAGED:
        pytest.skip("report makes the report of what reads (test_report_of_what_reads)")
    d = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    (d / "summary.json").unlink(missing_ok=True)  # read from the records, as a new run is
    damage, words = DAMAGES[case]
    damage(d)
    res = CliRunner().invoke(main, _commands(d, tmp_path)[command])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.output
    assert str(d) in lines[0]


def _split_in_two(d: Path) -> None:
    """The records as two parts (as a longer run writes them)."""
    p = _part(d)
    table = pq.read_table(p)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), p)
    pq.write_table(table.slice(half), d / "records" / "part-99998.parquet")


def _cut_second_of_two(d: Path) -> None:
    _split_in_two(d)
    p = d / "records" / "part-99998.parquet"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])


def _garbage_server_metrics(d: Path) -> None:
    (d / "server_metrics").mkdir(exist_ok=True)
    (d / "server_metrics" / "part-00000.parquet").write_bytes(b"not parquet at all")


@pytest.mark.parametrize("damage,words", [
    *[(DAMAGES[c][0], DAMAGES[c][1] if c != "a records part twice" else "copied in twice")
      for c in SALVAGED],
    (_cut_second_of_two, "unreadable records part"),
    (_garbage_server_metrics, "unreadable server metrics"),
])
def test_report_of_what_reads(tmp_path: Path, damage: Callable[[Path], None],
                              words: str) -> None:
    """A damaged directory with something left to read: `report` writes the report of what
    reads, says the damage on stderr in one line and first in the health section (a failed
    check), and leaves summary.json unwritten."""
    d = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    (d / "summary.json").unlink(missing_ok=True)
    damage(d)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(d), "--out", str(out)])
    assert res.exit_code == 0, res.output
    warning = [ln for ln in res.output.splitlines() if ln.startswith("warning: ")]
    assert len(warning) == 1 and str(d) in warning[0] and words in warning[0], res.output
    html = unescape(out.read_text())
    assert "damaged" in html and words in html
    assert not (d / "summary.json").exists()
    health = summarize_dir_salvaged(d)
    assert health[0]["check"] == "readable" and health[0]["status"] == "fail"


def summarize_dir_salvaged(d: Path) -> list[dict[str, str]]:
    return list(load_run(d, salvage=True).summary["health"])


def test_two_whole_parts_read_as_one(tmp_path: Path) -> None:
    """Splitting the records into parts is not damage: the same summary, nothing left out."""
    d = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    _split_in_two(d)
    run = load_run(d, salvage=True)
    assert run.damage == []
    whole = load_run(BASELINE)
    assert run.summary["resume_latency_ms"] == whole.summary["resume_latency_ms"]


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


def _split_drop_second_half(d: Path) -> None:
    """Records as if their later part had been deleted: only the first half of the rows."""
    p = _part(d)
    table = pq.read_table(p)
    pq.write_table(table.slice(0, table.num_rows // 2), p)


def _drop_call_ends(d: Path) -> None:
    p = _part(d)
    table = pq.read_table(p)
    keep = [e != "call_end" for e in table.column("event").to_pylist()]
    pq.write_table(table.filter(keep), p)


def _shift_last_event(d: Path) -> None:
    """One timestamp edited far past the run's end (a client lag of days, as it would read)."""
    p = _part(d)
    table = pq.read_table(p)
    t = table.column("t_ns").to_pylist()
    t[-1] = t[-1] + 4_600_000 * 10**9
    pq.write_table(table.set_column(table.schema.get_field_index("t_ns"), "t_ns",
                                    pa.array(t, type=table.schema.field("t_ns").type)), p)


@pytest.mark.parametrize("damage,words", [
    (_split_drop_second_half, "run.json counts"),
    (_drop_call_ends, "started and never ended"),
    (_shift_last_event, "into a run that lasted"),
])
def test_records_that_disagree_are_said_in_health(tmp_path: Path,
                                                  damage: Callable[[Path], None],
                                                  words: str) -> None:
    """Records edited or damaged in ways that still read: the summary and the report are made,
    and the health section says what does not add up."""
    d = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    (d / "summary.json").unlink(missing_ok=True)
    damage(d)
    health = {c["check"]: c for c in summarize_dir(d)["health"]}
    assert health["records"]["status"] == "warn" and words in health["records"]["detail"]
    res = CliRunner().invoke(main, ["report", str(d), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert words in (tmp_path / "r.html").read_text()


def test_whole_records_are_said_to_agree() -> None:
    health = {c["check"]: c for c in summarize_dir(BASELINE)["health"]}
    assert health["records"]["status"] == "ok"
