"""Records written by a writer process equal those of the writer thread; failures surface and
the shared step columns are released either way."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.policies.builtin import Keep
from harness.records.store import read_records
from harness.simulate.options import Loop
from harness.simulate.records import RecordSink
from harness.simulate.run import simulate
from harness.simulate.server import Capacity, ServerModel
from harness.simulate.workload import build_workload
from harness.traces.generator import generate
from harness.traces.profiles import load_profile

SERVER = ServerModel(2000.0, 50.0, 1e9, 1e9, 36864.0)


def workload(n: int = 60):  # type: ignore[no-untyped-def]
    profile = dataclasses.replace(load_profile("coding-agent"), turns_min=3, turns_max=6)
    return build_workload(generate(profile, n, 7), 30.0)


def run(tmp: Path, writer: str, flush_rows: int = 2000) -> tuple[pd.DataFrame, str | None]:
    w = workload(1500)  # enough loop events for several flushes
    sink = RecordSink(tmp / writer / "records", "run", w, 36864.0, 100_000, flush_rows, writer)
    assert sink.writer == writer
    name = sink.cols.shm_name
    try:
        simulate(w, SERVER, Capacity(tokens=600_000), Keep(), sink, "run", Loop(None, 120))
    finally:
        sink.close()
    return read_records(tmp / writer), name


def test_process_writer_writes_what_the_thread_writes(tmp_path: Path) -> None:
    by_thread, none = run(tmp_path, "thread")
    by_process, name = run(tmp_path, "process")
    assert none is None and name is not None
    assert len(list((tmp_path / "process" / "records").glob("part-*.parquet"))) > 3
    pd.testing.assert_frame_equal(by_thread, by_process)
    assert not Path("/dev/shm", name.lstrip("/")).exists()  # released


def test_a_failed_write_is_raised_and_memory_released(tmp_path: Path) -> None:
    w = workload()
    out = tmp_path / "records"
    sink = RecordSink(out, "run", w, 36864.0, 100_000, 200, "process")
    name = sink.cols.shm_name
    assert name is not None
    shutil.rmtree(out)  # the writer cannot write its parts
    with pytest.raises(RuntimeError, match="writing a records part failed"):
        try:
            simulate(w, SERVER, Capacity(tokens=60_000), Keep(), sink, "run", Loop(None, 12))
        finally:
            sink.close()
    assert not Path("/dev/shm", name.lstrip("/")).exists()


def test_unknown_writer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writer must be one of"):
        RecordSink(tmp_path, "run", workload(2), 1.0, 100, writer="fork")


def test_the_loop_and_the_writer_agree_on_the_step_fields_and_codes() -> None:
    from harness.policies.base import KEEP, SWAP
    from harness.simulate import engine, steps, trajectory
    from harness.simulate.server import ACTION_CODE

    for name in (*steps.LLM_FIELDS, *steps.TOOL_FIELDS):
        assert getattr(trajectory, f"F_{name.upper()}") == steps.FIELD[name], name
    assert len(steps.LLM_FIELDS) == trajectory.STEP_WIDTH
    assert (ACTION_CODE[KEEP], ACTION_CODE[SWAP]) == (engine.A_KEEP, engine.A_SWAP)
