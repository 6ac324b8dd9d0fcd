"""ideal_reuse(): exact hit rates on small hand-built workloads."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from harness.traces.buckets import PAUSE_BUCKET_LABELS
from harness.traces.reuse import BUCKETS, DEFAULT_TAU_S, FIRST_CALL, ideal_reuse, pause_lengths
from harness.traces.schema import SYNTHETIC_DEFAULTS, steps_table
from harness.traces.validate import check_frame


def _llm(tid: str, step: int, inp: int, out: int, **kw: Any) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="llm", input_tokens=inp, output_tokens=out,
                **kw)


def _tool(tid: str, step: int, cls: str, lat: float | None, outcome: str = "ok",
          **kw: Any) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="tool", tool_name=cls, tool_class=cls,
                latency_s=lat, outcome=outcome, mutating=False, **kw)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = steps_table(rows, SYNTHETIC_DEFAULTS).to_pandas()
    assert check_frame(df, "t") == []
    return df


def family() -> pd.DataFrame:
    """a and b share group g (prefixes 100 and 80); b starts a sub-agent b/sa0 (group g-sub)."""
    a = dict(prefix_group="g", prefix_tokens=100)
    b = dict(prefix_group="g", prefix_tokens=80, start_s=1.0)
    c = dict(prefix_group="g-sub", prefix_tokens=50, start_s=1.0, parent_id="b", spawn_step=1)
    return _frame([
        _llm("a", 0, 150, 10, **a), _tool("a", 1, "local_read", 0.5, **a),
        _llm("a", 2, 20, 5, **a), _tool("a", 3, "human", 30.0, **a), _llm("a", 4, 10, 5, **a),
        _llm("b", 0, 100, 10, **b), _tool("b", 1, "subagent", 0.2, **b),
        _llm("b", 2, 40, 4, **b),
        _llm("b/sa0", 0, 60, 6, **c), _tool("b/sa0", 1, "local_read", 3.0, **c),
        _llm("b/sa0", 2, 10, 2, **c),
    ])


def test_family_overall() -> None:
    u = ideal_reuse(family(), tau_s=2.0, ttl_after="recompute")
    # Prompts: a 150, 160+20, 185+10; b 100, 110+40; b/sa0 60, 66+10.
    assert (u["calls"], u["prompt_tokens"]) == (7, 911)
    # Reusable: a's kept 160 and 185; b's first call finds a's prefix (min(80, 100)); b's
    # resumed call keeps 110; the sub-agent's group was not sent before; its resumed call 66.
    assert u["reusable_tokens"] == 160 + 185 + 80 + 110 + 66
    assert u["hit_rate"] == pytest.approx(601 / 911)
    pol = u["policies"]
    assert pol["keep"] == pol["swap"] == pytest.approx(601 / 911)
    assert pol["recompute"] == pytest.approx(80 / 911)
    # tau 2 s keeps only through a's 0.5 s read; b's pause lasts 0.2 s + its sub-agent's 3 s.
    assert pol["ttl"] == pytest.approx((80 + 160) / 911)
    assert (u["tau_s"], u["ttl_after"]) == (2.0, "recompute")
    # the policy's default swaps after tau: everything comes back, as with swap
    assert ideal_reuse(family(), tau_s=2.0)["policies"]["ttl"] == pytest.approx(601 / 911)
    with pytest.raises(ValueError, match="ttl_after"):
        ideal_reuse(family(), ttl_after="keep")


def test_family_by_bucket() -> None:
    u = ideal_reuse(family(), tau_s=5.0, ttl_after="recompute")
    assert [b["bucket"] for b in u["by_bucket"]] == list(BUCKETS)
    by = {b["bucket"]: b for b in u["by_bucket"]}
    first = by[FIRST_CALL]
    assert (first["calls"], first["prompt_tokens"], first["reusable_tokens"]) == (3, 310, 80)
    assert list(first["policies"].values()) == pytest.approx([80 / 310] * 4)
    fast = by["0.1-1s"]
    assert (fast["calls"], fast["prompt_tokens"], fast["reusable_tokens"]) == (1, 180, 160)
    assert fast["policies"]["recompute"] == 0.0 and fast["policies"]["ttl"] == pytest.approx(
        160 / 180)
    mid = by["1-10s"]  # b after 3.2 s, b/sa0 after 3 s
    assert (mid["calls"], mid["prompt_tokens"], mid["reusable_tokens"]) == (2, 226, 176)
    assert mid["policies"]["ttl"] == pytest.approx(176 / 226)  # tau 5 s keeps both
    slow = by["10-60s"]
    assert (slow["calls"], slow["prompt_tokens"], slow["reusable_tokens"]) == (1, 195, 185)
    assert slow["policies"]["ttl"] == 0.0
    assert (slow["min_s"], slow["max_s"]) == (10.0, 60.0)
    empty = by[">=60s"]
    assert (empty["calls"], empty["hit_rate"], empty["min_s"], empty["max_s"]) == (0, None,
                                                                                 60.0, None)
    assert set(empty["policies"].values()) == {None}
    assert by["<0.1s"]["calls"] == 0
    assert u["policies"]["ttl"] == pytest.approx((80 + 160 + 110 + 66) / 911)


def test_pause_lengths_add_the_longest_child() -> None:
    df = family()
    p = pause_lengths(df)
    tool = (df["kind"] == "tool").to_numpy()
    assert np.isnan(p[~tool]).all()
    assert list(p[tool]) == pytest.approx([0.5, 30.0, 3.2, 3.0])


def test_nested_subagents_and_fanout() -> None:
    """r starts x and y at step 1; x starts z at its step 1: r's pause is its residual plus the
    longest child tool time, x's own pause including z's."""
    x = dict(parent_id="r", spawn_step=1)
    z = dict(parent_id="x", spawn_step=1)
    df = _frame([
        _llm("r", 0, 10, 1), _tool("r", 1, "subagent", 1.0), _llm("r", 2, 5, 1),
        _llm("x", 0, 10, 1, **x), _tool("x", 1, "subagent", 0.5, **x), _llm("x", 2, 5, 1, **x),
        _tool("x", 3, "sandbox", 2.0, **x), _llm("x", 4, 5, 1, **x),
        _llm("y", 0, 10, 1, **x), _tool("y", 1, "sandbox", 4.0, **x), _llm("y", 2, 5, 1, **x),
        _llm("z", 0, 10, 1, **z), _tool("z", 1, "local_read", 6.0, **z), _llm("z", 2, 5, 1, **z),
    ])
    p = pause_lengths(df)
    tool = (df["kind"] == "tool").to_numpy()
    # x: 0.5 + z's 6 = 6.5, then 2 -> 8.5 of tool time; y: 4; r: 1 + max(8.5, 4).
    assert list(p[tool]) == pytest.approx([9.5, 6.5, 2.0, 4.0, 6.0])


def test_keep_tokens_cut_what_is_reusable() -> None:
    df = _frame([_llm("c", 0, 100, 10), _tool("c", 1, "local_read", 1.0),
                 _llm("c", 2, 20, 5, keep_tokens=50)])
    u = ideal_reuse(df)
    assert (u["prompt_tokens"], u["reusable_tokens"]) == (100 + 70, 50)
    assert u["policies"]["ttl"] == pytest.approx(50 / 170)  # 1 s <= the default 2 s


def test_default_prefix_and_start_order() -> None:
    """Null prefix_tokens is 128 tokens, capped at the first call; e starts first though it
    comes second in the file, so d's first call finds e's 100 tokens."""
    d = dict(prefix_group="h", start_s=5.0)
    e = dict(prefix_group="h", start_s=0.0)
    df = _frame([_llm("d", 0, 200, 1, **d), _llm("e", 0, 100, 1, **e),
                 _llm("f", 0, 300, 1, prefix_group="h", start_s=9.0)])
    u = ideal_reuse(df)
    # d: min(128, 100 sent by e) = 100; e: nothing before it; f: min(128, max sent 128).
    assert (u["prompt_tokens"], u["reusable_tokens"]) == (600, 100 + 128)
    assert u["policies"]["recompute"] == pytest.approx(228 / 600)


def test_no_groups_no_prefix_reuse_and_timeout_pause() -> None:
    """A tool with null latency that times out: the pause before the next call is its
    deadline (here 45 s)."""
    df = _frame([_llm("t", 0, 40, 2), _tool("t", 1, "remote_read", None, "timeout",
                                             deadline_s=45.0),
                 _llm("t", 2, 8, 2)])
    u = ideal_reuse(df)
    by = {b["bucket"]: b for b in u["by_bucket"]}
    assert by[FIRST_CALL]["reusable_tokens"] == 0
    assert (by["10-60s"]["calls"], by["10-60s"]["reusable_tokens"]) == (1, 42)
    assert u["hit_rate"] == pytest.approx(42 / 90)


def test_buckets_are_the_shared_ones() -> None:
    """The breakdown uses harness.traces.buckets' edges, so a run's measured reuse lines up."""
    by = ideal_reuse(family())["by_bucket"]
    assert [b["bucket"] for b in by] == [FIRST_CALL, *PAUSE_BUCKET_LABELS]
    # A pause of exactly an edge goes to the bucket above it: 1 s is 1-10s.
    df = _frame([_llm("e", 0, 10, 1), _tool("e", 1, "local_read", 1.0), _llm("e", 2, 1, 1)])
    one = {b["bucket"]: b["calls"] for b in ideal_reuse(df)["by_bucket"]}
    assert one["1-10s"] == 1 and one["0.1-1s"] == 0


def test_tau_default_and_refused() -> None:
    assert DEFAULT_TAU_S == 2.0
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="tau_s"):
            ideal_reuse(family(), tau_s=bad)
