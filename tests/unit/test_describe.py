"""describe(): exact values on a small hand-built workload, and `traces describe` output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.traces.schema import COLUMNS, Provenance, write_trajectories
from harness.traces.stats import describe, quantiles, retained_tokens_at_pauses


def _llm(tid: str, step: int, inp: int, out: int) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="llm", input_tokens=inp, output_tokens=out)


def _tool(tid: str, step: int, cls: str, lat: float | None, outcome: str) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="tool", tool_name=cls, tool_class=cls,
                latency_s=lat, outcome=outcome, mutating=False)


def frame() -> pd.DataFrame:
    """a: two pauses (0.5 s ok, 1.5 s error); b: one that never returns; c: no pause."""
    rows = [
        _llm("a", 0, 100, 10), _tool("a", 1, "remote_read", 0.5, "ok"), _llm("a", 2, 20, 5),
        _tool("a", 3, "local_read", 1.5, "error"), _llm("a", 4, 30, 7),
        _llm("b", 0, 50, 5), _tool("b", 1, "remote_read", None, "abandoned"),
        _llm("c", 0, 10, 2),
    ]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["start_s"], df["priority"], df["tenant"] = 0.0, "interactive", "t"
    df["step"] = df["step"].astype("int32")
    for c in ("input_tokens", "output_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("latency_s", "deadline_s"):
        df[c] = df[c].astype("float64")
    df["mutating"] = df["mutating"].astype("boolean")
    return df


def test_describe_exact_values() -> None:
    d = describe(frame())
    assert (d["trajectories"], d["steps"], d["llm_calls"], d["tool_calls"]) == (3, 8, 5, 3)
    assert d["abandoned"] == 1 and d["abandoned_fraction"] == pytest.approx(1 / 3)
    assert d["tool_calls_by_class"] == {"local_read": 1, "remote_read": 2}
    assert d["tool_latency_s"] == pytest.approx({"n": 2, "p50": 1.0, "p95": 1.45, "p99": 1.49})
    by = d["tool_latency_s_by_class"]
    assert by["remote_read"]["calls"] == 2 and by["remote_read"]["never_return"] == 1
    assert by["remote_read"]["errors"] == 0
    assert by["remote_read"]["latency_s"] == {"n": 1, "p50": 0.5, "p95": 0.5, "p99": 0.5}
    assert (by["local_read"]["calls"], by["local_read"]["errors"]) == (1, 1)
    # Retained tokens at the pauses: 100+10 = 110, 110+20+5 = 135, 50+5 = 55.
    assert d["retained_tokens"] == pytest.approx(
        {"n": 3, "p50": 110.0, "p95": 132.5, "p99": 134.5, "max": 135})
    assert d["turns_per_trajectory"] == pytest.approx({"n": 3, "p50": 1.0, "p95": 2.8,
                                                       "p99": 2.96})
    assert (d["input_tokens_total"], d["output_tokens_total"]) == (210, 29)


def test_retained_tokens_at_pauses() -> None:
    assert list(retained_tokens_at_pauses(frame())) == [110, 135, 55]


def test_quantiles_of_nothing() -> None:
    assert quantiles(np.array([])) == {"n": 0, "p50": None, "p95": None, "p99": None}
    assert quantiles(np.array([np.nan, 2.0])) == {"n": 1, "p50": 2.0, "p95": 2.0, "p99": 2.0}


def test_describe_without_pauses() -> None:
    df = frame()
    d = describe(df[df["trajectory_id"] == "c"])
    assert (d["tool_calls"], d["abandoned"], d["abandoned_fraction"]) == (0, 0, 0.0)
    assert d["retained_tokens"]["max"] is None and d["tool_latency_s"]["p50"] is None


def _written(tmp_path: Path) -> Path:
    return write_trajectories(frame(), tmp_path / "w.parquet", Provenance("test"))


def test_cli_describe_json(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["traces", "describe", "--json", str(_written(tmp_path))])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("trajectories", "llm_calls", "tool_calls", "abandoned", "tool_latency_s",
                "retained_tokens"):
        assert key in d
    assert {"p50", "p95", "p99"} <= set(d["tool_latency_s"])
    assert {"p50", "p95", "p99", "max"} <= set(d["retained_tokens"])
    assert (d["trajectories"], d["llm_calls"], d["tool_calls"], d["abandoned"]) == (3, 5, 3, 1)
    assert d["retained_tokens"]["max"] == 135


def test_cli_describe_text(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["traces", "describe", str(_written(tmp_path))])
    assert r.exit_code == 0, r.output
    assert "trajectories 3, steps 8, LLM calls 5, tool calls 3" in r.output
    assert "abandoned (never return): 1 (33.33% of tool calls)" in r.output
    assert "max 135" in r.output


def test_cli_describe_invalid_file(tmp_path: Path) -> None:
    p = tmp_path / "x.parquet"
    p.write_text("nope")
    r = CliRunner().invoke(main, ["traces", "describe", str(p)])
    assert r.exit_code == 2 and "[not-parquet]" in r.output and "Traceback" not in r.output


def test_describe_ideal_reuse_and_no_subagents() -> None:
    d = describe(frame())
    assert d["subagents"] == {"children": 0, "subagent_steps": 0, "max_fanout": 0}
    u = d["ideal_reuse"]
    # Prompts: a 100, 110+20, 135+30; b 50; c 10. Kept: 110 and 135; no prefix groups.
    assert (u["calls"], u["prompt_tokens"], u["reusable_tokens"]) == (5, 455, 245)
    assert u["hit_rate"] == pytest.approx(245 / 455)
    assert u["policies"] == pytest.approx({"keep": 245 / 455, "swap": 245 / 455,
                                           "recompute": 0.0, "ttl": 245 / 455})
    by = {b["bucket"]: b for b in u["by_bucket"]}
    assert (by["first call"]["calls"], by["first call"]["hit_rate"]) == (3, 0.0)
    assert (by["0.1-1s"]["prompt_tokens"], by["0.1-1s"]["reusable_tokens"]) == (130, 110)
    assert (by["1-10s"]["prompt_tokens"], by["1-10s"]["reusable_tokens"]) == (165, 135)
    assert "import" not in d


def family() -> pd.DataFrame:
    """p starts q0, q1, q2 at step 1 and q3 at step 3 (all in group g-sub, prefix 40)."""
    kid = dict(prefix_group="g-sub", prefix_tokens=40, parent_id="p")
    rows = [_llm("p", 0, 100, 5), _tool("p", 1, "subagent", 0.1, "ok"), _llm("p", 2, 30, 5),
            _tool("p", 3, "subagent", 0.2, "ok"), _llm("p", 4, 30, 5)]
    for k, spawn in enumerate((1, 1, 1, 3)):
        rows += [_llm(f"p/sa{k}", 0, 50, 5) | kid | {"spawn_step": spawn}]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["start_s"], df["priority"], df["tenant"] = 0.0, "interactive", "t"
    return df


def test_describe_subagents() -> None:
    d = describe(family())
    assert d["subagents"] == {"children": 4, "subagent_steps": 2, "max_fanout": 3}
    u = d["ideal_reuse"]
    # Four first calls of g-sub: the last three find 40 prefix tokens sent.
    by = {b["bucket"]: b for b in u["by_bucket"]}
    assert by["first call"]["reusable_tokens"] == 3 * 40


def test_retained_tokens_follow_keep_tokens() -> None:
    df = frame()
    df["keep_tokens"] = pd.array([None, None, 60, None, None, None, None, None], dtype="Int64")
    # a's second pause holds the 60 kept tokens plus 20 appended and 5 generated.
    assert list(retained_tokens_at_pauses(df)) == [110, 85, 55]


def test_import_totals_in_describe_and_text(tmp_path: Path) -> None:
    prov = Provenance("kv-cache-tester", extra={
        "files": 3, "totals": {"parent_tokens": {"input": 12345, "output": 67}}})
    d = describe(frame(), prov)
    assert d["import"] == {"files": 3, "totals": {"parent_tokens": {"input": 12345,
                                                                     "output": 67}}}
    assert "import" not in describe(frame(), Provenance("generator", extra={"seed": 1}))
    path = write_trajectories(frame(), tmp_path / "i.parquet", prov)
    r = CliRunner().invoke(main, ["traces", "describe", str(path)])
    assert r.exit_code == 0, r.output
    assert "imported from 3 source files" in r.output
    assert "parent_tokens.input" in r.output and "12,345" in r.output
    r = CliRunner().invoke(main, ["traces", "describe", "--json", str(path)])
    assert json.loads(r.output)["import"]["files"] == 3


def test_cli_describe_text_reuse_and_subagents(tmp_path: Path) -> None:
    path = write_trajectories(family(), tmp_path / "f.parquet", Provenance("test"))
    r = CliRunner().invoke(main, ["traces", "describe", str(path)])
    assert r.exit_code == 0, r.output
    assert "sub-agents: 4 started by 2 subagent steps, at most 3 at once" in r.output
    assert "ideal prefix reuse (unlimited cache):" in r.output
    assert "recompute" in r.output and "(tau 2 s, then swap)" in r.output
    lines = [ln.split() for ln in r.output.splitlines()]
    first = next(ln for ln in lines if ln[:2] == ["first", "call"])
    assert first[2:4] == ["5", "300"]  # 5 first calls, 100 + 4 x 50 prompt tokens
    assert "10-60s" not in r.output  # empty buckets are left out


def test_cli_describe_shipped_sessions_sample() -> None:
    sample = Path(__file__).resolve().parents[2] / "traces" / "coding-subagents.parquet"
    r = CliRunner().invoke(main, ["traces", "describe", "--json", str(sample)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["subagents"]["children"] == 16 and d["subagents"]["max_fanout"] == 3
    assert d["ideal_reuse"]["hit_rate"] == pytest.approx(1 - 8103 / 62765)


def test_cli_describe_lists_source_files(tmp_path: Path) -> None:
    per = [{"file": f"t{i}.json", "requests": 10 * i} for i in range(12)]
    prov = Provenance("kv", extra={"files": per, "totals": {"files": 12, "requests": 660}})
    path = write_trajectories(frame(), tmp_path / "l.parquet", prov)
    r = CliRunner().invoke(main, ["traces", "describe", str(path)])
    assert r.exit_code == 0, r.output
    assert "imported from 12 source files" in r.output
    out = r.output.splitlines()
    at = out.index("    t1.json")
    assert out[at + 1] == "      requests 10" and "t11.json" not in r.output
    assert out[out.index("    t0.json") + 1] == "    t1.json"  # t0 counted nothing
    assert "... and 2 more (--json lists them)" in r.output
    assert [ln.split() for ln in r.output.splitlines()][-1] == ["requests", "660"]


@pytest.mark.parametrize("name", ["gap", "none", "no_tool"])
def test_a_gap_between_back_to_back_calls_is_not_a_tool_call(name: str, tmp_path: Path) -> None:
    # the shared marker, and the names earlier importers gave it
    df = frame()
    df.loc[3, "tool_name"], df.loc[3, "latency_s"], df.loc[3, "outcome"] = name, 0.0, "ok"
    d = describe(df)
    assert (d["tool_calls"], d["gap_steps"]) == (2, 1)
    assert d["tool_calls_by_class"] == {"remote_read": 2}
    assert d["abandoned_fraction"] == pytest.approx(1 / 2)
    assert d["tool_latency_s"]["n"] == 1
    df.loc[3, "tool_class"] = "mutating"  # a real tool that happens to be named so
    assert describe(df)["gap_steps"] == 0
    p = write_trajectories(frame().assign(tool_name=lambda f: f["tool_name"].where(
        f.index != 3, name)), tmp_path / "t.parquet", Provenance("test", []))
    res = CliRunner().invoke(main, ["traces", "describe", str(p)])
    assert "tool calls 2 (and 1 gap steps between back-to-back calls)" in res.output
