"""The record schema: one row per event of a replay (or a simulation), integer-ns timestamps.

A results directory holds:
  records/part-NNNNN.parquet   events (this schema), written in parts so a killed run stays readable
  server_metrics/part-NNNNN.parquet   scraped server samples (SERVER_METRICS_SCHEMA)
  run.json      run metadata (runtime, server version, model and KV geometry, policy, seed, ...)
  summary.json  the headline metrics, written at the end of the run (recomputable from records)

`t_ns` is monotonic nanoseconds since the run's origin; run.json's `wall_anchor` maps t_ns = 0 to a
wall-clock time. Each event kind is declared once, with its columns and what each means
(harness.records.kinds); the schema is their union, and columns that an event does not have are
null.
"""

from __future__ import annotations

import pyarrow as pa

from harness.records.kinds import COLUMNS, KINDS, meanings

# Written into every records part's Parquet metadata and checked on read; a part without it
# predates the key and has version 1's columns. Version 2 added `token_gaps` (a version-1 part
# reads with it null); version 3 added `parent_id` (a sub-agent's parent, on trajectory_start);
# version 4 split `value_s` (engine_queue_s on call_end, planned_latency_s on tool_start,
# predicted_wait_s on pause_decision, slot_wait_s on slot_wait) and moved call_end's `reason`
# to `served_by`; version 5 moved trajectory_start's priority from `detail` to `priority` and
# its spawning step from `step` to `spawn_step`, and swap_in's `reason` to `detail` (older
# parts read so: harness.records.legacy); version 6 added the `hint_outcome` event and its
# `held_s` and `hint_delay_s` (an older part has no hint outcomes).
RECORDS_SCHEMA_VERSION = 6
RECORDS_VERSION_KEY = b"harness.records_schema_version"

# Events and the columns each one fills (besides run_id, seq, t_ns, event, trajectory_id,
# traffic), from their declarations (harness.records.kinds).
EVENTS: dict[str, str] = {
    k.KIND: ", ".join(f"{name} ({doc})" for name, doc in meanings(k).items()
                      if name not in ("trajectory_id", "traffic"))
    for k in KINDS
}

TRAJECTORY_STATUSES = ("completed", "cancelled", "failed", "interrupted")
KV_STATES = ("active", "paused", "released")

RECORDS_SCHEMA = pa.schema(
    [pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS],
    metadata={RECORDS_VERSION_KEY: str(RECORDS_SCHEMA_VERSION).encode()},
)
RECORD_COLUMNS: tuple[str, ...] = tuple(RECORDS_SCHEMA.names)

SERVER_METRICS_SCHEMA = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # "metrics" | "slots"
        pa.field("name", pa.string(), nullable=False),
        pa.field("labels", pa.string()),
        pa.field("value", pa.float64()),
    ]
)
