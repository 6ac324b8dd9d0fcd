"""Records parts of older schema versions, read as the current version's columns.

Before version 4, `value_s` held four things, by event (the server's queue wait on call_end,
the planned latency on tool_start, the predicted wait on pause_decision, the seconds waited on
slot_wait), and call_end's `reason` the worker that served the call. Version 4 gives each its
own column; a part of version 1-3 reads with those columns filled from where they were, on
their event's rows (and call_end's `reason` null), so every reader sees one schema.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from harness.records.kinds import BY_NAME

# The version from which the columns below have their own place.
SPLIT_VERSION = 4
# column -> (the column it was in before SPLIT_VERSION, the event whose rows held it there)
MOVED: dict[str, tuple[str, str]] = {
    "engine_queue_s": ("value_s", "call_end"),
    "planned_latency_s": ("value_s", "tool_start"),
    "predicted_wait_s": ("value_s", "pause_decision"),
    "slot_wait_s": ("value_s", "slot_wait"),
    "served_by": ("reason", "call_end"),
}
# column -> the events on whose rows an old part's values of it belong elsewhere now
_VACATED: dict[str, tuple[str, ...]] = {"reason": ("call_end",)}


def sources(columns: Iterable[str], version: int) -> list[str]:
    """The columns an old part must be read with for `columns` to be upgraded from it (none
    for a current part)."""
    if version >= SPLIT_VERSION:
        return []
    wanted = set(columns)
    out = {MOVED[c][0] for c in wanted if c in MOVED}
    if out or wanted & set(_VACATED):
        out.add("event")
    return sorted(out - wanted)


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """A part's table (of `version`) with the current version's columns in place of the ones
    they were split from: the moved columns appended, `reason` null on the rows whose value
    moved, and `value_s` dropped. A table that lacks a source column (not read) gets no moved
    column from it; a current part's table is returned as it is."""
    if version >= SPLIT_VERSION or "event" not in table.column_names:
        return table
    event = table.column("event")
    if pa.types.is_dictionary(event.type):
        event = event.cast(pa.string())
    masks: dict[str, pa.ChunkedArray] = {}

    def on(name: str) -> pa.ChunkedArray:
        if name not in masks:
            masks[name] = pc.fill_null(pc.equal(event, name), False)
        return masks[name]

    for new, (old, ev) in MOVED.items():
        if old in table.column_names and new not in table.column_names:
            typ = BY_NAME[new].type
            values = table.column(old).cast(typ)
            table = table.append_column(
                pa.field(new, typ), pc.if_else(on(ev), values, pa.scalar(None, typ)))
    for old, events in _VACATED.items():
        if old in table.column_names:
            col = table.column(old)
            hit = on(events[0])
            for ev in events[1:]:
                hit = pc.or_(hit, on(ev))
            plain = col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col
            kept = pc.if_else(hit, pa.scalar(None, plain.type), plain)
            table = table.set_column(table.column_names.index(old), old,
                                     kept.cast(col.type) if kept.type != col.type else kept)
    if "value_s" in table.column_names:
        table = table.drop_columns(["value_s"])
    return table
