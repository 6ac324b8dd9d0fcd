"""The trajectory format: one Parquet row per step, LLM and tool steps alternating.

The schema version and provenance travel in the Parquet file's key-value metadata, so a file
explains where it came from and what was inferred rather than recorded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = "1"
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
)

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
    ]
)
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)
# Repeated per step but constant per trajectory: stored dictionary-encoded.
TRAJECTORY_LEVEL = ("trajectory_id", "start_s", "priority", "tenant", "prefix_group")
DICTIONARY_COLUMNS = (
    "trajectory_id",
    "kind",
    "priority",
    "tenant",
    "prefix_group",
    "tool_name",
    "tool_class",
    "outcome",
)


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
    """Convert a step frame (columns as in COLUMNS) to an Arrow table of the canonical schema."""
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
    pq.write_table(table, tmp, use_dictionary=list(DICTIONARY_COLUMNS), compression="zstd")
    tmp.replace(out)
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
