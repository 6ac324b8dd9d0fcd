"""Trace inputs that once crashed or hung: sub-agents nested far too deep (a kv-cache-tester file,
a trajectory file's parent chain) and paths that are not regular files (a FIFO, a device). Each
must end in one "error: " line and exit 2, at once, with no traceback."""

from __future__ import annotations

import gzip
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness.cli import main
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.model.calibration import Calibration, write_calibration
from harness.traces.schema import Provenance, steps_table, write_trajectories
from harness.traces.validate import check_frame, validate_file

DEEP = 2_000  # a parent chain far past MAX_SUBAGENT_DEPTH and Python's recursion limit
KV_DEEP = 500  # as deep as a kv-cache-tester file gets while orjson still parses it
HANG_GUARD_S = 10  # a read that blocks fails the test instead of hanging the suite


class Hung(BaseException):
    """A read that blocked. Not an OSError (TimeoutError is one): no importer's `except` may
    turn it into a tidy error line, and the CLI runner lets it through to fail the test."""


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """Turn a blocked open() (a FIFO with no writer) into a failure after HANG_GUARD_S."""
    def expire(_sig: int, _frame: FrameType | None) -> None:
        raise Hung(f"blocked for {HANG_GUARD_S} s: the input was opened")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(HANG_GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _request(t: float) -> str:
    return json.dumps({"t": t, "in": 10, "out": 1, "hash_ids": [],
                       "input_types": ["tool_result"], "api_time": 1.0})


def kv_nested(depth: int) -> str:
    """A kv-cache-tester conversation whose sub-agents nest `depth` deep, built as text (the
    json module itself recurses, and would fail on the way out)."""
    sub = ('{"t": 3, "type": "subagent", "agent_id": "a", "subagent_type": "x", '
           '"duration_ms": 1000, "status": "completed", "requests": [')
    return ('{"id": "c", "block_size": 64, "requests": ['
            + (_request(0) + ", " + sub) * depth + _request(0) + ", " + _request(5)
            + ("]}, " + _request(5)) * depth + "]}")


def chain_rows(depth: int) -> list[dict[str, Any]]:
    """Trajectories t0 .. t<depth>, each spawning the next: a parent chain `depth` deep."""
    tool = dict(kind="tool", latency_s=0.5, outcome="ok", mutating=False)
    rows: list[dict[str, Any]] = []
    for k in range(depth + 1):
        par: dict[str, Any] = dict(parent_id=f"t{k - 1}", spawn_step=1) if k else {}
        rows.append(dict(trajectory_id=f"t{k}", step=0, kind="llm", input_tokens=10,
                         output_tokens=2, **par))
        if k < depth:
            rows.append(dict(trajectory_id=f"t{k}", step=1, tool_name="Task",
                             tool_class="subagent", **tool, **par))
            rows.append(dict(trajectory_id=f"t{k}", step=2, kind="llm", input_tokens=5,
                             output_tokens=2, **par))
    return rows


def write_chain(path: Path, depth: int) -> Path:
    table = steps_table(chain_rows(depth), {"start_s": 0.0, "priority": "interactive",
                                            "tenant": "t"})
    return write_trajectories(table, path, Provenance("test"))


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# Each builds its input in a folder and returns the CLI arguments and the words the one error
# line must hold.
Case = Callable[[Path], tuple[list[str], list[str]]]


def _kv_deep(name: str) -> Case:
    def build(d: Path) -> tuple[list[str], list[str]]:
        text = kv_nested(KV_DEEP).encode()
        f = d / name
        f.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
        return (["traces", "import", "kv-cache-tester", str(f), "--out", str(d / "x.parquet")],
                [str(f), f"nested deeper than {MAX_SUBAGENT_DEPTH} levels", "the limit"])
    return build


def _fifo_file(fmt: str, name: str) -> Case:
    def build(d: Path) -> tuple[list[str], list[str]]:
        f = _fifo(d / name)
        return (["traces", "import", fmt, str(f), "--out", str(d / "x.parquet")],
                [f"{f}: not a regular file"])
    return build


def _fifo_in_folder(fmt: str, name: str) -> Case:
    def build(d: Path) -> tuple[list[str], list[str]]:
        folder = d / "in"
        (folder / name).parent.mkdir(parents=True)  # mini-swe-agent looks in subfolders too
        f = _fifo(folder / name)
        return (["traces", "import", fmt, str(folder), "--out", str(d / "x.parquet")],
                [f"{f}: not a regular file"])
    return build


def _device(fmt: str) -> Case:
    # /dev/null, not /dev/zero: both are devices, but should the refusal ever go, reading
    # /dev/null ends at once while /dev/zero fills memory until the OOM killer steps in.
    def build(d: Path) -> tuple[list[str], list[str]]:
        if not Path("/dev/null").exists():
            pytest.skip("no /dev/null here")
        return (["traces", "import", fmt, "/dev/null", "--out", str(d / "x.parquet")],
                ["/dev/null: not a regular file"])
    return build


CAL = Calibration(runtime="test", server_version="0", model="m", kv_bytes_per_token=1000,
                  prefill_tok_s=1000.0, decode_tok_s=100.0, swap_out_bytes_per_s=1e6,
                  swap_in_bytes_per_s=1e6, measured_at="now")


def _chain(command: str) -> Case:
    def build(d: Path) -> tuple[list[str], list[str]]:
        trace = str(write_chain(d / "deep.parquet", DEEP))
        out = str(d / "o")
        args = {
            # The trace is read before any server is asked: a closed port is never reached.
            "run": ["run", "--url", "http://127.0.0.1:9", "--trace", trace, "--policy", "keep",
                    "--out", out],
            "simulate": ["simulate", "--trace", trace, "--policy", "keep", "--slots", "4",
                         "--ctx-per-slot", "8192", "--calibration",
                         str(write_calibration(d / "cal.json", CAL)), "--rate", "1",
                         "--out", out],
            "describe": ["traces", "describe", trace],
        }[command]
        return args, ["invalid trajectory file"]
    return build


ONE_LINE: dict[str, Case] = {
    "kv-deep-json": _kv_deep("c.json"),
    "kv-deep-json-gz": _kv_deep("c.json.gz"),
    **{f"fifo-{fmt}": _fifo_file(fmt, name) for fmt, name in (
        ("infercept", "w.json"), ("kv-cache-tester", "c.json.gz"),
        ("mini-swe-agent", "a.traj.json"), ("mooncake", "m.jsonl"),
        ("openai-chat", "chat.json"))},
    **{f"fifo-in-folder-{fmt}": _fifo_in_folder(fmt, name) for fmt, name in (
        ("infercept", "w.json"), ("kv-cache-tester", "c.json"),
        ("mini-swe-agent", "sub/a.traj.json"), ("openai-chat", "chat.jsonl"))},
    "device-mooncake": _device("mooncake"),
    "device-openai-chat": _device("openai-chat"),
    "chain-run": _chain("run"),
    "chain-simulate": _chain("simulate"),
    "chain-describe": _chain("describe"),
}


def _no_crash(res: Result) -> list[str]:
    """The output's lines, once it is clear the command refused cleanly (exit 2)."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output and "RecursionError" not in res.output, res.output
    return res.output.splitlines()


@pytest.mark.parametrize("case", sorted(ONE_LINE))
def test_refused_in_one_error_line(case: str, tmp_path: Path) -> None:
    args, words = ONE_LINE[case](tmp_path)
    lines = _no_crash(CliRunner().invoke(main, args))
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[0] == errors[0], lines
    assert all(w in lines[0] for w in words), lines[0]
    if case.startswith("chain-"):  # the problem list under it: the one rule, named once
        assert len(lines) == 2 and "[subagent-too-deep]" in lines[1], lines
    else:
        assert len(lines) == 1, lines


def test_validate_lists_the_deep_chain_as_one_problem(tmp_path: Path) -> None:
    trace = write_chain(tmp_path / "deep.parquet", DEEP)
    lines = _no_crash(CliRunner().invoke(main, ["traces", "validate", str(trace)]))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{trace}: trajectory 't{MAX_SUBAGENT_DEPTH + 1}': "
                               "[subagent-too-deep]"), lines[0]
    assert f"deeper than {MAX_SUBAGENT_DEPTH} levels (the limit)" in lines[0]
    assert f"the deepest in the file: {DEEP}" in lines[0]


def test_the_limit_itself_is_accepted_and_one_more_is_not(tmp_path: Path) -> None:
    defaults = {"start_s": 0.0, "priority": "interactive", "tenant": "t"}
    at = steps_table(chain_rows(MAX_SUBAGENT_DEPTH), defaults).to_pandas()
    assert check_frame(at, "f") == []
    past = steps_table(chain_rows(MAX_SUBAGENT_DEPTH + 1), defaults).to_pandas()
    assert [(p.rule, p.trajectory) for p in check_frame(past, "f")] == [
        ("subagent-too-deep", f"t{MAX_SUBAGENT_DEPTH + 1}")]


def test_a_kv_file_nested_to_the_limit_imports_and_validates(tmp_path: Path) -> None:
    src = tmp_path / "c.json"
    src.write_text(kv_nested(MAX_SUBAGENT_DEPTH))
    out = tmp_path / "x.parquet"
    res = CliRunner().invoke(main, ["traces", "import", "kv-cache-tester", str(src),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert validate_file(out) == []
    src.write_text(kv_nested(MAX_SUBAGENT_DEPTH + 1))
    lines = _no_crash(CliRunner().invoke(main, ["traces", "import", "kv-cache-tester",
                                                str(src), "--out", str(out)]))
    assert lines == [f"error: {src}: sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} "
                     "levels (the limit)"]
