"""Sharding a run among load generators, and merging their results (harness.plan.shard,
harness.records.merge, `harness run --shard`, `harness merge`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import signals
from harness.cli import main
from harness.errors import InputError
from harness.plan.injection import load_injection
from harness.plan.planner import Arrivals, make_plan
from harness.plan.shard import Shard, shard_plan, shard_slots, split_count
from harness.records.store import read_records
from harness.selftest import measure
from harness.traces.validate import load_trajectories


@pytest.mark.parametrize("total,n", [(7, 3), (4, 2), (1000, 7), (5, 5)])
def test_split_counts_add_up(total: int, n: int) -> None:
    parts = [split_count(total, Shard(i, n)) for i in range(n)]
    assert sum(parts) == total and max(parts) - min(parts) <= 1


def test_slots_are_split_without_overlap() -> None:
    got = [shard_slots(5, Shard(i, 2)) for i in range(2)]
    assert got == [[0, 2, 4], [1, 3]]


@pytest.mark.parametrize("text,error", [("2/2", "shard index"), ("0/0", "1 to 1024"),
                                        ("a/b", "i/n"), ("1", "i/n"), ("-1/2", "i/n")])
def test_bad_shards_are_refused(text: str, error: str) -> None:
    with pytest.raises(InputError, match=error):
        Shard.parse(text)


def _plan(tmp_path: Path, mode: str = "poisson", concurrency: int = 5):  # type: ignore[no-untyped-def]
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 40, 2, 0.01, 2)
    return make_plan(load_trajectories(trace), load_injection("chaos"),
                     Arrivals(mode, concurrency, 3.0), 7)  # type: ignore[arg-type]


def test_shards_partition_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    shards = [shard_plan(plan, Shard(i, 3)) for i in range(3)]
    ids = [t.trajectory_id for s in shards for t in s.trajectories]
    assert sorted(ids) == sorted(t.trajectory_id for t in plan.trajectories)
    assert all(s.trajectories for s in shards)  # 40 ids hash into every one of 3 shards
    arrivals = {t.trajectory_id: t.arrival_s for t in plan.trajectories}
    assert all(t.arrival_s == arrivals[t.trajectory_id] for s in shards for t in s.trajectories)
    assert sorted(b.request_id for s in shards for b in s.bystanders) == sorted(
        b.request_id for b in plan.bystanders)
    assert shard_plan(plan, Shard(0, 1)) is plan


def test_closed_loop_agents_are_split(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "closed", 5)
    assert [shard_plan(plan, Shard(i, 2)).arrivals.concurrency for i in range(2)] == [3, 2]
    with pytest.raises(InputError, match="--concurrency >= 6"):
        shard_plan(plan, Shard(0, 6))


def _run(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(main, args)
    return res.exit_code, res.output


def test_two_shards_merge_into_the_whole_run(tmp_path: Path) -> None:
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 12, 3, 0.02, 2)
    stub = measure.start_stub(0.0, slots=4)
    try:
        base = ["run", "--url", stub.url, "--trace", str(trace), "--policy", "keep",
                "--concurrency", "4"]
        assert _run([*base, "--out", str(tmp_path / "whole")])[0] == 0
        start = time.time() + 1.0
        for i in range(2):
            code, out = _run([*base, "--shard", f"{i}/2", "--start-at", f"{start}",
                              "--out", str(tmp_path / f"s{i}")])
            assert code == 0, out
        code, out = _run(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                          "--out", str(tmp_path / "merged")])
    finally:
        stub.stop()
    assert code == 0, out
    whole, merged = (json.loads((tmp_path / d / "summary.json").read_text())
                     for d in ("whole", "merged"))
    assert merged["trajectories"] == whole["trajectories"]
    assert merged["pauses"] == whole["pauses"]
    w_rec, m_rec = read_records(tmp_path / "whole"), read_records(tmp_path / "merged")
    assert Counter(m_rec["event"].astype(str)) == Counter(w_rec["event"].astype(str))
    assert list(m_rec["seq"]) == list(range(len(m_rec)))
    assert (m_rec["t_ns"].diff().dropna() >= 0).all()
    assert m_rec["run_id"].nunique() == 1
    run = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert [w["shard"] for w in run["workers"]] == ["0/2", "1/2"]
    assert run["status"] == "finished" and run["shard"] is None
    assert run["outcome"]["completed"] == 12
    slots = [set(read_records(tmp_path / f"s{i}")["slot"].dropna().astype(int))
             for i in range(2)]
    assert slots[0] <= {0, 2} and slots[1] <= {1, 3}


def test_merge_refuses_what_is_not_one_run(tmp_path: Path) -> None:
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 4, 2, 0.0, 2)
    stub = measure.start_stub(0.0, slots=4)
    try:
        base = ["run", "--url", stub.url, "--trace", str(trace), "--policy", "keep"]
        start = time.time() + 0.5
        assert _run([*base, "--shard", "0/2", "--start-at", f"{start}",
                     "--out", str(tmp_path / "a")])[0] == 0
        assert _run([*base, "--shard", "1/2", "--start-at", f"{start + 1}",
                     "--out", str(tmp_path / "b")])[0] == 0
        assert _run([*base, "--out", str(tmp_path / "whole")])[0] == 0
    finally:
        stub.stop()
    for dirs, error in (([tmp_path / "a"], "shard 1/2 is missing"),
                        ([tmp_path / "a", tmp_path / "a"], "given twice"),
                        ([tmp_path / "a", tmp_path / "b"], "another run's shard"),
                        ([tmp_path / "a", tmp_path / "whole"], "not a shard"),
                        ([tmp_path / "nope"], "no run.json")):
        code, out = _run(["merge", *map(str, dirs), "--out", str(tmp_path / "m")])
        assert code == 2 and error in out and "Traceback" not in out, out


@pytest.mark.parametrize("args,error", [
    (["--shard", "0/2"], "--start-at"), (["--start-at", "1"], "needs --shard"),
    (["--shard", "0/2", "--start-at", "1"], "within a day"),
    (["--ray-address", "x:1"], "needs --workers"),
    (["--workers", "2", "--shard", "0/2"], "leave out --shard"),
    (["--shard", "0/2", "--start-at", "{now}", "--repeats", "2"], "--repeats")])
def test_shard_flags_that_do_not_go_together(tmp_path: Path, args: list[str],
                                             error: str) -> None:
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 2, 1, 0.0, 2)
    args = [a.replace("{now}", str(time.time())) for a in args]
    code, out = _run(["run", "--url", "http://127.0.0.1:9", "--trace", str(trace),
                      "--policy", "keep", "--out", str(tmp_path / "o"), *args])
    assert code == 2 and error in out, out


def _shards(tmp_path: Path, stub_url: str, trace: Path) -> list[Path]:
    start = time.time() + 0.5
    dirs = [tmp_path / f"s{i}" for i in range(2)]
    for i, d in enumerate(dirs):
        code, out = _run(["run", "--url", stub_url, "--trace", str(trace), "--policy", "keep",
                          "--concurrency", "2", "--shard", f"{i}/2", "--start-at", f"{start}",
                          "--out", str(d)])
        assert code == 0, out
    return dirs


def _lose(shard_dir: Path, keep_ends: int) -> None:
    """Make a shard look as its process died mid-run: run.json `running`, and only the first
    `keep_ends` trajectory ends on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from harness.records.parts import write_part
    from harness.records.schema import RECORDS_SCHEMA

    run = json.loads((shard_dir / "run.json").read_text())
    run.update(status="running", outcome=None)
    (shard_dir / "run.json").write_text(json.dumps(run))
    parts = sorted((shard_dir / "records").glob("part-*.parquet"))
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    for p in parts:
        p.unlink()
    ends = [k for k, r in enumerate(rows) if r["event"] == "trajectory_end"]
    cut = ends[keep_ends] if keep_ends < len(ends) else len(rows)
    table = pa.Table.from_pylist(rows[:cut], schema=RECORDS_SCHEMA)
    write_part(shard_dir / "records" / "part-00000.parquet", RECORDS_SCHEMA, table.to_batches())


def test_a_lost_shard_is_recorded_worker_lost(tmp_path: Path) -> None:
    from harness.plan.shard import shard_index
    from harness.records.merge import Planned, ShardInput, merge_shards

    trace = measure.synthetic_trace(tmp_path / "t.parquet", 10, 3, 0.02, 2)
    stub = measure.start_stub(0.0, slots=4)
    try:
        dirs = _shards(tmp_path, stub.url, trace)
    finally:
        stub.stop()
    _lose(dirs[1], keep_ends=1)
    ids = sorted({str(t) for t in read_records(dirs[1]).query(
        "event == 'trajectory_start'")["trajectory_id"]})
    planned = [f"a{k}" for k in range(10) if shard_index(f"a{k}", 2) == 1]
    # By hand (no plan): the started ones are ended, the never-started ones counted.
    code, out = _run(["merge", *map(str, dirs), "--out", str(tmp_path / "hand")])
    assert code == 0 and "shard(s) 1/2 lost" in out
    hand = read_records(tmp_path / "hand")
    lost_ends = hand.query("event == 'trajectory_end' and reason == 'worker-lost'")
    assert sorted(lost_ends["trajectory_id"].astype(str)) == [t for t in ids if t != _first_end(
        dirs[1])]
    never = len(planned) - len(ids)
    assert (f"{never} planned trajectories" in out) == (never > 0)
    # With the plan (as the driver merges): every planned trajectory of the shard has an end.
    result = merge_shards([ShardInput(dirs[0]), ShardInput(
        dirs[1], lost=True, planned=tuple(Planned(t) for t in planned))], tmp_path / "driver")
    rec = read_records(tmp_path / "driver")
    ends = rec.query("event == 'trajectory_end'")
    assert len(ends) == 10 and result.lost_shards == ["1/2"] and result.unnamed_lost == 0
    assert (ends["reason"].astype(str) == "worker-lost").sum() == len(planned) - 1
    assert result.run.status == "interrupted" and result.run.stop_reason == "worker-lost"
    assert result.run.outcome is not None and result.run.outcome.failed == len(planned) - 1
    assert [w["lost"] for w in result.run.workers or []] == [False, True]


def _first_end(shard_dir: Path) -> str:
    rec = read_records(shard_dir)
    return str(rec.query("event == 'trajectory_end'")["trajectory_id"].iloc[0])


def test_the_load_generator_starts_at_the_gate_and_stops_on_request(tmp_path: Path) -> None:
    import threading

    from harness.distributed.worker import LoadGenerator
    from harness.plan.shard import Shard as S
    from harness.replay.options import RunOptions

    signals.install()
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 6, 3, 0.3, 2)
    stub = measure.start_stub(0.0, slots=4)
    answers: dict[str, dict[str, object]] = {}
    try:
        gens = {name: LoadGenerator() for name in ("go", "stopped")}
        threads = [threading.Thread(target=lambda n=name, g=g: answers.__setitem__(n, g.run(
            RunOptions(trace=trace, policy="keep", out=tmp_path / n, url=stub.url,
                       shard=S(0, 1), pinning=None)))) for name, g in gens.items()]
        for th in threads:
            th.start()
        assert all(g.wait_ready(60) for g in gens.values())
        assert not (tmp_path / "go" / "records").exists()  # waits at its gate
        gens["go"].begin(time.time() + 0.2)
        threads[0].join(60)
        assert gens["stopped"].stop() is True  # its replay waits at the gate: stopped there
        threads[1].join(60)
    finally:
        stub.stop()
        signals.install()  # forget the stop it noted, as every command does at its start
    assert answers["go"]["status"] == "finished"
    assert answers["stopped"]["status"] == "interrupted"
    run = json.loads((tmp_path / "go" / "run.json").read_text())
    assert run["start_at"] is not None and run["outcome"]["completed"] == 6
    assert gens["go"].where()["pid"] > 0
