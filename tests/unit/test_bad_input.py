"""Bad input and unusable result locations: one line, exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
BASELINE = ROOT / "reports" / "baseline" / "keep"


def _one_line_exit_2(res: Result, *words: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in res.output


def _run(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--trace",
                                     str(TRACE), "--policy", "keep", *args])


def test_out_naming_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    _one_line_exit_2(_run(tmp_path, "--out", str(tmp_path / "f")), "--out", "is a file")


def test_an_injection_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'a = "\xff\xfe"\n')
    _one_line_exit_2(_run(tmp_path, "--inject", str(bad), "--out", str(tmp_path / "o")),
                     "not UTF-8")


@pytest.mark.parametrize("url", ["htp:/x", "127.0.0.1:8080", "http://", "ftp://host"])
def test_a_malformed_url(url: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", "--url", url, "--trace", str(TRACE), "--policy",
                                    "keep", "--out", str(tmp_path / "o")])
    _one_line_exit_2(res, "--url")


def test_deeply_nested_json_in_an_importer(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    res = CliRunner().invoke(main, ["traces", "import", "openai-chat", str(deep), "--out",
                                    str(tmp_path / "x.parquet")])
    _one_line_exit_2(res, "nested too deeply")


@pytest.mark.parametrize("cmd", [["traces", "gen", "--profile", "bench-small",
                                  "--trajectories", "2"],
                                 ["traces", "import", "openai-chat", str(TRACE)]])
def test_out_naming_a_directory_for_a_file(cmd: list[str], tmp_path: Path) -> None:
    _one_line_exit_2(CliRunner().invoke(main, [*cmd, "--out", str(tmp_path)]),
                     "is a directory")


def test_a_full_disk_while_writing_results(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import harness.metrics.summary_types as summary_types

    run = tmp_path / "keep"
    shutil.copytree(BASELINE, run)

    def full(path: Path, _: object) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(summary_types, "write_json", full)
    res = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "r.html")])
    _one_line_exit_2(res, "No space left on device", "summary.json")


def test_a_trace_given_as_a_directory(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--trace",
                                    str(tmp_path), "--policy", "keep", "--out",
                                    str(tmp_path / "o")])
    _one_line_exit_2(res, "is a directory")
