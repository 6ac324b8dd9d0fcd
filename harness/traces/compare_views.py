"""Two views of the same agent sessions, side by side (`harness traces compare-views`).

A proxy recording's import and the agent's own log import of one session should describe the
same trajectory trees; where they disagree, one of the two importers saw something the other
did not. Pure: two validated step frames in, a JSON-ready comparison out.

Trees (a root trajectory and every sub-agent below it) are paired first by equal root
`trajectory_id`, then the rest by order of start (`start_s`, then the root's first prompt
size), each pair saying how it was matched. Within a pair, the trajectories are matched the
same way (equal id, else order of depth and start), and calls and tool steps by their order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.traces.context import context_lengths
from harness.traces.schema import KIND_LLM, KIND_TOOL, gap_steps

SHOWN_DIFFERENCES = 5  # per-call prompt differences listed per tree
FIRST_PROMPT_TOLERANCE = 0.05  # first prompts this close (relative) confirm an order match
MATCH_ID, MATCH_ORDER, MATCH_ORDER_PROMPT_DIFFERS = (
    "trajectory_id", "order of start, first prompt agrees",
    "order of start only (first prompt differs)")


@dataclass(frozen=True)
class _Traj:
    """One trajectory of a tree: its id, parent, spawn step and depth; its calls' prompt sizes
    and its tool steps' latencies in step order."""

    tid: str
    parent: str | None
    spawn_step: int | None
    depth: int
    start_s: float
    prompts: tuple[int, ...]
    latencies: tuple[float | None, ...]


@dataclass(frozen=True)
class _Tree:
    """A root and its sub-agents, the root first, then by depth, start and id."""

    trajs: tuple[_Traj, ...]

    @property
    def root(self) -> _Traj:
        return self.trajs[0]

    @property
    def first_prompt(self) -> int:
        return self.root.prompts[0] if self.root.prompts else 0


def _trees(df: pd.DataFrame) -> list[_Tree]:
    """The trees of a validated frame, in order of their root's start."""
    prompt = context_lengths(df).prompt
    tid = df["trajectory_id"].astype(object).to_numpy()
    kind = df["kind"].astype(object).to_numpy()
    gap = gap_steps(df).to_numpy()  # pauses between back-to-back calls: no tool either side
    lat = df["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    parent = df["parent_id"].astype(object).to_numpy()
    spawn = df["spawn_step"].to_numpy(dtype="float64", na_value=np.nan)
    start = df["start_s"].to_numpy(dtype="float64")
    rows: dict[str, list[int]] = {}
    for i, t in enumerate(tid):
        rows.setdefault(str(t), []).append(i)
    parent_of = {t: str(parent[r[0]]) for t, r in rows.items() if not pd.isna(parent[r[0]])}
    root_of: dict[str, str] = {}
    depth_of: dict[str, int] = {}
    for t in rows:  # a validated frame has no cycles and every parent present
        chain = [t]
        while chain[-1] in parent_of:
            chain.append(parent_of[chain[-1]])
        root_of[t], depth_of[t] = chain[-1], len(chain) - 1
    members: dict[str, list[_Traj]] = {}
    for t, r in rows.items():
        first = r[0]
        members.setdefault(root_of[t], []).append(_Traj(
            tid=t, parent=parent_of.get(t),
            spawn_step=None if np.isnan(spawn[first]) else int(spawn[first]),
            depth=depth_of[t], start_s=float(start[first]),
            prompts=tuple(int(prompt[i]) for i in r if kind[i] == KIND_LLM),
            latencies=tuple(None if np.isnan(lat[i]) else float(lat[i])
                            for i in r if kind[i] == KIND_TOOL and not gap[i])))
    trees = [_Tree(tuple(sorted(m, key=lambda x: (x.depth, x.start_s, x.tid))))
             for m in members.values()]
    return sorted(trees, key=lambda tr: (tr.root.start_s, tr.first_prompt, tr.root.tid))


def _pair_trees(a: list[_Tree], b: list[_Tree]
                ) -> tuple[list[tuple[_Tree, _Tree, str]], list[_Tree], list[_Tree]]:
    """Pairs (a, b, how matched), the trees only in a, and those only in b."""
    by_id = {t.root.tid: t for t in b}
    pairs = [(t, by_id[t.root.tid], MATCH_ID) for t in a if t.root.tid in by_id]
    taken = {t.root.tid for t, _, _ in pairs}
    rest_a = [t for t in a if t.root.tid not in taken]
    rest_b = [t for t in b if t.root.tid not in taken]
    for ta, tb in zip(rest_a, rest_b, strict=False):  # both already in order of start
        agrees = abs(ta.first_prompt - tb.first_prompt) <= FIRST_PROMPT_TOLERANCE * max(
            ta.first_prompt, tb.first_prompt, 1)
        pairs.append((ta, tb, MATCH_ORDER if agrees else MATCH_ORDER_PROMPT_DIFFERS))
    n = min(len(rest_a), len(rest_b))
    return pairs, rest_a[n:], rest_b[n:]


def _pair_trajs(a: _Tree, b: _Tree) -> list[tuple[_Traj | None, _Traj | None]]:
    """A tree's trajectories paired: roots together, then equal ids, then the rest in order;
    a trajectory without a partner is paired with None."""
    ids_b = {t.tid for t in b.trajs[1:]}
    same = {t.tid for t in a.trajs[1:] if t.tid in ids_b}
    out: list[tuple[_Traj | None, _Traj | None]] = [(a.root, b.root)]
    b_by_id = {t.tid: t for t in b.trajs}
    out += [(t, b_by_id[t.tid]) for t in a.trajs[1:] if t.tid in same]
    rest_a = [t for t in a.trajs[1:] if t.tid not in same]
    rest_b = [t for t in b.trajs[1:] if t.tid not in same]
    out += [(x, y) for x, y in zip(rest_a, rest_b, strict=False)]
    n = min(len(rest_a), len(rest_b))
    out += [(x, None) for x in rest_a[n:]] + [(None, y) for y in rest_b[n:]]
    return out


def verdict(a: float | int | None, b: float | int | None) -> str:
    """`same`, else B - A and its size relative to A (`+1 (+8.3%)`)."""
    if a == b:
        return "same"
    if a is None or b is None:
        return "only in A" if b is None else "only in B"
    diff = b - a
    num = f"{diff:+,}" if isinstance(diff, int) else f"{diff:+.4g}"
    rel = f"{100 * diff / abs(a):+.1f}%" if a else "new"
    return f"{num} ({rel})"


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 6) if values else None


def _links(tree: _Tree, names: dict[str, str]) -> list[str]:
    """Each sub-agent's parent link as `parent@spawn_step depth d`, parents named by `names`
    (the same label in both views for a matched trajectory)."""
    return [f"{names[t.tid]} <- {names.get(t.parent or '', '?')}@{t.spawn_step} "
            f"depth {t.depth}" for t in tree.trajs[1:]]


def _field(name: str, a: Any, b: Any) -> dict[str, Any]:
    numeric = all(isinstance(v, int | float) or v is None for v in (a, b))
    return {"field": name, "a": a, "b": b,
            "verdict": verdict(a, b) if numeric else ("same" if a == b else "differs")}


def _compare_tree(a: _Tree, b: _Tree, how: str) -> dict[str, Any]:
    """One pair of trees, field by field."""
    pairs = _pair_trajs(a, b)
    # Labels shared by the two views: the root `root`, sub-agents `sub1`, `sub2`, ... in the
    # order they were paired (an unpaired one gets its own label).
    names_a: dict[str, str] = {}
    names_b: dict[str, str] = {}
    for i, (x, y) in enumerate(pairs):
        label = "root" if i == 0 else f"sub{i}"
        if x is not None:
            names_a[x.tid] = label
        if y is not None:
            names_b[y.tid] = label
    prompts_a = [p for t in a.trajs for p in t.prompts]
    prompts_b = [p for t in b.trajs for p in t.prompts]
    lat_a = [v for t in a.trajs for v in t.latencies if v is not None]
    lat_b = [v for t in b.trajs for v in t.latencies if v is not None]
    call_diffs: list[dict[str, Any]] = []
    paired_calls = 0
    largest: dict[str, Any] | None = None
    for x, y in pairs:
        if x is None or y is None:
            continue
        label = names_a[x.tid]
        paired_calls += min(len(x.prompts), len(y.prompts))
        for i, (pa_, pb_) in enumerate(zip(x.prompts, y.prompts, strict=False)):
            if pa_ != pb_:
                call_diffs.append({"trajectory": label, "call": i, "a": pa_, "b": pb_,
                                   "verdict": verdict(pa_, pb_)})
        for i, (la, lb) in enumerate(zip(x.latencies, y.latencies, strict=False)):
            if la is None or lb is None:
                continue
            d = abs(lb - la)
            if d > 0 and (largest is None or d > largest["abs_s"]):
                largest = {"trajectory": label, "tool_step": i, "a": la, "b": lb,
                           "abs_s": round(d, 6), "verdict": verdict(la, lb)}
    links_a, links_b = _links(a, names_a), _links(b, names_b)
    fields = [
        _field("llm calls", len(prompts_a), len(prompts_b)),
        _field("tool calls", sum(len(t.latencies) for t in a.trajs),
               sum(len(t.latencies) for t in b.trajs)),
        _field("sub-agents", len(a.trajs) - 1, len(b.trajs) - 1),
        _field("max spawn depth", max(t.depth for t in a.trajs),
               max(t.depth for t in b.trajs)),
        _field("parent links", links_a, links_b),
        _field("prompt tokens (sum)", sum(prompts_a), sum(prompts_b)),
        {"field": "prompt tokens per call", "a": None, "b": None,
         "verdict": "same" if not call_diffs else
         f"{len(call_diffs)} of {paired_calls} paired calls differ"},
        _field("tool latency p50 (s)", _percentile(lat_a, 50), _percentile(lat_b, 50)),
        _field("tool latency p95 (s)", _percentile(lat_a, 95), _percentile(lat_b, 95)),
    ]
    return {"a_root": a.root.tid, "b_root": b.root.tid, "matched_by": how,
            "fields": fields, "prompt_differences": call_diffs[:SHOWN_DIFFERENCES],
            "largest_latency_difference": largest,
            "agrees": all(f["verdict"] == "same" for f in fields)}


def compare_views(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, Any]:
    """Compare two validated trajectory frames tree by tree: a JSON-ready dict with `trees`
    (one per matched pair: `fields`, each with `a`, `b` and a `verdict`), `only_in_a` and
    `only_in_b` (unmatched roots) and `summary` (counts of pairs and of those that differ)."""
    pairs, only_a, only_b = _pair_trees(_trees(a), _trees(b))
    trees = [_compare_tree(x, y, how) for x, y, how in pairs]
    return {
        "trees": trees,
        "only_in_a": [t.root.tid for t in only_a],
        "only_in_b": [t.root.tid for t in only_b],
        "summary": {"pairs": len(trees),
                    "pairs_that_differ": sum(not t["agrees"] for t in trees),
                    "only_in_a": len(only_a), "only_in_b": len(only_b)},
    }


def render(result: dict[str, Any], name_a: str, name_b: str) -> list[str]:
    """The comparison as text lines: a header, one table per pair, the unmatched roots."""
    s = result["summary"]
    lines = [f"A {name_a}", f"B {name_b}",
             f"{s['pairs']} trees paired, {s['pairs_that_differ']} differ; "
             f"{s['only_in_a']} only in A, {s['only_in_b']} only in B"]
    for t in result["trees"]:
        lines += ["", f"tree A {t['a_root']} <-> B {t['b_root']} (matched by {t['matched_by']})",
                  f"  {'field':<30} {'A':>14} {'B':>14}  verdict"]
        for f in t["fields"]:
            if isinstance(f["a"], list):
                lines.append(f"  {f['field']:<30} {len(f['a']):>14} {len(f['b']):>14}  "
                             f"{f['verdict']}")
                if f["verdict"] != "same":
                    lines += [f"    A {x}" for x in f["a"] if x not in f["b"]]
                    lines += [f"    B {x}" for x in f["b"] if x not in f["a"]]
                continue
            lines.append(f"  {f['field']:<30} {_cell(f['a']):>14} {_cell(f['b']):>14}  "
                         f"{f['verdict']}")
        for d in t["prompt_differences"]:
            lines.append(f"    prompt {d['trajectory']} call {d['call']}: {d['a']:,} vs "
                         f"{d['b']:,} {d['verdict']}")
        big = t["largest_latency_difference"]
        if big is not None:
            lines.append(f"    largest tool latency difference: {big['trajectory']} tool step "
                         f"{big['tool_step']}: {big['a']:.4g} s vs {big['b']:.4g} s "
                         f"{big['verdict']}")
    for side, key in (("A", "only_in_a"), ("B", "only_in_b")):
        if result[key]:
            lines += ["", f"trees only in {side}: " + ", ".join(result[key])]
    return lines


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"
