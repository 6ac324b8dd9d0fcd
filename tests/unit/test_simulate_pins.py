"""A simulation pinned to a replay's timeline (harness.simulate.pins), and llama.cpp's loop
serving its saves and restores itself before the next iteration."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import Calibration, write_calibration
from harness.records.manifest import read_manifest
from harness.records.store import RUN_JSON, read_records
from harness.simulate.options import SimOptions
from harness.simulate.pins import pins_from_records
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from harness.simulate.workload import build_workload
from tests.unit.test_simulate import ev, t_s
from tests.unit.test_simulate_subagents import CAL, llm, spawn, tool, trace

# P spawns A and B; R runs after whichever agent is free first (closed loop of 2 agents).
FAMILY = {"P": [llm(100, 10), spawn(0.5), llm(20, 5)],
          "A": [llm(50, 2), tool(1.0), llm(10, 2)],
          "B": [llm(60, 2), tool(3.0), llm(10, 2)],
          "R": [llm(80, 4), tool(0.7), llm(15, 3), tool(0.2), llm(5, 2)]}
KIDS = {"A": ("P", 1), "B": ("P", 1)}
SLOTS = Capacity(slots=4, ctx_per_slot=1000)
SLOW = dataclasses.replace(CAL, prefill_tok_s=200.0, decode_tok_s=20.0)


def run(tmp: Path, name: str, cal: Calibration = CAL, policy: str = "keep",
        pinned_to: Path | None = None, path: Path | None = None) -> Path:
    out = tmp / name
    run_simulation(SimOptions(path or trace(tmp, FAMILY, KIDS), policy, {}, SLOTS, None,
                              Arrivals("closed", 2), 0, out, write_summary=False,
                              pinned_to=pinned_to), cal)
    return out


def as_replay(sim_dir: Path, dest: Path) -> Path:
    """A simulated run relabelled as a server's replay (the pins refuse a simulation)."""
    shutil.copytree(sim_dir, dest)
    doc = json.loads((dest / RUN_JSON).read_text())
    doc["runtime"] = "llamacpp"
    (dest / RUN_JSON).write_text(json.dumps(doc))
    return dest


def times(df: pd.DataFrame, event: str) -> pd.Series:
    e = ev(df, event)
    return e.set_index(["trajectory_id", e["step"].fillna(-1)])["t_ns"].sort_index()


def test_pinned_to_its_own_timeline_a_simulation_is_unchanged(tmp_path: Path) -> None:
    first = run(tmp_path, "first")
    again = run(tmp_path, "again", pinned_to=as_replay(first, tmp_path / "replay"))
    a, b = read_records(first), read_records(again)
    for event in ("trajectory_start", "call_start", "first_token", "call_end", "tool_end"):
        pd.testing.assert_series_equal(times(a, event), times(b, event))
    pinned = read_manifest(again).simulator["pinned_to"]
    assert pinned["late"] == 0 and pinned["late_s"] == 0.0
    # every trajectory's start and every tool's end (P's spawn ends when its children do)
    assert pinned["pinned_events"] == 4 + len(ev(a, "tool_end"))


def test_a_faster_model_keeps_to_the_replays_starts_and_tool_ends(tmp_path: Path) -> None:
    slow = as_replay(run(tmp_path, "slow", SLOW), tmp_path / "replay")
    fast = read_records(run(tmp_path, "fast", pinned_to=slow))
    real = read_records(slow)
    pd.testing.assert_series_equal(times(fast, "trajectory_start"),
                                   times(real, "trajectory_start"))
    real_ends, fast_ends = times(real, "tool_end"), times(fast, "tool_end")
    # the spawn's end is its children's (not pinned: they are); every other tool is the replay's
    pd.testing.assert_series_equal(fast_ends.drop("P"), real_ends.drop("P"))
    assert read_manifest(tmp_path / "fast").simulator["pinned_to"]["late"] == 0
    # its calls are its own: each sent when the replay's was, done sooner
    first_fast, first_real = times(fast, "first_token"), times(real, "first_token")
    assert (first_fast < first_real).all()


def test_a_slower_model_reaches_the_replays_times_late_and_counts_it(tmp_path: Path) -> None:
    fast = as_replay(run(tmp_path, "fast"), tmp_path / "replay")
    slow = read_records(run(tmp_path, "slow", SLOW, pinned_to=fast))
    pinned = read_manifest(tmp_path / "slow").simulator["pinned_to"]
    ends, calls = ev(slow, "tool_end"), ev(slow, "call_end")
    late = 0
    lateness = 0.0
    real = times(read_records(fast), "tool_end")
    for _, e in ends.iterrows():
        if e["trajectory_id"] == "P":
            continue
        call = calls[(calls["trajectory_id"] == e["trajectory_id"])
                     & (calls["step"] == e["step"] - 1)]["t_ns"].iloc[0]
        pin = real.loc[(e["trajectory_id"], e["step"])]
        if call > pin:  # reached after the replay's end: the tool ends as its call does
            assert e["t_ns"] == call
            late += 1
            lateness += (call - pin) / 1e9
        else:
            assert e["t_ns"] == pin
    starts = times(slow, "trajectory_start")
    real_starts = times(read_records(fast), "trajectory_start")
    late += int((starts > real_starts).sum())
    lateness += float((starts - real_starts).clip(lower=0).sum()) / 1e9
    assert late > 0
    assert pinned["late"] == late
    assert pinned["late_s"] == pytest.approx(lateness, abs=1e-5)


def test_pins_read_from_records_map_onto_the_workload(tmp_path: Path) -> None:
    path = trace(tmp_path, FAMILY, KIDS)
    w = build_workload(pd.read_parquet(path), 30.0)
    records = pd.DataFrame({
        "event": ["trajectory_start", "trajectory_start", "tool_end", "tool_end", "tool_end",
                  "trajectory_start"],
        "trajectory_id": ["P", "A", "A", "R", "R", "R"],
        "step": [np.nan, np.nan, 1.0, 1.0, 3.0, np.nan],
        "status": [None, None, "error", "ok", "timeout", None],
        "t_ns": [5_000_000_000, 6_000_000_000, 8_500_000_000, 9_000_000_000, 9_500_000_000,
                 7_000_000_000]})
    pins = pins_from_records(records, w, "r1")
    order = {tid: k for k, tid in enumerate(w.ids)}
    assert pins.start_s[order["P"]] == 0.0 and pins.start_s[order["A"]] == 1.0
    assert pins.start_s[order["R"]] == 2.0 and np.isnan(pins.start_s[order["B"]])
    assert pins.tool_end_s[w.first[order["A"]] + 1] == 3.5  # returned an error: pinned
    assert pins.tool_end_s[w.first[order["R"]] + 1] == 4.0
    assert np.isnan(pins.tool_end_s[w.first[order["R"]] + 3])  # timed out: not pinned
    assert pins.pinned == 5 and pins.source == "r1"
    with pytest.raises(InputError, match="trajectories this workload does not have"):
        pins_from_records(records.replace({"trajectory_id": {"A": "Z"}}), w, "r1")
    with pytest.raises(InputError, match="no trajectory_start"):
        pins_from_records(records[records["event"] == "tool_end"], w, "r1")


def test_the_cli_pins_to_a_replay_and_refuses_a_simulation(tmp_path: Path) -> None:
    path = trace(tmp_path, FAMILY, KIDS)
    cal = write_calibration(tmp_path / "cal.json", CAL)
    first = run(tmp_path, "first", path=path)
    base = ["simulate", "--trace", str(path), "--policy", "keep", "--calibration", str(cal),
            "--concurrency", "2", "--slots", "4", "--ctx-per-slot", "1000", "--no-summary"]
    ok = CliRunner().invoke(main, [*base, "--pinned-to", str(as_replay(first, tmp_path / "r")),
                                   "--out", str(tmp_path / "pinned")])
    assert ok.exit_code == 0, ok.output
    assert "pinned to replay" in ok.output and "0 reached later" in ok.output
    refused = CliRunner().invoke(main, [*base, "--pinned-to", str(first),
                                        "--out", str(tmp_path / "refused")])
    assert refused.exit_code == 2
    assert "a simulation; pin to a replay of a server" in refused.output
    fleet = CliRunner().invoke(main, [*base, "--servers", "2", "--pinned-to", str(first),
                                      "--out", str(tmp_path / "fleet")])
    assert fleet.exit_code == 2 and "not with --servers" in fleet.output


def test_llama_cpp_serves_saves_and_restores_in_its_loop(tmp_path: Path) -> None:
    # a pauses (its 12 tokens saved, then restored) while c decodes 60 tokens on the next slot:
    # on llama.cpp the loop does both transfers itself, so c's decode stops for each (12 ms at
    # 1 MB/s for 12,000 bytes); with keep it never does. a's resume prompt and decode tokens
    # cost the same in both runs.
    path = trace(tmp_path, {"a": [llm(10, 2), tool(0.05), llm(5, 2)], "c": [llm(10, 60)]})

    def c_end(policy: str) -> float:
        out = run(tmp_path, policy, policy=policy, path=path)
        return t_s(read_records(out), "call_end", "c")

    save = restore = 12 * 1000 / CAL.swap_out_bytes_per_s
    assert c_end("swap") - c_end("keep") == pytest.approx(save + restore)


def with_bystanders(replay: Path, sent: list[tuple[float, int, int]]) -> Path:
    """`replay` with bystander requests (start s, prompt tokens, output tokens) added to its
    records, each as a replay records one: its call_start, first_token and call_end."""
    part = sorted((replay / "records").glob("part-*.parquet"))[-1]
    table = pq.read_table(part)
    df = table.to_pandas()
    zero = int(df.loc[df["event"] == "trajectory_start", "t_ns"].min())
    seq = int(df["seq"].max())
    rows = []
    for k, (t, prompt, output) in enumerate(sent):
        for event, dt in (("call_start", 0.0), ("first_token", 0.05), ("call_end", 0.1)):
            row = df[df["event"] == event].iloc[0].copy()
            seq += 1
            row["seq"], row["t_ns"] = seq, zero + int((t + dt) * 1e9)
            row["trajectory_id"], row["traffic"], row["step"] = f"bystander-{k}", "bystander", 0
            row["prompt_tokens"] = prompt if event == "call_start" else row["prompt_tokens"]
            row["output_tokens"] = output if event == "call_end" else row["output_tokens"]
            rows.append(row)
    more = pd.concat([df, pd.DataFrame(rows)], ignore_index=True)
    for name in ("trajectory_id", "traffic", "event"):
        more[name] = more[name].astype(str)
    out = pa.Table.from_pandas(more, preserve_index=False).cast(pa.schema(
        [pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type)
         for f in table.schema]))
    pq.write_table(out.cast(table.schema), part)
    return replay


def test_a_replays_bystanders_run_beside_the_pinned_simulation(tmp_path: Path) -> None:
    replay = with_bystanders(as_replay(run(tmp_path, "first"), tmp_path / "replay"),
                             [(0.2, 300, 4), (1.5, 120, 2)])
    df = read_records(run(tmp_path, "pinned", pinned_to=replay))
    mine = df[df["traffic"].astype(str) == "bystander"]
    # only their calls' events, as a replay records them: no trajectory or KV state of theirs
    assert sorted(mine["event"].astype(str).unique()) == ["call_end", "call_start",
                                                          "first_token"]
    starts = mine[mine["event"].astype(str) == "call_start"].sort_values("t_ns")
    assert starts["trajectory_id"].astype(str).tolist() == ["bystander-0", "bystander-1"]
    zero = int(ev(df, "trajectory_start")["t_ns"].min())
    # sent when the replay sent them (the simulated client's overhead is 0 in CAL)
    assert ((starts["t_ns"] - zero) / 1e9).round(6).tolist() == [0.2, 1.5]
    assert starts["prompt_tokens"].tolist() == [300, 120]
    ends = mine[mine["event"].astype(str) == "call_end"].sort_values("t_ns")
    assert ends["output_tokens"].tolist() == [4, 2]
    # the agents' loop is the same: every trajectory of the trace, and only those, ran
    assert sorted(ev(df, "trajectory_start")["trajectory_id"].astype(str)) == sorted(FAMILY)
    pinned = read_manifest(tmp_path / "pinned").simulator["pinned_to"]
    assert pinned["bystanders"] == 2
    assert read_manifest(tmp_path / "pinned").outcome.completed == len(FAMILY)
