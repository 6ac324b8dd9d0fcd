"""`make bench`'s tables, word for word as recorded: the headline, retention and health lines of
the committed results (reports/baseline, tests/data/llamacpp-bench-small), from their stored
summary.json and from a summary recomputed from their records. A change to how results are
written, read or typed changes none of these lines; a change meant to alter the table
re-records it: `python tests/unit/test_bench_table_recorded.py --record`."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.bench.table import headline_table, health_lines, retention_table
from harness.metrics.summary import summarize_dir
from harness.metrics.summary_types import Summary, read_summary

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "bench-tables" / "headline.txt"
RESULTS = (ROOT / "reports" / "baseline", ROOT / "tests" / "data" / "llamacpp-bench-small")


def tables() -> str:
    """Each committed bench's tables as the bench command prints them, then its headline again
    from summaries recomputed from the records."""
    out: list[str] = []
    for root in RESULTS:
        dirs = sorted(p for p in root.iterdir() if (p / "run.json").exists())
        rows: list[tuple[str, Summary]] = [(d.name, read_summary(d)) for d in dirs]
        out.append(headline_table(rows))
        out.append(retention_table(rows) or "")
        out += health_lines(rows)
        out.append(headline_table([(d.name, summarize_dir(d)) for d in dirs]))
    return "\n".join(out) + "\n"


def test_the_bench_tables_are_as_recorded() -> None:
    assert tables() == RECORDED.read_text()


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORDED.write_text(tables())
