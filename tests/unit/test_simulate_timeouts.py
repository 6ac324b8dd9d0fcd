"""The client's first-token timeout in the simulator, as a replay's client applies it: a call
without its first token that long after it was sent fails its trajectory, wherever it waits
(for memory, in the queue for a slot, in its prefill), and what it held is released."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.adapters.http import Timeouts
from harness.bench.run import replay_first_token_timeout
from harness.cli import main
from harness.model.calibration import write_calibration
from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.simulate.options import SimOptions
from harness.simulate.run import FIRST_TOKEN_TIMEOUT_S, Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import ALPHA, BETA, CAL, ev, llm, t_s, tool, trace


def run(tmp: Path, path: Path, cap: Capacity, timeout_s: float, policy: str = "keep"
        ) -> tuple[pd.DataFrame, dict[str, Any]]:
    out = tmp / "out"
    manifest = run_simulation(SimOptions(path, policy, {}, cap, None, Arrivals("closed", 8), 0,
                                         out, write_summary=False,
                                         first_token_timeout_s=timeout_s), CAL)
    return read_records(out), manifest.to_dict()


def test_the_default_is_the_replay_clients() -> None:
    assert Timeouts().first_byte_s == FIRST_TOKEN_TIMEOUT_S


def test_a_stall_for_memory_ends_when_the_waiting_call_times_out(tmp_path: Path) -> None:
    # Both keep 110 tokens of a 250-token pool through their pause; neither can grow by the
    # 110 its resumed call needs. a's call times out 5 s after it was sent, a fails and
    # releases its 110 tokens, and b grows at once (no preemption).
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(100, 10)],
                            "b": [llm(100, 10), tool(2.0), llm(100, 10)]})
    df, m = run(tmp_path, path, Capacity(tokens=250), 5.0)
    assert m["simulator"]["preemptions"] == 0
    assert m["simulator"]["first_token_timeout_s"] == 5.0
    assert (m["outcome"]["completed"], m["outcome"]["failed"]) == (1, 1)
    end = ev(df, "call_end", "a").iloc[1]
    assert (end["status"], end["detail"]) == ("timeout", "timeout: no token within 5 s")
    assert math.isnan(end["prompt_n"]) if isinstance(end["prompt_n"], float) else (
        pd.isna(end["prompt_n"]))
    assert t_s(df, "call_end", "a", 1) - t_s(df, "tool_end", "a") == pytest.approx(5.0)
    traj = ev(df, "trajectory_end", "a").iloc[0]
    assert (traj["status"], traj["reason"]) == ("failed", "timeout: no token within 5 s")
    # b's resumed call grows as a's tokens are released: one iteration of its 100 new tokens
    released = t_s(df, "call_end", "a", 1)
    assert t_s(df, "first_token", "b", 1) - released == pytest.approx(ALPHA + 100 * BETA)
    assert len(ev(df, "first_token", "a")) == 1  # a's resumed call never had one


def test_without_a_timeout_the_idle_server_preempts_instead(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(100, 10)],
                            "b": [llm(100, 10), tool(2.0), llm(100, 10)]})
    df, m = run(tmp_path, path, Capacity(tokens=250), math.inf)
    assert m["simulator"]["preemptions"] == 1
    assert m["simulator"]["first_token_timeout_s"] is None
    assert m["outcome"]["completed"] == 2
    assert "timeout" not in set(ev(df, "call_end")["status"])


def test_a_call_waiting_for_memory_times_out_but_not_one_waiting_for_a_slot(
        tmp_path: Path) -> None:
    # b waits behind a's 500-token answer (about 5 s). In a token pool it waits inside the
    # server and gives up after 4 s, never admitted; on slots the replay takes a slot before
    # it sends the call, so the timeout runs from there and b completes.
    path = trace(tmp_path, {"a": [llm(100, 500)], "b": [llm(150, 1)]})
    df, m = run(tmp_path, path, Capacity(tokens=700), 4.0)
    assert (m["outcome"]["completed"], m["outcome"]["failed"]) == (1, 1)
    assert t_s(df, "call_end", "b") == pytest.approx(4.0)
    assert ev(df, "call_start", "b").empty
    assert ev(df, "call_end", "a")["status"].tolist() == ["ok"]
    df, m = run(tmp_path / "slots", path, Capacity(slots=1, ctx_per_slot=1000), 4.0)
    assert m["outcome"]["completed"] == 2
    assert t_s(df, "call_start", "b") == t_s(df, "call_end", "a") > 4.0


def test_a_call_in_its_prefill_is_taken_out_of_the_batch(tmp_path: Path) -> None:
    # 5,000 prompt tokens at 1 ms each cannot finish within 2 s: the call is aborted in its
    # prefill; the iteration running then (its first chunk of 2,048 tokens) ends as composed,
    # and its KV is released there.
    path = trace(tmp_path, {"a": [llm(5000, 10)]})
    df, m = run(tmp_path, path, Capacity(tokens=10_000), 2.0)
    assert m["outcome"]["failed"] == 1
    assert t_s(df, "call_end", "a") == pytest.approx(2.0)
    assert ev(df, "first_token").empty
    assert ev(df, "kv_state", "a")["status"].iloc[-1] == "released"
    assert m["duration_s"] == pytest.approx(ALPHA + 2048 * BETA)


def test_a_first_token_in_time_is_no_timeout(tmp_path: Path) -> None:
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(20, 5)]})
    df, m = run(tmp_path, path, Capacity(tokens=1000), 1.0)
    assert m["outcome"]["completed"] == 1
    assert ev(df, "call_end")["status"].tolist() == ["ok", "ok"]


def test_a_bench_simulates_with_its_replays_timeout() -> None:
    real = RunManifest(run_id="r", runtime="vllm", server_version="0", model={},
                       policy="keep", policy_args={})
    assert replay_first_token_timeout(real) == FIRST_TOKEN_TIMEOUT_S
    real.http = {"timeouts_s": {"first_byte_s": 120.0, "idle_s": 120.0}}
    assert replay_first_token_timeout(real) == 120.0


@pytest.mark.parametrize(("value", "ok"), [("none", True), ("30", True), ("0", False),
                                           ("-1", False), ("soon", False), ("nan", False)])
def test_cli_first_token_timeout(tmp_path: Path, value: str, ok: bool) -> None:
    cal = write_calibration(tmp_path / "cal.json", CAL)
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(20, 5)]})
    res = CliRunner().invoke(main, ["simulate", "--trace", str(path), "--policy", "keep",
                                    "--capacity-tokens", "1000", "--calibration", str(cal),
                                    "--first-token-timeout", value, "--no-summary",
                                    "--out", str(tmp_path / "o")])
    if ok:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 2
        assert "--first-token-timeout" in res.output


def test_the_watch_does_not_lengthen_the_run(tmp_path: Path) -> None:
    # the last call's watch falls due 600 s after it was sent, with nothing left to watch: the
    # run lasted until its last record, as without a timeout
    path = trace(tmp_path, {"a": [llm(100, 10), tool(1.0), llm(20, 5)]})
    for timeout_s in (FIRST_TOKEN_TIMEOUT_S, math.inf):
        df, manifest = run(tmp_path / str(timeout_s), path, Capacity(tokens=1000), timeout_s)
        assert manifest["duration_s"] == pytest.approx(df["t_ns"].max() / 1e9)
        assert manifest["duration_s"] < 2.0
