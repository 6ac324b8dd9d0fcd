"""The trajectory format: one Parquet row per step, LLM and tool steps alternating.

The schema version and provenance travel in the Parquet file's key-value metadata, so a file
explains where it came from and what was inferred rather than recorded.

Version 2 added sub-agents and the shape of the context:
- `parent_id` + `spawn_step` (per trajectory): a sub-agent, started by its parent's tool step
  `spawn_step` (tool_class `subagent`). That step starts all its children at once and the parent
  waits until every one has ended, then `latency_s` more (the time the trace spent after them).
  Sub-agents never arrive on their own; they run beside their parent and each other.
- `prefix_tokens` (per trajectory): how many leading tokens of its first call every trajectory
  of its `prefix_group` shares (a shared tools + system prompt); null means 128.
- `keep_tokens` (LLM steps): before this call appends `input_tokens`, the context is cut to its
  first `keep_tokens` tokens (null: all of it is kept, the last call's output included). A trace
  that says which blocks a request shares with the one before sets it, so the replay shares
  exactly those.
A version-1 file reads as version 2 with these columns null (`upgrade`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import InputError

SCHEMA_VERSION = "2"
# Versions a file may have: older ones are upgraded on read (`upgrade`).
READABLE_VERSIONS = ("1", "2")
META_SCHEMA_VERSION = b"harness.trajectory.schema_version"
META_PROVENANCE = b"harness.trajectory.provenance"

KIND_LLM = "llm"
KIND_TOOL = "tool"
PRIORITIES = ("interactive", "batch")
OUTCOMES = ("ok", "error", "timeout", "abandoned")
TOOL_CLASSES = (
    "local_read",
    "remote_read",
    "mutating",
    "browser",
    "sandbox",
    "human",
    "long_job",
    "subagent",
)
TOOL_SUBAGENT = "subagent"
# A tool step that stands for no tool: the agent called the model again with nothing between
# (a retried, continued or streamed-again response). It keeps LLM and tool steps alternating
# and carries the wall time between the two calls; it is not a tool call (`gap_steps`).
GAP_TOOL = "gap"
GAP_TOOL_NAMES = (GAP_TOOL, "none", "no_tool")  # and the names earlier importers gave it
# When a trajectory's prefix_group is set and prefix_tokens is not (version-1 files).
DEFAULT_PREFIX_TOKENS = 128

ARROW_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("start_s", pa.float64(), nullable=False),
        pa.field("priority", pa.string(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("prefix_group", pa.string()),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("tool_name", pa.string()),
        pa.field("tool_class", pa.string()),
        pa.field("latency_s", pa.float64()),
        pa.field("deadline_s", pa.float64()),
        pa.field("outcome", pa.string()),
        pa.field("mutating", pa.bool_()),
        pa.field("parent_id", pa.string()),
        pa.field("spawn_step", pa.int32()),
        pa.field("prefix_tokens", pa.int64()),
        pa.field("keep_tokens", pa.int64()),
    ]
)
# The columns version 2 added; a version-1 file has none of them.
V2_COLUMNS = ("parent_id", "spawn_step", "prefix_tokens", "keep_tokens")
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)
# Repeated per step but constant per trajectory: stored dictionary-encoded.
TRAJECTORY_LEVEL = ("trajectory_id", "start_s", "priority", "tenant", "prefix_group",
                    "parent_id", "spawn_step", "prefix_tokens")
# The columns by type, read off the schema (the validation checks each column's values by them).
STRING_COLUMNS = tuple(f.name for f in ARROW_SCHEMA if pa.types.is_string(f.type))
INT_COLUMNS = tuple(f.name for f in ARROW_SCHEMA if pa.types.is_integer(f.type))
FLOAT_COLUMNS = tuple(f.name for f in ARROW_SCHEMA if pa.types.is_floating(f.type))
# Every string column is stored dictionary-encoded: few distinct values, repeated per step.
DICTIONARY_COLUMNS = STRING_COLUMNS


def upgrade(table: pa.Table) -> pa.Table:
    """A table of an older version with the columns it lacks added as nulls (a version-1 file
    has no sub-agents, keeps its whole context and shares the default prefix)."""
    for name in V2_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(ARROW_SCHEMA.field(name),
                                        pa.nulls(table.num_rows, ARROW_SCHEMA.field(name).type))
    return table


@dataclass
class Provenance:
    """Where a trajectory file came from and which of its values were inferred, not recorded."""

    source_format: str
    source_files: list[str] = field(default_factory=list)
    inferred: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "source_format": self.source_format,
                "source_files": self.source_files,
                "inferred": self.inferred,
                "notes": self.notes,
                "extra": self.extra,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Provenance:
        data = json.loads(text)
        return cls(
            source_format=str(data.get("source_format", "unknown")),
            source_files=list(data.get("source_files", [])),
            inferred=dict(data.get("inferred", {})),
            notes=list(data.get("notes", [])),
            extra=dict(data.get("extra", {})),
        )


def to_table(df: pd.DataFrame) -> pa.Table:
    """Convert a step frame (columns as in COLUMNS; version 2's may be absent, meaning null) to
    an Arrow table of the canonical schema."""
    absent = [c for c in V2_COLUMNS if c not in df.columns]
    if absent:
        df = df.assign(**{c: pd.Series([None] * len(df), index=df.index, dtype=object)
                          for c in absent})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"missing columns: {', '.join(missing)}")
    return pa.Table.from_pandas(df[list(COLUMNS)], schema=ARROW_SCHEMA, preserve_index=False)


# What a synthetic trace's steps share unless a row says otherwise.
SYNTHETIC_DEFAULTS: Mapping[str, Any] = {"start_s": 0.0, "priority": "interactive",
                                         "tenant": "t"}


def steps_table(rows: Iterable[Mapping[str, Any]],
                defaults: Mapping[str, Any] | None = None) -> pa.Table:
    """Steps given as dicts, as an Arrow table of the canonical schema: a column a row leaves
    out takes `defaults`' value, else null (synthetic traces, tests)."""
    base = {c: None for c in COLUMNS} | dict(defaults or {})
    return pa.Table.from_pylist([{**base, **r} for r in rows], schema=ARROW_SCHEMA)


def write_trajectories(
    df: pd.DataFrame | pa.Table, path: str | Path, provenance: Provenance
) -> Path:
    """Write steps to Parquet with the schema version and provenance in the file metadata."""
    table = df if isinstance(df, pa.Table) else to_table(df)
    meta: dict[bytes, bytes] = dict(table.schema.metadata or {})
    meta.pop(b"pandas", None)
    meta[META_SCHEMA_VERSION] = SCHEMA_VERSION.encode()
    meta[META_PROVENANCE] = provenance.to_json().encode()
    table = table.replace_schema_metadata(meta)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        pq.write_table(table, tmp, use_dictionary=list(DICTIONARY_COLUMNS), compression="zstd")
        tmp.replace(out)
    except OSError as exc:  # a folder nobody may write in (/proc), a full disk: the user's to fix
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise InputError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return out


def file_sha256(path: Path) -> str:
    """The sha256 of a file (run metadata names the exact trace a run replayed)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_metadata(path: str | Path) -> Mapping[bytes, bytes]:
    return pq.read_schema(path).metadata or {}


def read_provenance(path: str | Path) -> Provenance | None:
    raw = read_metadata(path).get(META_PROVENANCE)
    return Provenance.from_json(raw) if raw else None


def gap_steps(df: pd.DataFrame) -> pd.Series:
    """True at each gap step (GAP_TOOL, or a name earlier importers gave it, of class
    local_read): a pause between back-to-back calls, not a tool call."""
    return ((df["kind"] == KIND_TOOL)
            & df["tool_name"].astype(object).isin(GAP_TOOL_NAMES)
            & (df["tool_class"].astype(object) == "local_read"))
