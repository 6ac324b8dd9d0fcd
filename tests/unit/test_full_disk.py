"""A full disk (ENOSPC) when a run starts, in the middle of a run, and under `report`: one line
naming the path (exit 2), what was measured before kept readable, run.json ended (never left
`running`), no temporary or reserve file left behind. The disk fills where the harness writes:
pyarrow's part writes and the text files, failing as they do (an OSError naming no file)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import harness.records.atomic as atomic
import harness.records.parts as parts
import harness.replay.runner as runner
from harness.cli import main
from harness.records.store import read_records
from harness.selftest import measure
from tests.unit.test_damaged_results import BASELINE

ENOSPC = 28


def _full() -> OSError:
    # as the OS and pyarrow raise it: an errno, and no file named
    return OSError(ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left")


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    s = measure.start_stub(0.0, slots=4)
    try:
        yield s.url
    finally:
        s.stop()


def _run(stub: str, tmp_path: Path, out: Path) -> Result:
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 8, 6, 0.05, 4)
    return CliRunner().invoke(main, ["run", "--url", stub, "--trace", str(trace), "--policy",
                                     "keep", "--concurrency", "4", "--out", str(out)])


def _one_line(res: Result, *words: str) -> str:
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert "No space left on device" in errors[0], errors[0]
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if p.name.endswith((".tmp", ".reserve")))


def test_full_when_the_run_starts(stub: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_room(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        raise _full()

    monkeypatch.setattr(atomic, "open", no_room, raising=False)
    out = tmp_path / "run"
    _one_line(_run(stub, tmp_path, out), str(out / ".run.json.reserve"))
    assert not (out / "run.json").exists() and _leftovers(out) == []


def test_full_in_the_middle_of_a_run(stub: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real = parts.pq.write_table
    written: list[str] = []

    def fills_after_two(table: Any, where: Any, **kwargs: Any) -> None:
        """The disk fills once two records parts are on it (whatever is written next)."""
        if sum("records" in w for w in written) >= 2:
            Path(where).write_bytes(b"PAR1")  # a part cut short, as a full disk leaves it
            raise _full()
        written.append(str(where))
        real(table, where, **kwargs)

    monkeypatch.setattr(parts.pq, "write_table", fills_after_two)
    monkeypatch.setattr(runner, "PartWriter", _small_parts(parts.PartWriter))
    out = tmp_path / "run"
    line = _one_line(_run(stub, tmp_path, out), ".parquet", str(out))
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    assert run["outcome"]["server_failed"] == 0  # the disk's fault, never the server's
    assert run["stop_reason"].startswith("results could not be written: ")
    assert "No space left on device" in run["stop_reason"] and line.split(": ", 1)[1].split(
        ":")[0].removeprefix("cannot write ") in run["stop_reason"]
    assert _leftovers(out) == []
    assert len(read_records(out)) > 0  # what the parts before the disk filled hold
    res = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "results could not be written" in (tmp_path / "r.html").read_text()


def _small_parts(cls: Any) -> Any:
    """PartWriter flushing every 50 ms, so a short run writes several parts."""
    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs["flush_s"] = 0.05
        return cls(*args, **kwargs)
    return make


def test_full_under_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Path(shutil.copytree(BASELINE, tmp_path / "run"))
    out = tmp_path / "r.html"
    out.write_text("the report before")
    real = Path.write_text

    def full(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name.endswith(".tmp"):
            real(self, data[:10], *args, **kwargs)  # a partial write, then the disk is full
            raise _full()
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    _one_line(CliRunner().invoke(main, ["report", str(run), "--out", str(out)]))
    assert out.read_text() == "the report before"
    assert _leftovers(tmp_path) == []
