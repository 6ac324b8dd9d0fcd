"""Validation of trajectory files: every problem named by file, trajectory, step and rule.

Checks are vectorised (numpy over whole columns) so a million-step file validates in about a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.arrays import BoolArray, FloatArray, ObjectArray
from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.traces.context import context_lengths, trajectory_starts
from harness.traces.schema import (
    ARROW_SCHEMA,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    KIND_LLM,
    KIND_TOOL,
    META_SCHEMA_VERSION,
    OUTCOMES,
    PRIORITIES,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    STRING_COLUMNS,
    TOOL_SUBAGENT,
    upgrade,
)

MAX_REPORTED = 200


@dataclass(frozen=True)
class Problem:
    """One broken rule; trajectory and step are None when the problem is file- or column-wide."""

    file: str
    rule: str
    message: str
    trajectory: str | None = None
    step: int | None = None

    def __str__(self) -> str:
        where = [self.file]
        if self.trajectory is not None:
            where.append(f"trajectory {self.trajectory!r}")
        if self.step is not None:
            where.append(f"step {self.step}")
        return f"{': '.join(where)}: [{self.rule}] {self.message}"


_REQUIRED_NON_NULL = tuple(f.name for f in ARROW_SCHEMA if not f.nullable)


def _type_ok(column: str, typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_null(typ):
        return True  # an all-null column: nullability is checked per row
    # bool(): pyarrow is untyped, its predicates return plain bools
    if column in INT_COLUMNS:
        return bool(pa.types.is_integer(typ))
    if column in FLOAT_COLUMNS:
        return bool(pa.types.is_floating(typ) or pa.types.is_integer(typ))
    if column in STRING_COLUMNS:
        return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ))
    if column == "mutating":
        return bool(pa.types.is_boolean(typ))
    return True


def _read(path: Path, problems: list[Problem]) -> pa.Table | None:
    name = str(path)
    if not path.exists():
        problems.append(Problem(name, "unreadable", "file does not exist"))
        return None
    if path.is_dir():  # a folder of Parquet parts is a dataset, not a trajectory file
        problems.append(Problem(name, "not-a-file",
                                "is a directory; give a trajectory Parquet file"))
        return None
    if not path.is_file():  # a FIFO or a device would block the reader, or never end
        problems.append(Problem(name, "not-a-file", "is not a regular file"))
        return None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt or non-Parquet input
        problems.append(Problem(name, "not-parquet", f"cannot read as Parquet: {exc}"))
        return None
    version = (table.schema.metadata or {}).get(META_SCHEMA_VERSION)
    if version is not None and version.decode(errors="replace") not in READABLE_VERSIONS:
        problems.append(
            Problem(
                name,
                "schema-version",
                f"schema version {version.decode(errors='replace')!r} is not one this harness "
                f"reads ({', '.join(READABLE_VERSIONS)}; it writes {SCHEMA_VERSION!r})",
            )
        )
    return upgrade(table)


def check_table(table: pa.Table, file: str) -> list[Problem]:
    """Check an Arrow table against every rule of the trajectory format."""
    problems: list[Problem] = []
    names = table.column_names
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem(file, "duplicate-column",
                                f"column {name!r} appears more than once"))
    if problems:
        return problems
    table = upgrade(table)  # columns a newer version added may be absent: null
    present = set(table.column_names)
    for f in ARROW_SCHEMA:
        if f.name not in present:
            problems.append(Problem(file, "missing-column", f"column {f.name!r} is missing"))
        elif not _type_ok(f.name, table.schema.field(f.name).type):
            problems.append(
                Problem(
                    file,
                    "column-type",
                    f"column {f.name!r} has type {table.schema.field(f.name).type}, "
                    f"expected {f.type}",
                )
            )
    if problems:
        return problems
    if table.num_rows == 0:
        return [Problem(file, "empty-workload", "the file holds no steps")]
    nan_problems = _check_nan(table, file)
    if nan_problems:
        return nan_problems
    df = table.select(list(ARROW_SCHEMA.names)).to_pandas()
    return check_frame(df, file)


_NAN_RULES = (
    ("start_s", "bad-start", "start_s must be finite and >= 0"),
    ("latency_s", "bad-latency",
     "latency_s must be finite and >= 0 (null means the tool never returns)"),
    ("deadline_s", "bad-deadline", "deadline_s must be finite and > 0 when set"),
)


def _check_nan(table: pa.Table, file: str) -> list[Problem]:
    """NaN is not null: pandas would read a NaN latency as null ("never returns"), so look first."""
    problems: list[Problem] = []
    for col, rule, message in _NAN_RULES:
        column = table.column(col)
        if not pa.types.is_floating(column.type):
            continue
        mask = pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False)
        idx = np.flatnonzero(mask)[:MAX_REPORTED]
        if not idx.size:
            continue
        tids = table.column("trajectory_id").take(idx).to_pylist()
        steps = table.column("step").take(idx).to_pylist()
        problems.extend(
            Problem(file, rule, message, None if t is None else str(t),
                    None if st is None else int(st))
            for t, st in zip(tids, steps, strict=True)
        )
    return problems


def check_frame(df: pd.DataFrame, file: str) -> list[Problem]:
    """Row rules over a frame whose columns already have the right types."""
    if len(df) == 0:
        return [Problem(file, "empty-workload", "the file holds no steps")]
    rows = _Rows(df, file)
    for col in _REQUIRED_NON_NULL:
        rows.flag(df[col].isna().to_numpy(), "null-value", f"{col!r} must not be null")
    if rows.problems:
        return rows.problems
    kind = df["kind"].astype(object).to_numpy()
    is_llm = kind == KIND_LLM
    is_tool = kind == KIND_TOOL
    _check_step_fields(df, rows, is_llm, is_tool)
    _check_tool_fields(df, rows, is_tool)
    if rows.problems:
        return rows.problems
    problems = _check_structure(df, file, rows.tid, rows.step_raw.astype(np.int64), is_tool)
    if problems:
        return problems
    _check_context(df, rows, is_llm, is_tool)
    if rows.problems:
        return rows.problems
    return _check_subagents(df, file, rows.tid, rows.step_raw.astype(np.int64), is_tool)


class _Rows:
    """The problems found so far in a frame's rows, each named by trajectory and step."""

    def __init__(self, df: pd.DataFrame, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.tid: ObjectArray = df["trajectory_id"].astype(object).to_numpy()
        self.step_raw: FloatArray = df["step"].to_numpy(dtype="float64", na_value=np.nan)

    def flag(self, mask: BoolArray, rule: str, message: str) -> None:
        """A problem for each row in `mask` (the first MAX_REPORTED of them)."""
        tid, step_raw = self.tid, self.step_raw
        for i in np.flatnonzero(mask)[:MAX_REPORTED]:
            s = step_raw[i]
            self.problems.append(
                Problem(
                    self.file,
                    rule,
                    message,
                    None if tid[i] is None else str(tid[i]),
                    None if np.isnan(s) else int(s),
                )
            )


def _check_step_fields(df: pd.DataFrame, rows: _Rows, is_llm: BoolArray,
                       is_tool: BoolArray) -> None:
    """kind, priority, start_s, step, and an LLM step's token counts."""
    flag = rows.flag
    flag(~(is_llm | is_tool), "bad-kind", f"kind must be {KIND_LLM!r} or {KIND_TOOL!r}")
    flag(~df["priority"].isin(PRIORITIES).to_numpy(), "bad-priority",
         f"priority must be one of {', '.join(PRIORITIES)}")
    start = df["start_s"].to_numpy(dtype="float64")
    flag(~np.isfinite(start) | (start < 0), "bad-start", "start_s must be finite and >= 0")
    flag(rows.step_raw < 0, "bad-step", "step must be >= 0")
    for col, minimum in (("input_tokens", 0), ("output_tokens", 1)):
        vals = df[col].to_numpy(dtype="float64", na_value=np.nan)
        flag(is_llm & np.isnan(vals), "missing-tokens", f"LLM step needs {col!r}")
        flag(is_llm & ~np.isnan(vals) & (vals < minimum), "bad-tokens",
             f"{col!r} must be >= {minimum}")


def _check_tool_fields(df: pd.DataFrame, rows: _Rows, is_tool: BoolArray) -> None:
    """A tool step's latency, deadline, outcome, class and mutating flag."""
    flag = rows.flag
    lat = df["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    lat_null = df["latency_s"].isna().to_numpy()
    with np.errstate(invalid="ignore"):
        flag(is_tool & ~lat_null & (~np.isfinite(lat) | (lat < 0)), "bad-latency",
             "latency_s must be finite and >= 0 (null means the tool never returns)")
        dl = df["deadline_s"].to_numpy(dtype="float64", na_value=np.nan)
        dl_null = df["deadline_s"].isna().to_numpy()
        flag(is_tool & ~dl_null & (~np.isfinite(dl) | (dl <= 0)), "bad-deadline",
             "deadline_s must be finite and > 0 when set")
    outcome = df["outcome"].astype(object).to_numpy()
    flag(is_tool & ~df["outcome"].isin(OUTCOMES).to_numpy(), "bad-outcome",
         f"outcome must be one of {', '.join(OUTCOMES)}")
    flag(is_tool & lat_null & ~np.isin(outcome, ["abandoned", "timeout"]), "never-returns",
         "a tool with null latency never returns: its outcome must be 'abandoned' or 'timeout'")
    flag(is_tool & df["tool_class"].isna().to_numpy(), "missing-tool-class",
         "tool step needs 'tool_class'")
    flag(is_tool & df["mutating"].isna().to_numpy(), "missing-mutating",
         "tool step needs 'mutating'")


def _check_context(df: pd.DataFrame, rows: _Rows, is_llm: BoolArray,
                   is_tool: BoolArray) -> None:
    """keep_tokens (LLM steps, never above the context the call finds) and prefix_tokens."""
    flag = rows.flag
    keep = df["keep_tokens"].to_numpy(dtype="float64", na_value=np.nan)
    has_keep = ~np.isnan(keep)
    flag(is_tool & has_keep, "keep-on-tool", "keep_tokens is for LLM steps only")
    flag(has_keep & (keep < 0), "bad-keep", "keep_tokens must be >= 0")
    pre = df["prefix_tokens"].to_numpy(dtype="float64", na_value=np.nan)
    has_pre = ~np.isnan(pre)
    flag(has_pre & (pre < 0), "bad-prefix", "prefix_tokens must be >= 0")
    flag(has_pre & df["prefix_group"].isna().to_numpy(), "bad-prefix",
         "prefix_tokens needs a prefix_group (the trajectories that share the prefix)")
    if rows.problems:
        return
    lengths = context_lengths(df)
    flag(is_llm & has_keep & (keep > lengths.before), "bad-keep",
         "keep_tokens is more than the context the call finds (what earlier steps appended "
         "and generated)")
    first = trajectory_starts(rows.tid)
    inp = df["input_tokens"].to_numpy(dtype="float64", na_value=0.0)
    flag(first & has_pre & (pre > inp), "bad-prefix",
         "prefix_tokens is more than the first call's input_tokens")


def _check_subagents(df: pd.DataFrame, file: str, tid: np.ndarray, step: np.ndarray,
                     is_tool: BoolArray) -> list[Problem]:
    """Sub-agents: a parent that exists, a spawn step that is one of its `subagent` tool steps,
    no cycles, at most MAX_SUBAGENT_DEPTH levels of nesting, and no `subagent` step without a
    child."""
    problems: list[Problem] = []
    starts = np.flatnonzero(trajectory_starts(tid))
    ids = [str(t) for t in tid[starts]]
    parent = df["parent_id"].astype(object).to_numpy()[starts]
    spawn = df["spawn_step"].to_numpy(dtype="float64", na_value=np.nan)[starts]
    cls = df["tool_class"].astype(object).to_numpy()
    is_spawn = is_tool & (cls == TOOL_SUBAGENT)
    spawn_steps = {(str(tid[i]), int(step[i])) for i in np.flatnonzero(is_spawn)}
    known = set(ids)
    parent_of: dict[str, str] = {}
    used: set[tuple[str, int]] = set()
    for k, t in enumerate(ids):
        p = parent[k]
        has_p = isinstance(p, str)
        if has_p != (not np.isnan(spawn[k])):
            problems.append(Problem(file, "bad-spawn", "parent_id and spawn_step go together: "
                                    "set both (a sub-agent) or neither", t))
            continue
        if not has_p:
            continue
        assert isinstance(p, str)
        if p not in known:
            problems.append(Problem(file, "missing-parent",
                                    f"parent trajectory {p!r} is not in the file", t))
            continue
        key = (p, int(spawn[k]))
        if key not in spawn_steps:
            problems.append(Problem(file, "bad-spawn",
                                    f"spawn_step {key[1]} of parent {p!r} is not a "
                                    f"{TOOL_SUBAGENT!r} tool step", t))
            continue
        parent_of[t] = p
        used.add(key)
    depth = _subagent_depths(parent_of)
    deepest = max(depth.values(), default=0)
    for t in parent_of:  # a parent chain must end at a root, and not too far up
        if depth[t] < 0:
            problems.append(Problem(file, "subagent-cycle",
                                    "its chain of parents comes back to itself", t))
        elif depth[t] == MAX_SUBAGENT_DEPTH + 1:
            # Only the first level past the limit is named: one problem per branch too deep,
            # not one per trajectory below it (a 2,000-deep chain is one problem).
            problems.append(Problem(
                file, "subagent-too-deep",
                f"sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} levels (the limit): "
                f"this one is {depth[t]} levels below its root trajectory (the deepest in "
                f"the file: {deepest})", t))
    lat_null = df["latency_s"].isna().to_numpy()
    for i in np.flatnonzero(is_spawn & lat_null)[:MAX_REPORTED]:
        problems.append(Problem(file, "bad-latency", f"a {TOOL_SUBAGENT!r} step's latency_s "
                                "(the wait after its sub-agents end) cannot be null",
                                str(tid[i]), int(step[i])))
    for t, s in sorted(spawn_steps - used)[:MAX_REPORTED]:
        problems.append(Problem(file, "no-children",
                                f"a {TOOL_SUBAGENT!r} tool step must start at least one "
                                "sub-agent (none names it as its spawn_step)", t, s))
    return problems[:MAX_REPORTED]


def _subagent_depths(parent_of: dict[str, str]) -> dict[str, int]:
    """Each sub-agent's nesting depth (1: its parent is a root), -1 where its chain of parents
    never reaches a root (a cycle). Iterative and memoised: each trajectory is walked once, so a
    chain thousands deep costs linear time and no Python recursion."""
    depth: dict[str, int] = {}
    for t in parent_of:
        chain: list[str] = []
        on_chain: set[str] = set()
        node = t
        while True:
            if node in depth:
                base = depth[node]
                break
            if node not in parent_of:  # a root (or one whose parent was already refused)
                base = 0
                break
            if node in on_chain:
                base = -1
                break
            chain.append(node)
            on_chain.add(node)
            node = parent_of[node]
        for n in reversed(chain):
            base = -1 if base < 0 else base + 1
            depth[n] = base
    return depth


def _check_structure(
    df: pd.DataFrame, file: str, tid: np.ndarray, step: np.ndarray, is_tool: np.ndarray
) -> list[Problem]:
    problems: list[Problem] = []
    codes, uniques = pd.factorize(tid)
    # Rows of one trajectory must be contiguous in the file and in step order 0..n-1.
    change = np.empty(len(codes), dtype=bool)
    change[0] = True
    change[1:] = codes[1:] != codes[:-1]
    block_codes = codes[change]
    if len(np.unique(block_codes)) != len(block_codes):
        seen: set[int] = set()
        for c in block_codes:
            if c in seen:
                problems.append(Problem(file, "split-trajectory",
                                        "rows of this trajectory are not contiguous",
                                        str(uniques[c])))
                break
            seen.add(int(c))
    starts = np.flatnonzero(change)
    expected = np.arange(len(codes)) - np.repeat(starts, np.diff(np.append(starts, len(codes))))
    bad = step != expected
    for i in np.flatnonzero(bad)[:MAX_REPORTED]:
        j = int(np.searchsorted(starts, i, side="right") - 1)
        block = step[starts[j]: (starts[j + 1] if j + 1 < len(starts) else len(step))]
        dup = int(np.sum(block == step[i])) > 1
        rule, msg = (
            ("duplicate-step", f"step {int(step[i])} appears more than once")
            if dup
            else ("steps-not-contiguous",
                  f"expected step {int(expected[i])} here (steps run 0, 1, 2, ... in order)")
        )
        problems.append(Problem(file, rule, msg, str(tid[i]), int(step[i])))
        if len(problems) >= MAX_REPORTED:
            return problems
    if problems:
        return problems
    first_tool = change & is_tool
    for i in np.flatnonzero(first_tool)[:MAX_REPORTED]:
        problems.append(Problem(file, "starts-with-tool",
                                "a trajectory must start with an LLM step", str(tid[i]), 0))
    same_kind = np.zeros(len(codes), dtype=bool)
    same_kind[1:] = ~change[1:] & (is_tool[1:] == is_tool[:-1])
    for i in np.flatnonzero(same_kind)[:MAX_REPORTED]:
        what = "two tool steps in a row" if is_tool[i] else "two LLM steps in a row"
        problems.append(Problem(file, "not-alternating",
                                f"{what}: LLM and tool steps must alternate",
                                str(tid[i]), int(step[i])))
    for col in ("start_s", "priority", "tenant", "prefix_group", "parent_id", "spawn_step",
                "prefix_tokens"):
        nuniq = df.groupby(codes, sort=False)[col].nunique(dropna=False).to_numpy()
        for c in np.flatnonzero(nuniq > 1)[:MAX_REPORTED]:
            problems.append(Problem(file, "trajectory-level-varies",
                                    f"{col!r} must be the same on every step of a trajectory",
                                    str(uniques[c])))
    return problems


def validate_file(path: str | Path) -> list[Problem]:
    """Every problem with a trajectory file; an empty list means the file is valid."""
    p = Path(path)
    problems: list[Problem] = []
    table = _read(p, problems)
    if table is None:
        return problems
    return problems + check_table(table, str(p))


def load_trajectories(path: str | Path) -> pd.DataFrame:
    """Read and validate a trajectory file; raise InputError listing the problems if invalid."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p} is a directory; give a trajectory Parquet file")
    problems: list[Problem] = []
    table = _read(p, problems)
    if table is not None:
        problems += check_table(table, str(p))
    if problems:
        lines = [str(x) for x in problems[:20]]
        if len(problems) > 20:
            lines.append(f"... and {len(problems) - 20} more problems")
        raise InputError("invalid trajectory file:\n" + "\n".join(lines))
    assert table is not None
    df: pd.DataFrame = table.select(list(ARROW_SCHEMA.names)).to_pandas()
    return df
