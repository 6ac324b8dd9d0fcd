"""vLLM's memory in the engine model (harness.simulate.growth): a call is admitted with its
prompt's blocks and grows block by block as it decodes; when the pool has no block for a
running call, the call admitted last is preempted and readmitted later, recomputing what is no
longer cached. SGLang's model keeps reserving the output at admission."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.simulate.growth import admission_tokens
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, run_simulation
from harness.simulate.server import Capacity
from tests.unit.test_simulate import CAL, ev, llm, t_s, tool, trace

# two calls of 100 prompt tokens that decode 100 each, at once, on a 256-token pool: their
# prompts fit together (7 blocks of 16 each), their whole contexts (200 each) do not
TWO = {"a": [llm(100, 100)], "b": [llm(100, 100)]}


def run(tmp: Path, trajs: dict[str, list[tuple[object, ...]]], policy: str, engine: str,
        tokens: int) -> tuple[RunManifest, pd.DataFrame]:
    out = tmp / engine / "out"
    m = run_simulation(SimOptions(trace(tmp, trajs), policy, {}, Capacity(
        tokens=tokens, engine=engine, block_size=16), None, Arrivals("closed", 8), 0, out,
            write_summary=False), CAL)
    return m, read_records(out)


def test_admission_is_the_prompt_and_first_token_in_whole_blocks() -> None:
    # 91 tokens -> 6 blocks; no output: the prompt alone (20 -> 2 blocks); one token: 50 -> 4
    assert admission_tokens([100, 20, 50], [10, 0, 1], 16) == [96, 32, 64]
    assert admission_tokens([100], [10], 1) == [91]


def test_vllm_admits_both_prompts_then_preempts_the_later_call(tmp_path: Path) -> None:
    m, df = run(tmp_path, TWO, "keep", "vllm", 256)
    assert m.simulator is not None and m.simulator["preempted_calls"] == 1
    # both start at once (their prompts fit), where a whole-context reservation serializes
    assert t_s(df, "call_start", "a") == t_s(df, "call_start", "b") == 0.0
    # b, admitted last, is preempted: its stream pauses, so it ends after a, which never waits
    assert t_s(df, "call_end", "b") > t_s(df, "call_end", "a")
    for tid in TWO:  # one call each, however often it was preempted
        assert len(ev(df, "call_start", tid)) == len(ev(df, "call_end", tid)) == 1
    assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 2
    # b's first token came before its preemption: the time to it is the prompt's alone
    assert t_s(df, "first_token", "b") < t_s(df, "call_end", "a")


def test_sglang_reserves_the_output_at_admission(tmp_path: Path) -> None:
    m, df = run(tmp_path, TWO, "keep", "sglang", 256)
    assert m.simulator is not None and m.simulator["preempted_calls"] == 0
    # b waits for a's whole context to be released
    assert t_s(df, "call_start", "b") >= t_s(df, "call_end", "a")


def test_a_pool_with_room_preempts_nothing(tmp_path: Path) -> None:
    m, df = run(tmp_path, TWO, "keep", "vllm", 512)
    assert m.simulator is not None and m.simulator["preempted_calls"] == 0
    assert t_s(df, "call_end", "a") == t_s(df, "call_end", "b")


def test_a_preempted_call_keeps_its_pinned_context(tmp_path: Path) -> None:
    # a pins its first context (112 tokens) through the pause and resumes with a short prompt
    # that decodes long; b, started during a's pause, leaves no room for both to grow
    trajs = {"a": [llm(100, 10), tool(0.2), llm(10, 150)], "b": [llm(60, 150)]}
    out = tmp_path / "out"
    m = run_simulation(SimOptions(trace(tmp_path, trajs, {"a": 0.0, "b": 0.25}), "keep", {},
                                  Capacity(tokens=320, engine="vllm", block_size=16), None,
                                  Arrivals("trace", 8, 1.0), 0, out, write_summary=False), CAL)
    df = read_records(out)
    assert m.simulator is not None and m.simulator["preempted_calls"] >= 1
    assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 2
    # the pin is never erased by a preemption: a's only erase is its trajectory's end
    assert ev(df, "erase", "a")["reason"].tolist() == ["trajectory-end"]


def test_on_vllm_a_pinned_resume_waits_behind_an_earlier_call(tmp_path: Path) -> None:
    # a pins 110 tokens through its pause and resumes at about 1.26 s needing 21 more; c came
    # at 1.1 s needing 201 of the pool b's decode is filling. vLLM serves one FCFS queue whose
    # head blocks the rest: a waits behind c until b's end frees the pool; SGLang's model lets
    # a's resume, which holds its context, grow first. On vLLM c's 201 fit beside b once a's
    # pin is released (the valve under lru, at 1.1 s), which SGLang's model, reserving b's
    # whole output, cannot do: there c waits for b.
    trajs = {"a": [llm(100, 10), tool(1.0), llm(20, 5)], "b": [llm(50, 200)],
             "c": [llm(200, 10)]}
    path = trace(tmp_path, trajs, {"a": 0.0, "b": 0.0, "c": 1.1})
    for engine in ("vllm", "sglang"):
        out = tmp_path / engine
        run_simulation(SimOptions(path, "keep", {}, Capacity(tokens=400, engine=engine,
                                  block_size=1), None, Arrivals("trace", 8, 1.0), 0, out,
                                  write_summary=False, pin_release="lru"), CAL)
        df = read_records(out)
        resumed = t_s(df, "call_start", "a", 1)
        if engine == "vllm":
            assert t_s(df, "call_start", "c") == 1.1 < t_s(df, "tool_end", "a") < resumed
            assert ev(df, "hint_outcome")["status"].tolist() == ["clipped"]
        else:
            assert resumed == t_s(df, "tool_end", "a") < t_s(df, "call_start", "c")
        assert ev(df, "trajectory_end")["status"].tolist() == ["completed"] * 3
