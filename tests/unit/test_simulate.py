"""The simulator on tiny hand-computable traces: memory, policies, deadlines, records."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.model.calibration import Calibration, write_calibration
from harness.policies import PauseContext
from harness.policies.base import Decision
from harness.records.schema import (
    EVENTS,
    RECORDS_SCHEMA,
    RECORDS_SCHEMA_VERSION,
    RECORDS_VERSION_KEY,
)
from harness.records.store import RUN_JSON, read_records, records_version
from harness.simulate.options import Loop, SimOptions
from harness.simulate.records import RecordSink
from harness.simulate.run import Arrivals, check_capacity, run_simulation, simulate
from harness.simulate.server import Capacity, ServerModel, context_factory
from harness.simulate.workload import build_workload
from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from harness.traces.schema import COLUMNS, Provenance, write_trajectories

BPT = 1000  # bytes of KV per token
CAL = Calibration(runtime="test", server_version="0", model="m", kv_bytes_per_token=BPT,
                  prefill_tok_s=1000.0, decode_tok_s=100.0, swap_out_bytes_per_s=1e6,
                  swap_in_bytes_per_s=1e6, measured_at="now")
Step = tuple[Any, ...]
# The iteration model fitted to CAL (no prefill points): beta = 1 ms per token, no attention
# term, alpha = 1 / decode_tok_s - beta = 9 ms per iteration.
BETA = 1 / 1000
ALPHA = 1 / 100 - BETA


def llm(inp: int, out: int) -> Step:
    return ("llm", inp, out)


def tool(latency: float | None, deadline: float | None = 60.0, cls: str = "remote_read") -> Step:
    return ("tool", latency, deadline, cls)


def trace(tmp: Path, trajs: dict[str, list[Step]], starts: dict[str, float] | None = None,
          prefixes: dict[str, tuple[str, int | None]] | None = None) -> Path:
    """`prefixes`: a trajectory's prefix_group and prefix_tokens."""
    rows = []
    for tid, steps in trajs.items():
        group, shared = (prefixes or {}).get(tid, (None, None))
        for i, s in enumerate(steps):
            row: dict[str, Any] = {c: None for c in COLUMNS}
            row.update(trajectory_id=tid, step=i, kind=s[0], start_s=(starts or {}).get(tid, 0.0),
                       priority="interactive", tenant="t", prefix_group=group,
                       prefix_tokens=shared)
            if s[0] == "llm":
                row.update(input_tokens=s[1], output_tokens=s[2])
            else:
                row.update(tool_name="api", tool_class=s[3], latency_s=s[1], deadline_s=s[2],
                           outcome="ok" if s[1] is not None else "abandoned", mutating=False)
            rows.append(row)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["step"] = df["step"].astype("int32")
    for c in ("input_tokens", "output_tokens", "prefix_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("start_s", "latency_s", "deadline_s"):
        df[c] = df[c].astype("float64")
    df["mutating"] = df["mutating"].astype("boolean")
    return write_trajectories(df, tmp / "trace.parquet", Provenance("test"))


def sim(tmp: Path, path: Path, policy: str, cap: Capacity, args: dict[str, str] | None = None,
        arrivals: Arrivals | None = None, seed: int = 0, name: str = "out",
        cal: Calibration = CAL) -> tuple[pd.DataFrame, dict[str, Any]]:
    out = tmp / name
    run = run_simulation(SimOptions(path, policy, args or {}, cap, None,
                                    arrivals or Arrivals("closed", 8), seed, out,
                                    write_summary=False), cal)
    return read_records(out), run.to_dict()


def ev(df: pd.DataFrame, event: str, tid: str | None = None) -> pd.DataFrame:
    m = df["event"] == event
    if tid is not None:
        m &= df["trajectory_id"] == tid
    return df[m]


def t_s(df: pd.DataFrame, event: str, tid: str, k: int = 0) -> float:
    return float(ev(df, event, tid)["t_ns"].iloc[k]) / 1e9


ONE = {"a": [llm(100, 10), tool(1.0), llm(20, 5)]}


def test_recompute_reprefills_the_retained_context(tmp_path: Path) -> None:
    df, run = sim(tmp_path, trace(tmp_path, ONE), "recompute", Capacity(tokens=1000))
    rc = ev(df, "recompute")
    assert rc["recomputed_tokens"].tolist() == [110]
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (130, 0)
    assert ev(df, "erase")["reason"].iloc[0] == "policy"
    # Alone on the server: one iteration of 130 prompt tokens after the tool returns.
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        ALPHA + 130 * BETA)
    assert run["outcome"]["completed"] == 1


def test_swap_moves_twice_the_cache(tmp_path: Path) -> None:
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "swap", Capacity(tokens=1000))
    out_, in_ = ev(df, "swap_out").iloc[0], ev(df, "swap_in").iloc[0]
    assert out_["bytes"] == in_["bytes"] == 110 * BPT
    assert ev(df, "swap_out")["bytes"].sum() + ev(df, "swap_in")["bytes"].sum() == 2 * 110 * BPT
    assert in_["server_ms"] == pytest.approx(110.0)
    end = ev(df, "call_end").iloc[1]
    assert (end["prompt_n"], end["cached_tokens"]) == (20, 110)
    # swap-in 0.11 s then one iteration of 20 prompt tokens.
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        0.11 + ALPHA + 20 * BETA)
    # The swap-out overlaps the wait: memory is released 0.11 s into the pause.
    pause_t = t_s(df, "pause_decision", "a")
    assert t_s(df, "swap_out", "a") - pause_t == pytest.approx(0.11)


def test_keep_resumes_from_cache(tmp_path: Path) -> None:
    df, _ = sim(tmp_path, trace(tmp_path, ONE), "keep", Capacity(tokens=1000))
    assert ev(df, "swap_out").empty and ev(df, "recompute").empty
    assert ev(df, "kv_state")["status"].tolist() == ["active", "paused", "active", "released"]
    assert t_s(df, "first_token", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(
        ALPHA + 20 * BETA)
    # First call: one iteration of 100 prompt tokens, then 9 decode iterations of one token
    # (each 1 / decode_tok_s = 10 ms).
    assert t_s(df, "first_token", "a") == pytest.approx(ALPHA + 100 * BETA)
    assert t_s(df, "call_end", "a") == pytest.approx(ALPHA + 100 * BETA + 9 * 0.01)


TWO = {"a": [llm(100, 10), tool(10.0), llm(20, 5)], "b": [llm(100, 10), tool(0.5), llm(20, 5)]}


def test_keep_blocks_admission_when_all_slots_are_kept(tmp_path: Path) -> None:
    path = trace(tmp_path, TWO)
    df, _ = sim(tmp_path, path, "keep", Capacity(slots=1, ctx_per_slot=1000))
    # b waits for a's slot: a keeps it through its 10 s pause, until a completes.
    assert t_s(df, "call_start", "b") == pytest.approx(t_s(df, "trajectory_end", "a"))
    wait = ev(df, "slot_wait", "b")["slot_wait_s"].iloc[0]
    assert wait == pytest.approx(t_s(df, "trajectory_end", "a"))
    df2, _ = sim(tmp_path, path, "recompute", Capacity(slots=1, ctx_per_slot=1000), name="rc")
    # Recompute frees the slot at the pause: b starts when a pauses.
    assert t_s(df2, "call_start", "b") == pytest.approx(t_s(df2, "pause_decision", "a"))


def test_token_pool_keep_blocks_and_recompute_frees(tmp_path: Path) -> None:
    path = trace(tmp_path, TWO)
    df, _ = sim(tmp_path, path, "keep", Capacity(tokens=200))  # one 135-token context fits
    assert t_s(df, "call_start", "b") == pytest.approx(t_s(df, "trajectory_end", "a"))
    df2, _ = sim(tmp_path, path, "recompute", Capacity(tokens=200), name="rc")
    assert t_s(df2, "call_start", "b") == pytest.approx(t_s(df2, "pause_decision", "a"))


def test_never_returning_tool_cancelled_at_deadline(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(None, deadline=2.0)],
                            "b": [llm(100, 10), tool(0.1), llm(20, 5)]})
    df, run = sim(tmp_path, path, "keep", Capacity(slots=1, ctx_per_slot=1000))
    pause = t_s(df, "pause_decision", "a")
    end = ev(df, "tool_end", "a").iloc[0]
    assert end["status"] == "abandoned"
    assert end["t_ns"] / 1e9 == pytest.approx(pause + 2.0)
    assert "deadline 2s" in ev(df, "cancel", "a")["reason"].iloc[0]
    kv = ev(df, "kv_state", "a").iloc[-1]
    assert (kv["status"], kv["kv_tokens"], kv["t_ns"]) == ("released", 0, end["t_ns"])
    assert ev(df, "trajectory_end", "a")["status"].iloc[0] == "cancelled"
    # The slot is free again at the deadline: b gets it then.
    assert t_s(df, "call_start", "b") == pytest.approx(pause + 2.0)
    assert run["outcome"] == {"completed": 1, "cancelled": 1, "failed": 0,
                              "unsupported_actions": 0, "server_failed": 0, "interrupted": 0}


def test_ttl_expires_into_swap(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(5.0), llm(20, 5)]})
    df, _ = sim(tmp_path, path, "ttl", Capacity(tokens=1000), {"tau": "1"})
    dec = ev(df, "pause_decision").iloc[0]
    assert (dec["action"], dec["detail"]) == ("ttl", "ttl_s=1.0 after=swap")
    out_ = ev(df, "swap_out").iloc[0]
    assert out_["reason"] == "ttl-expired"
    assert out_["t_ns"] / 1e9 - t_s(df, "pause_decision", "a") == pytest.approx(1.11)


def test_preemption_breaks_a_token_pool_deadlock_without_a_timeout(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(100, 10)],
                            "b": [llm(100, 10), tool(1.0), llm(100, 10)]})
    out = tmp_path / "out"
    run = run_simulation(SimOptions(path, "keep", {}, Capacity(tokens=250), None,
                                    Arrivals("closed", 8), 0, out, write_summary=False,
                                    first_token_timeout_s=float("inf")), CAL).to_dict()
    df = read_records(out)
    assert run["simulator"]["preemptions"] == 1
    assert run["simulator"]["record_writer"] == "thread"  # a small trace: no writer process
    assert ev(df, "erase")["reason"].tolist().count("preempted") == 1
    assert ev(df, "recompute")["recomputed_tokens"].tolist() == [110]
    assert run["outcome"]["completed"] == 2


def test_context_overflow_fails_the_trajectory(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(900, 200)]})
    df, run = sim(tmp_path, path, "keep", Capacity(slots=1, ctx_per_slot=1000))
    end = ev(df, "call_end").iloc[0]
    assert end["status"] == "error" and "context overflow" in end["detail"]
    assert ev(df, "trajectory_end")["status"].iloc[0] == "failed"
    assert run["outcome"]["failed"] == 1


class Recording:
    """A policy that records every context it is shown."""

    name = "recording"
    sees_true_latency = False

    def __init__(self) -> None:
        self.seen: list[PauseContext] = []

    def decide(self, ctx: PauseContext) -> Decision:
        self.seen.append(dataclasses.replace(ctx, history_s=tuple(ctx.history_s)))
        return Decision("keep", "recorded")


def test_policy_sees_what_the_replay_shows(tmp_path: Path) -> None:
    steps = [llm(10, 2), tool(0.5), llm(5, 2), tool(0.25), llm(5, 2), tool(2.0, cls="sandbox"),
             llm(5, 2)]
    w = build_workload(pd.read_parquet(trace(tmp_path, {"a": steps})), 30.0)
    pol = Recording()
    server = ServerModel(1000.0, 100.0, 1e6, 1e6, BPT)
    sink = RecordSink(tmp_path / "r", "run", w, BPT, 1000)
    simulate(w, server, Capacity(slots=2, ctx_per_slot=1000), pol, sink, "run", Loop(None, 1))
    sink.close()
    h = [c.history_s for c in pol.seen]
    assert h == [(), (0.5,), ()]
    c = pol.seen[1]
    assert (c.tool_class, c.retained_tokens, c.deadline_ms, c.resume_required) == (
        "remote_read", 19, 60000.0, True)
    assert (c.free_slots, c.total_slots, c.true_latency_s) == (1, 2, None)
    assert c.rates == server.policy_rates()


def test_context_factory_builds_equal_contexts() -> None:
    values = ("r", "t", "c", 1.0, 5, True, "batch", (0.5,), 1, 2, None, 3.0)
    assert context_factory()(*values) == PauseContext(*values)


def test_oracle_sees_true_latency(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(0.001), llm(20, 5)],
                            "b": [llm(100, 10), tool(30.0), llm(20, 5)]})
    df, _ = sim(tmp_path, path, "oracle", Capacity(tokens=10_000))
    actions = ev(df, "pause_decision").set_index("trajectory_id")["action"]
    assert (actions["a"], actions["b"]) == ("keep", "recompute")


def flaky(tmp: Path, n: int = 40) -> Path:
    df = generate(load_profile("flaky-tools"), n, 3)
    return write_trajectories(df, tmp / "flaky.parquet", Provenance("generator"))


def test_deterministic_for_a_seed_and_schema(tmp_path: Path) -> None:
    path = flaky(tmp_path)
    arr = Arrivals("poisson", rate=2.0)
    a, run = sim(tmp_path, path, "min-waste", Capacity(tokens=20_000), arrivals=arr, seed=7)
    b, _ = sim(tmp_path, path, "min-waste", Capacity(tokens=20_000), arrivals=arr, seed=7,
               name="again")
    pd.testing.assert_frame_equal(a, b)
    c, _ = sim(tmp_path, path, "min-waste", Capacity(tokens=20_000), arrivals=arr, seed=8,
               name="other")
    assert not a["t_ns"].equals(c["t_ns"])
    for part in sorted((tmp_path / "out" / "records").glob("part-*.parquet")):
        assert pq.read_schema(part).remove_metadata().equals(RECORDS_SCHEMA)
        assert records_version(part) == RECORDS_SCHEMA_VERSION  # written, not defaulted
        assert RECORDS_VERSION_KEY in (pq.read_schema(part).metadata or {})
    assert set(a["event"]) <= set(EVENTS)
    assert (np.diff(a["seq"]) == 1).all() and (np.diff(a["t_ns"]) >= 0).all()
    assert run["runtime"] == "simulator" and run["seed"] == 7
    saved = json.loads((tmp_path / "out" / RUN_JSON).read_text())
    for key in ("policy", "policy_args", "capacity", "calibration", "trace", "harness_version"):
        assert key in saved
    assert len(saved["trace"]["sha256"]) == 64
    # Every trajectory starts and ends once; every pause has a decision and a tool start.
    assert a.groupby("trajectory_id")["event"].apply(
        lambda e: (e == "trajectory_end").sum()).eq(1).all()
    assert len(ev(a, "pause_decision")) == len(ev(a, "tool_start")) == run["simulator"]["pauses"]


def test_trace_timing_and_closed_loop(tmp_path: Path) -> None:
    path = trace(tmp_path, ONE | {"b": [llm(10, 2)]}, starts={"a": 0.0, "b": 3.0})
    df, _ = sim(tmp_path, path, "keep", Capacity(tokens=1000), arrivals=Arrivals("trace"))
    assert t_s(df, "trajectory_start", "b") == 3.0
    df2, _ = sim(tmp_path, path, "keep", Capacity(tokens=1000), arrivals=Arrivals("closed", 1),
                 name="closed")
    assert t_s(df2, "trajectory_start", "b") == pytest.approx(t_s(df2, "trajectory_end", "a"))


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["simulate", *args])


def test_cli_end_to_end(tmp_path: Path) -> None:
    path = flaky(tmp_path, 10)
    cal = write_calibration(tmp_path / "cal.json", CAL)
    res = cli("--trace", str(path), "--policy", "ttl", "--policy-arg", "tau=0.5",
              "--slots", "4", "--ctx-per-slot", "8192", "--calibration", str(cal),
              "--rate", "1", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / RUN_JSON).is_file()
    run = json.loads((tmp_path / "o" / RUN_JSON).read_text())
    assert run["policy_args"] == {"tau": "0.5"} and run["capacity"]["slots"] == 4
    try:
        import harness.metrics.summary  # noqa: F401
    except ImportError:
        assert "summary.json not written" in res.output
    else:
        assert (tmp_path / "o" / "summary.json").is_file()


@pytest.mark.parametrize("extra, needle", [
    ([], "capacity"),
    (["--capacity-tokens", "10", "--slots", "2", "--ctx-per-slot", "50"], "not both"),
    (["--capacity-tokens", "0"], "capacity"),
    (["--capacity-tokens", "x"], "not an integer"),
    (["--capacity-tokens", "100", "--policy-arg", "tau"], "KEY=VALUE"),
    (["--capacity-tokens", "100", "--rate", "1", "--concurrency", "2"], "one of"),
    (["--capacity-tokens", "100", "--rate", "-1"], "rate"),
])
def test_cli_refusals(tmp_path: Path, extra: list[str], needle: str) -> None:
    path = trace(tmp_path, ONE)
    cal = write_calibration(tmp_path / "cal.json", CAL)
    res = cli("--trace", str(path), "--policy", "keep", "--calibration", str(cal),
              "--out", str(tmp_path / "o"), *extra)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output


def test_cli_refuses_unknown_policy_bad_calibration_and_reused_out(tmp_path: Path) -> None:
    path = trace(tmp_path, ONE)
    cal = write_calibration(tmp_path / "cal.json", CAL)
    base = ["--trace", str(path), "--capacity-tokens", "1000", "--out", str(tmp_path / "o")]
    res = cli(*base, "--policy", "bogus", "--calibration", str(cal))
    assert res.exit_code == 2 and "unknown policy" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(CAL.to_dict() | {"decode_tok_s": 0}))
    res = cli(*base, "--policy", "keep", "--calibration", str(bad))
    assert res.exit_code == 2 and "decode_tok_s" in res.output
    assert cli(*base, "--policy", "keep", "--calibration", str(cal), "--no-summary").exit_code == 0
    res = cli(*base, "--policy", "keep", "--calibration", str(cal))
    assert res.exit_code == 2 and "already holds records" in res.output


def test_check_capacity() -> None:
    assert check_capacity(5, None, None) == Capacity(tokens=5)
    assert check_capacity(None, 2, 10).context_limit == 10


def test_agrees_with_the_analytical_model_on_the_seed_lab(tmp_path: Path) -> None:
    seed = write_trajectories(generate(load_profile("seed-lab"), 0, 0), tmp_path / "seed.parquet",
                              Provenance("generator"))
    cal = dataclasses.replace(CAL, kv_bytes_per_token=36864, prefill_tok_s=20000.0,
                              swap_out_bytes_per_s=8 * 2**30, swap_in_bytes_per_s=8 * 2**30)
    mib = 2**20
    keep, _ = sim(tmp_path, seed, "keep", Capacity(tokens=100_000), cal=cal)
    kv = ev(keep, "kv_state").copy()
    kv["next_ns"] = kv.groupby("trajectory_id")["t_ns"].shift(-1)
    paused = kv[kv["status"] == "paused"]
    mib_s = sorted(paused["kv_tokens"] * 36864 / mib * (paused["next_ns"] - paused["t_ns"]) / 1e9)
    assert mib_s == pytest.approx([7.2, 720.0])
    swap, _ = sim(tmp_path, seed, "swap", Capacity(tokens=100_000), cal=cal, name="swap")
    moved = swap[swap["event"].isin(["swap_out", "swap_in"])].groupby("trajectory_id")["bytes"]
    assert moved.sum().tolist() == [288 * mib, 288 * mib]
    assert ev(swap, "swap_in")["server_ms"].tolist() == [17.578125, 17.578125]
    rc, _ = sim(tmp_path, seed, "recompute", Capacity(tokens=100_000), cal=cal, name="rc")
    assert ev(rc, "recompute")["recomputed_tokens"].tolist() == [4096, 4096]


def test_history_window_reads_as_sequence_and_array() -> None:
    from harness.simulate import records
    from harness.simulate.server import History

    assert set(records.EVENTS) == set(EVENTS)
    h = History(3)
    for x in range(1, 8):
        h.add(float(x))
    assert (len(h), tuple(h), h[-1]) == (3, (5.0, 6.0, 7.0), 7.0)
    assert float(np.quantile(np.asarray(h, dtype=float), 0.5)) == 6.0
    everything = History(0)
    for x in range(300):
        everything.add(float(x))
    assert len(everything) == 300 and float(np.mean(everything)) == 149.5
