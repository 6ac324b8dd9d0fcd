"""The record schema: one row per event of a replay (or a simulation), integer-ns timestamps.

A results directory holds:
  records/part-NNNNN.parquet   events (this schema), written in parts so a killed run stays readable
  server_metrics/part-NNNNN.parquet   scraped server samples (SERVER_METRICS_SCHEMA)
  run.json      run metadata (runtime, server version, model and KV geometry, policy, seed, ...)
  summary.json  the headline metrics, written at the end of the run (recomputable from records)

`t_ns` is monotonic nanoseconds since the run's origin; run.json's `wall_anchor` maps t_ns = 0 to a
wall-clock time. Columns that an event does not use are null.
"""

from __future__ import annotations

import pyarrow as pa

# Written into every records part's Parquet metadata and checked on read; a part without it
# predates the key and has version 1's columns. Version 2 added `token_gaps` (a version-1 part
# reads with it null); version 3 added `parent_id` (a sub-agent's parent, on trajectory_start).
RECORDS_SCHEMA_VERSION = 3
RECORDS_VERSION_KEY = b"harness.records_schema_version"

# Events and the columns each one fills (besides run_id, seq, t_ns, event, trajectory_id, traffic).
EVENTS: dict[str, str] = {
    "trajectory_start": "planned_ns (scheduled arrival), priority in detail; a sub-agent's "
                        "parent_id and step (the parent's step that spawned it)",
    "call_start": "step, slot, planned_ns (when the call was due), prompt_tokens, "
                  "appended_tokens, is_resume",
    "first_token": "step, slot",
    "call_end": "step, slot, status (ok|error|timeout|aborted), output_tokens, cached_tokens, "
                "prompt_n (tokens the server processed), server_ms (prompt ms), "
                "decode_ms, detail (error text), reason (the worker that served it, where the "
                "runtime says: Dynamo's worker id), token_gaps (the client's time between one "
                "streamed chunk of tokens and the next, microseconds, little-endian uint32), "
                "value_s (the server's own report of the call's wait in its queue before it "
                "was first scheduled, s, where the runtime reports it: vLLM)",
    "tool_start": "step, tool_class, tool_name, value_s (planned latency; hidden from policies), "
                  "deadline_s",
    "tool_end": "step, tool_class, status (ok|error|timeout|abandoned), planned_ns (when the "
                "tool was due to end; t_ns is when the harness woke to it, the difference its "
                "client lag)",
    "pause_decision": "step, tool_class, action (keep|swap|recompute|ttl|cancel), reason, "
                      "retained_tokens, value_s (predicted wait s), slot",
    "swap_out": "step, slot, bytes, server_ms, retained_tokens",
    "swap_in": "step, slot, bytes, server_ms, retained_tokens",
    "erase": "step, slot, reason",
    "recompute": "step, recomputed_tokens (re-prefilled context)",
    "kv_state": "kv_tokens (device KV held by this trajectory), status (active|paused|released)",
    "slot_wait": "step, value_s (seconds waited for a free slot)",
    "cancel": "step, reason",
    "trajectory_end": "status (completed|cancelled|failed|interrupted), reason",
}

TRAJECTORY_STATUSES = ("completed", "cancelled", "failed", "interrupted")
KV_STATES = ("active", "paused", "released")

RECORDS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("t_ns", pa.int64(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string()),
        pa.field("traffic", pa.string()),  # "agent" | "bystander"
        pa.field("step", pa.int32()),
        pa.field("slot", pa.int32()),
        pa.field("tool_class", pa.string()),
        pa.field("tool_name", pa.string()),
        pa.field("action", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("status", pa.string()),
        pa.field("planned_ns", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("appended_tokens", pa.int64()),
        pa.field("is_resume", pa.bool_()),
        pa.field("output_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("prompt_n", pa.int64()),
        pa.field("retained_tokens", pa.int64()),
        pa.field("recomputed_tokens", pa.int64()),
        pa.field("kv_tokens", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("server_ms", pa.float64()),
        pa.field("decode_ms", pa.float64()),
        pa.field("value_s", pa.float64()),
        pa.field("deadline_s", pa.float64()),
        pa.field("detail", pa.string()),
        pa.field("token_gaps", pa.binary()),
        pa.field("parent_id", pa.string()),
    ],
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
