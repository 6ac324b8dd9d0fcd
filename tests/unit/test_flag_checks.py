"""Flags every command checks alike (harness.commands.options.Command): a flag given twice, a
number that is not finite, a URL that does not parse, a header or API key that would break the
request; and counts that size memory, bounded. Each ends in one line and exit 2 before anything
starts (the run's --url points where no server listens: nothing may reach it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from harness.cli import main
from harness.commands.options import Command

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
CALIBRATION = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"
NOWHERE = "http://127.0.0.1:9"
SECRET = "sk-secret-value"


def _one_line_exit_2(res: Result, *words: str) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _run(tmp_path: Path, *args: str) -> list[str]:
    return ["run", "--url", NOWHERE, "--trace", str(TRACE), "--policy", "keep", "--out",
            str(tmp_path / "o"), *args]


def _simulate(tmp_path: Path, *args: str) -> list[str]:
    return ["simulate", "--trace", str(TRACE), "--policy", "keep", "--calibration",
            str(CALIBRATION), "--slots", "4", "--ctx-per-slot", "4096", "--out",
            str(tmp_path / "o"), *args]


def _capacity(tmp_path: Path, *args: str) -> list[str]:
    return ["capacity", "--url", NOWHERE, "--trace", str(TRACE), "--out", str(tmp_path / "o"),
            *args]


def _advise(tmp_path: Path, *args: str) -> list[str]:
    return ["advise", "--url", NOWHERE, "--trace", str(TRACE), "--calibration",
            str(CALIBRATION), "--slo", "resume_p95=2s", "--out", str(tmp_path / "o"), *args]


CASES = {
    # a flag that takes one value, given twice: refused, never the last silently kept
    "capacity --slo twice": (lambda t: _capacity(t, "--slo", "resume_p95=2s", "--slo",
                                                 "success=0.9"),
                             ("--slo", "more than once")),
    "run --policy twice": (lambda t: _run(t, "--policy", "swap"), ("--policy", "more than once")),
    "bench --runtime twice": (lambda t: ["bench", "--runtime", "llamacpp", "--runtime", "vllm"],
                              ("--runtime", "more than once")),
    # numbers that are not finite, wherever a float is read
    "capacity --resolution nan": (lambda t: _capacity(t, "--slo", "resume_p95=2s",
                                                      "--resolution", "nan"),
                                  ("--resolution", "finite")),
    "advise --tolerance nan": (lambda t: _advise(t, "--tolerance", "nan"),
                               ("--tolerance", "finite")),
    "run --time-scale inf": (lambda t: _run(t, "--time-scale", "inf"),
                             ("--time-scale", "finite")),
    "run --rate nan": (lambda t: _run(t, "--rate", "nan"), ("--rate", "finite")),
    "run --stall-timeout nan": (lambda t: _run(t, "--stall-timeout", "nan"),
                                ("--stall-timeout", "finite")),
    "compare --threshold nan": (lambda t: ["compare", str(t), str(t), "--threshold", "nan"],
                                ("--threshold", "finite")),
    "simulate --default-deadline-s nan": (
        lambda t: _simulate(t, "--default-deadline-s", "nan"),
        ("--default-deadline-s", "finite")),
    # counts that size memory
    "simulate --servers 1e9": (lambda t: _simulate(t, "--servers", "1000000000"),
                               ("--servers", "[1, 1,024]")),
    "simulate --concurrency 1e9": (lambda t: _simulate(t, "--concurrency", "1000000000"),
                                   ("--concurrency", "[1, 100,000]")),
    "simulate --slots 1e9": (lambda t: ["simulate", "--trace", str(TRACE), "--policy", "keep",
                                        "--calibration", str(CALIBRATION), "--slots",
                                        "1000000000", "--ctx-per-slot", "4096", "--out",
                                        str(t / "o")], ("--slots", "[1, 65,536]")),
    # URLs that do not parse
    "run --url unclosed IPv6": (lambda t: ["run", "--url", "http://[::1", "--trace", str(TRACE),
                                           "--policy", "keep", "--out", str(t / "o")],
                                ("--url",)),
    "run --url port out of range": (lambda t: ["run", "--url", "http://127.0.0.1:99999",
                                               "--trace", str(TRACE), "--policy", "keep",
                                               "--out", str(t / "o")], ("--url",)),
    "calibrate --url with a line break": (lambda t: ["calibrate", "--url", "http://h\r\nX: y",
                                                     "--out", str(t / "c.json")], ("--url",)),
    "calibrate --scrape-interval -1": (lambda t: ["calibrate", "--runtime", "vllm", "--out",
                                                  str(t / "c.json"), "--scrape-interval", "-1"],
                                       ("--scrape-interval", "0 or 0.01-3600")),
    "calibrate --scrape-interval nan": (lambda t: ["calibrate", "--runtime", "vllm", "--out",
                                                   str(t / "c.json"), "--scrape-interval", "nan"],
                                        ("--scrape-interval",)),
    # headers that would break the request (header injection)
    "run --api-key with CR LF": (lambda t: _run(t, "--api-key", f"{SECRET}\r\nX-Injected: 1"),
                                 ("--api-key", "line break")),
    "run --api-key not ASCII": (lambda t: _run(t, "--api-key", "ключ"), ("--api-key",)),
    "run --header with LF": (lambda t: _run(t, "--header", "X-A: 1\nX-B: 2"), ("--header",)),
    "run --header with CR": (lambda t: _run(t, "--header", "X-A: 1\rX-B: 2"), ("--header",)),
    "run --header with NUL": (lambda t: _run(t, "--header", "X-A: 1\x00"), ("--header",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_before_anything_starts(tmp_path: Path, case: str) -> None:
    args, words = CASES[case]
    line = _one_line_exit_2(_invoke(*args(tmp_path)), *words)
    assert SECRET not in line  # an API key is never echoed
    assert not (tmp_path / "o").exists()


def test_every_command_checks_its_flags_alike() -> None:
    """Each command is a harness Command (a new one gets the checks above by being one)."""
    def walk(cmd: click.Command, path: str) -> list[str]:
        found = [] if isinstance(cmd, Command | click.Group) else [path]
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                found += walk(sub, f"{path} {name}")
        return found

    assert walk(main, "harness") == []


def test_validate_and_run_agree_on_a_directory(tmp_path: Path) -> None:
    """A folder holding a valid Parquet part is no trajectory file for either command."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    shutil.copy(TRACE, folder / "part-0.parquet")
    res = _invoke("traces", "validate", str(folder))
    assert res.exit_code == 2 and "is a directory" in res.output, res.output
    assert not res.output.rstrip().endswith(": valid")
    run = _invoke("run", "--url", NOWHERE, "--trace", str(folder), "--policy", "keep", "--out",
                  str(tmp_path / "o"))
    _one_line_exit_2(run, "is a directory")


def test_validate_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    res = _invoke("traces", "validate", str(fifo))  # would block forever if it were opened
    assert res.exit_code == 2 and "not a regular file" in res.output


@pytest.mark.parametrize(("args", "words"), [
    (("--pin-release", "nonsense"), ("--pin-release", "nonsense")),
    (("--pin-expiry-s", "-1"), ("--pin-expiry-s",)),
    (("--pin-expiry-s", "nan"), ("--pin-expiry-s",)),
    (("--host-cap-bytes", "nan"), ("--host-cap-bytes", "nan")),
    (("--host-cap-bytes", "-5"), ("--host-cap-bytes",)),
])
def test_pin_settings_refused_in_one_line(tmp_path: Path, args: tuple[str, ...],
                                          words: tuple[str, ...]) -> None:
    _one_line_exit_2(_invoke(*_run(tmp_path, *args)), *words)
