"""compare_views(): two views of the same sessions, and `harness traces compare-views`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from click.testing import CliRunner

from harness.cli import main
from harness.traces.compare_views import MATCH_ID, MATCH_ORDER, compare_views, verdict
from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories
from harness.traces.validate import load_trajectories


def _llm(tid: str, step: int, inp: int, **kw: Any) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="llm", input_tokens=inp, output_tokens=10,
                **kw)


def _tool(tid: str, step: int, lat: float, cls: str = "local_read", **kw: Any
          ) -> dict[str, Any]:
    return dict(trajectory_id=tid, step=step, kind="tool", tool_name=cls, tool_class=cls,
                latency_s=lat, outcome="ok", mutating=False, **kw)


def _session(root: str = "r", *, sub2_parent: str = "s1", sub2_spawn: int = 1,
             extra_call: bool = False, read_latency: float = 2.0) -> list[dict[str, Any]]:
    """A root that starts sub-agent s1 at step 1; s1 starts s2 at its step 1."""
    s1 = {"parent_id": root, "spawn_step": 1}
    s2 = {"parent_id": sub2_parent, "spawn_step": sub2_spawn}
    rows = [
        _llm(root, 0, 1000), _tool(root, 1, 5.0, "subagent"), _llm(root, 2, 200),
        _tool(root, 3, read_latency), _llm(root, 4, 50),
        _llm("s1", 0, 300, **s1),
        # s1's step starts s2 only where s2 hangs off s1 (else it is a plain tool call).
        _tool("s1", 1, 3.0, "subagent" if sub2_parent == "s1" else "local_read", **s1),
        _llm("s1", 2, 40, **s1),
        _llm("s2", 0, 100, **s2), _tool("s2", 1, 0.5, **s2), _llm("s2", 2, 20, **s2),
    ]
    if extra_call:
        rows += [_tool("s2", 3, 0.25, **s2), _llm("s2", 4, 30, **s2)]
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    return write_trajectories(steps_table(rows, SYNTHETIC_DEFAULTS), path, Provenance("test"))


def _frame(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    return load_trajectories(_write(tmp_path / name, rows))


def _fields(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["field"]: f for f in tree["fields"]}


def test_agreeing_views_are_the_same(tmp_path: Path) -> None:
    a = _frame(tmp_path, "a.parquet", _session())
    b = _frame(tmp_path, "b.parquet", _session())
    out = compare_views(a, b)
    assert out["summary"] == {"pairs": 1, "pairs_that_differ": 0, "only_in_a": 0,
                              "only_in_b": 0}
    (tree,) = out["trees"]
    assert tree["matched_by"] == MATCH_ID and tree["agrees"]
    f = _fields(tree)
    assert f["llm calls"]["a"] == 7 and f["tool calls"]["a"] == 4
    assert f["sub-agents"]["a"] == 2 and f["max spawn depth"]["a"] == 2
    assert f["parent links"]["a"] == ["sub1 <- root@1 depth 1", "sub2 <- sub1@1 depth 2"]
    assert all(x["verdict"] == "same" for x in tree["fields"])
    assert tree["prompt_differences"] == [] and tree["largest_latency_difference"] is None


def test_exactly_the_differences_are_reported(tmp_path: Path) -> None:
    a = _frame(tmp_path, "a.parquet", _session())
    # B: s2 hangs off the root's step 1 (wrong parent link), one more call in s2, and the
    # root's read took 3 s instead of 2 s.
    b = _frame(tmp_path, "b.parquet", _session(sub2_parent="r", extra_call=True,
                                               read_latency=3.0))
    (tree,) = compare_views(a, b)["trees"]
    assert not tree["agrees"]
    differs = {k: v["verdict"] for k, v in _fields(tree).items() if v["verdict"] != "same"}
    assert differs == {
        "llm calls": "+1 (+14.3%)",
        "tool calls": "+1 (+25.0%)",
        "max spawn depth": "-1 (-50.0%)",
        "parent links": "differs",
        "prompt tokens (sum)": "+170 (+3.9%)",  # the extra call's prompt: 140 + 30
        "tool latency p50 (s)": "+0.5 (+20.0%)",  # 2.5 -> 3
        "tool latency p95 (s)": "-0.1 (-2.1%)",  # 4.7 -> 4.6
    }
    assert _fields(tree)["parent links"]["b"] == ["sub1 <- root@1 depth 1",
                                                  "sub2 <- root@1 depth 1"]
    assert _fields(tree)["sub-agents"]["verdict"] == "same"
    # Every paired call has the same prompt; the extra call is counted, not paired.
    assert tree["prompt_differences"] == []
    big = tree["largest_latency_difference"]
    assert (big["trajectory"], big["tool_step"], big["a"], big["b"]) == ("root", 1, 2.0, 3.0)


def test_trees_pair_by_order_of_start_when_ids_differ(tmp_path: Path) -> None:
    def renamed(root: str, start: float) -> list[dict[str, Any]]:
        rows = [r | {"start_s": start} for r in _session(root)]
        return [r | {"trajectory_id": f"{root}.{r['trajectory_id']}",
                     "parent_id": f"{root}.{r['parent_id']}" if r.get("parent_id") else None}
                for r in rows]
    a = _frame(tmp_path, "a.parquet", renamed("x", 0.0) + renamed("y", 5.0))
    b_rows = renamed("p", 0.0) + renamed("q", 5.0) + renamed("z", 9.0)
    b_rows = [r | {"input_tokens": 1500} if r["trajectory_id"] == "q.q" and r["step"] == 0
              else r for r in b_rows]
    out = compare_views(a, _frame(tmp_path, "b.parquet", b_rows))
    pairs = [(t["a_root"], t["b_root"], t["matched_by"]) for t in out["trees"]]
    assert pairs == [("x.x", "p.p", MATCH_ORDER),
                     ("y.y", "q.q", "order of start only (first prompt differs)")]
    assert out["only_in_b"] == ["z.z"] and out["only_in_a"] == []
    # The root's first prompt is 500 longer, and so is every later prompt of the root.
    diffs = [(d["trajectory"], d["call"], d["b"] - d["a"])
             for d in out["trees"][1]["prompt_differences"]]
    assert diffs == [("root", 0, 500), ("root", 1, 500), ("root", 2, 500)]


def test_verdict() -> None:
    assert verdict(3, 3) == "same"
    assert verdict(4, 5) == "+1 (+25.0%)"
    assert verdict(0, 2) == "+2 (new)"
    assert verdict(None, 1.5) == "only in B"


def test_command_prints_and_writes_json(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.parquet", _session())
    b = _write(tmp_path / "b.parquet", _session(sub2_parent="r", extra_call=True))
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(main, ["traces", "compare-views", str(a), str(b),
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 trees paired, 1 differ" in res.output
    assert "B sub2 <- root@1 depth 1" in res.output
    doc = json.loads(out.read_text())
    assert doc["a"] == str(a) and doc["summary"]["pairs_that_differ"] == 1
    same = CliRunner().invoke(main, ["traces", "compare-views", str(a), str(a)])
    assert same.exit_code == 0 and "1 trees paired, 0 differ" in same.output


def test_command_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.parquet", _session())
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    for args in ([str(a), str(tmp_path / "missing.parquet")], [str(junk), str(a)],
                 [str(a), str(a), "--json", str(tmp_path / "no" / "x.json")]):
        res = CliRunner().invoke(main, ["traces", "compare-views", *args])
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
