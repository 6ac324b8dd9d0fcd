"""Shared pieces of the importers: options, token counting, JSON reading, building the frame."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.traces.schema import COLUMNS, KIND_LLM, KIND_TOOL, PRIORITIES
from harness.userfiles import real_path

# Options every importer accepts, with their defaults.
COMMON_OPTIONS: dict[str, str] = {
    "priority": "interactive",
    "tenant": "default",
}


def take_options(
    options: Mapping[str, str], fmt: str, allowed: Mapping[str, str]
) -> dict[str, str]:
    """Options merged over defaults (COMMON_OPTIONS and `allowed`); unknown keys are refused."""
    defaults = {**COMMON_OPTIONS, **allowed}
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise InputError(
            f"{fmt} import: unknown option(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(defaults))}"
        )
    merged = {**defaults, **options}
    if merged["priority"] not in PRIORITIES:
        raise InputError(
            f"{fmt} import: option priority must be one of {', '.join(PRIORITIES)}, "
            f"got {merged['priority']!r}"
        )
    return merged


def opt_int(opts: Mapping[str, str], key: str, fmt: str, minimum: int | None = None) -> int:
    """An integer option, refused by name when it is not one."""
    try:
        value = int(opts[key])
    except ValueError:
        raise InputError(f"{fmt} import: option {key} must be an integer, "
                         f"got {opts[key]!r}") from None
    if minimum is not None and value < minimum:
        raise InputError(f"{fmt} import: option {key} must be >= {minimum}, got {value}")
    return value


def opt_float(opts: Mapping[str, str], key: str, fmt: str) -> float | None:
    """A finite positive float option; an empty string means unset (None)."""
    if opts[key] == "":
        return None
    try:
        value = float(opts[key])
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{fmt} import: option {key} must be a number > 0, got {opts[key]!r}")
    return value


def arrival_offsets(n: int, rate_per_s: float | None, seed: int) -> np.ndarray:
    """Start offsets: all 0 without a rate, else a Poisson process (seeded) starting at 0."""
    if rate_per_s is None or n == 0:
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=n)
    gaps[0] = 0.0
    return np.round(np.cumsum(gaps), 6)


# What an error line quotes from the input (a field's value, a name) is cut to this many
# characters: a field can hold a whole prompt, and the error must stay one readable line.
QUOTE_CHARS = 200


# An import's error line as a whole (its location can chain many nested names): past this, its
# middle is cut, keeping the head (the file) and the tail (the innermost place and the fault).
ERROR_CHARS = 1000


def clip(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` for an error line, cut to `limit` characters and an ellipsis."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """repr(value) for an error line, cut to `limit` characters and an ellipsis."""
    return clip(repr(value), limit)


def clip_error(message: str, limit: int = ERROR_CHARS) -> str:
    """An error line cut in the middle to about `limit` characters (see ERROR_CHARS)."""
    if len(message) <= limit:
        return message
    head = limit * 3 // 5
    return f"{message[:head]} ... {message[len(message) - (limit - head):]}"


def summarize(what: str, items: Sequence[str], limit: int = 5) -> str:
    """'N what (first: a; b; c)' for a warning line."""
    shown = "; ".join(items[:limit])
    more = f"; ... {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} {what} (first: {shown}{more})"


@dataclass
class LLM:
    """An LLM step: tokens appended before the call and tokens it generates; `keep_tokens`, when
    set, cuts the context to that many leading tokens first."""

    input_tokens: int
    output_tokens: int
    keep_tokens: int | None = None


@dataclass
class Tool:
    """A tool step (one pause); latency None means it never returns."""

    tool_name: str
    tool_class: str
    latency_s: float | None
    outcome: str = "ok"
    mutating: bool = False
    deadline_s: float | None = None


@dataclass
class Trajectory:
    """One trajectory's steps (alternating, starting with an LLM step) and its level fields."""

    trajectory_id: str
    steps: list[LLM | Tool] = field(default_factory=list)
    start_s: float = 0.0
    priority: str = "interactive"
    tenant: str = "default"
    prefix_group: str | None = None
    prefix_tokens: int | None = None
    parent_id: str | None = None  # a sub-agent: its parent, and the parent's step that
    spawn_step: int | None = None  # spawns it (a `subagent` tool step)


def drop_trailing_tools(steps: list[LLM | Tool]) -> int:
    """Remove tool steps after the last LLM step (results nobody consumed); how many went."""
    dropped = 0
    while steps and isinstance(steps[-1], Tool):
        steps.pop()
        dropped += 1
    return dropped


def build_frame(trajectories: Iterable[Trajectory]) -> pd.DataFrame:
    """The canonical step frame, with the same dtypes the generator produces."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for t in trajectories:
        for i, s in enumerate(t.steps):
            cols["trajectory_id"].append(t.trajectory_id)
            cols["step"].append(i)
            cols["start_s"].append(t.start_s)
            cols["priority"].append(t.priority)
            cols["tenant"].append(t.tenant)
            cols["prefix_group"].append(t.prefix_group)
            cols["prefix_tokens"].append(t.prefix_tokens)
            cols["parent_id"].append(t.parent_id)
            cols["spawn_step"].append(t.spawn_step)
            if isinstance(s, LLM):
                cols["kind"].append(KIND_LLM)
                cols["input_tokens"].append(s.input_tokens)
                cols["output_tokens"].append(s.output_tokens)
                cols["keep_tokens"].append(s.keep_tokens)
                for c in ("tool_name", "tool_class", "outcome", "mutating"):
                    cols[c].append(None)
                cols["latency_s"].append(math.nan)
                cols["deadline_s"].append(math.nan)
            else:
                cols["kind"].append(KIND_TOOL)
                cols["input_tokens"].append(None)
                cols["output_tokens"].append(None)
                cols["keep_tokens"].append(None)
                cols["tool_name"].append(s.tool_name)
                cols["tool_class"].append(s.tool_class)
                cols["outcome"].append(s.outcome)
                cols["mutating"].append(s.mutating)
                cols["latency_s"].append(math.nan if s.latency_s is None else s.latency_s)
                cols["deadline_s"].append(math.nan if s.deadline_s is None else s.deadline_s)
    obj = {c: np.asarray(cols[c], dtype=object) for c in
           ("trajectory_id", "kind", "priority", "tenant", "prefix_group", "tool_name",
            "tool_class", "outcome", "parent_id")}
    return pd.DataFrame({
        "trajectory_id": obj["trajectory_id"],
        "step": np.asarray(cols["step"], dtype=np.int32),
        "kind": obj["kind"],
        "start_s": np.asarray(cols["start_s"], dtype=np.float64),
        "priority": obj["priority"],
        "tenant": obj["tenant"],
        "prefix_group": obj["prefix_group"],
        "input_tokens": pd.array(cols["input_tokens"], dtype="Int64"),
        "output_tokens": pd.array(cols["output_tokens"], dtype="Int64"),
        "tool_name": obj["tool_name"],
        "tool_class": obj["tool_class"],
        "latency_s": np.asarray(cols["latency_s"], dtype=np.float64),
        "deadline_s": np.asarray(cols["deadline_s"], dtype=np.float64),
        "outcome": obj["outcome"],
        "mutating": pd.array(cols["mutating"], dtype="boolean"),
        "parent_id": obj["parent_id"],
        "spawn_step": pd.array(cols["spawn_step"], dtype="Int32"),
        "prefix_tokens": pd.array(cols["prefix_tokens"], dtype="Int64"),
        "keep_tokens": pd.array(cols["keep_tokens"], dtype="Int64"),
    }, columns=list(COLUMNS))


def files_in(paths: Sequence[Path], suffixes: tuple[str, ...] = (".json.gz", ".json")
             ) -> list[Path]:
    """The files named, a directory meaning its entries ending in one of `suffixes` (sorted),
    each once."""
    unique: dict[Path, Path] = {}
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: does not exist")
        # Every matching entry but a folder is kept: the reader refuses one that is not a
        # regular file (a FIFO named c.json) rather than the import silently leaving it out.
        found = sorted(q for q in p.iterdir() if not q.is_dir() and q.name.endswith(
            suffixes)) if p.is_dir() else [p]
        if not found:
            raise InputError(f"{p}: no {' or '.join('*' + s for s in suffixes)} files")
        for q in found:
            unique.setdefault(real_path(q), q)
    return list(unique.values())


def share(part: int, total: int) -> float:
    """part / total, rounded; 0 when there is nothing to share."""
    return round(part / total, 4) if total else 0.0


def summed(counts: Iterable[Counter[str]], keys: Sequence[str]) -> dict[str, int]:
    """Each of `keys` summed over `counts` (the files' counts of one import)."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update({k: c[k] for k in keys})
    return {k: int(total[k]) for k in keys}
