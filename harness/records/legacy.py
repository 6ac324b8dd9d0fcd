"""Records parts of older schema versions, read as the current version's columns.

A column that meant two things was split, and an older part reads with each value where the
current version keeps it, on its event's rows (MOVED), so every reader sees one schema:
- version 4: `value_s` held four things, by event (the server's queue wait on call_end, the
  planned latency on tool_start, the predicted wait on pause_decision, the seconds waited on
  slot_wait), and call_end's `reason` the worker that served the call;
- version 5: trajectory_start's `detail` held its priority and its `step` a sub-agent's
  spawning step of its parent; swap_in's `reason` said that the server restored the context
  with the resumed call (now its `detail`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from harness.records.kinds import BY_NAME, WORKER_LOST

# column -> (the column it was in, the event whose rows held it there)
MOVED: dict[str, tuple[str, str]] = {
    "engine_queue_s": ("value_s", "call_end"),
    "planned_latency_s": ("value_s", "tool_start"),
    "predicted_wait_s": ("value_s", "pause_decision"),
    "slot_wait_s": ("value_s", "slot_wait"),
    "served_by": ("reason", "call_end"),
    "priority": ("detail", "trajectory_start"),
    "spawn_step": ("step", "trajectory_start"),
    "detail": ("reason", "swap_in"),
}
# column -> the version from which MOVED's values are in it
SINCE: dict[str, int] = {
    "engine_queue_s": 4, "planned_latency_s": 4, "predicted_wait_s": 4, "slot_wait_s": 4,
    "served_by": 4, "priority": 5, "spawn_step": 5, "detail": 5}
# column -> a value that stayed where it was: a merge's placeholder trajectory_start held
# WORKER_LOST in `detail`, where it still is, not a priority
KEPT: dict[str, str] = {"priority": WORKER_LOST}
# the columns no version after the one named has
DROPPED: dict[str, int] = {"value_s": 4}
CURRENT = max(SINCE.values())
if set(SINCE) != set(MOVED) or not set(MOVED) <= set(BY_NAME):
    raise RuntimeError("legacy.MOVED, SINCE and the records columns disagree")


def _moves(version: int) -> list[tuple[str, str, str]]:
    """(new, old, event) of every move a part of `version` needs."""
    return [(new, old, ev) for new, (old, ev) in MOVED.items() if SINCE[new] > version]


def sources(columns: Iterable[str], version: int) -> list[str]:
    """The columns an old part must be read with for `columns` to be upgraded from it (none
    for a current part)."""
    wanted = set(columns)
    out: set[str] = set()
    for new, old, _ in _moves(version):
        if new in wanted:
            out |= {old, "event"}
        if old in wanted:  # its values moved off some rows
            out.add("event")
    return sorted(out - wanted)


def _plain(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """A part's table (of `version`) with the current version's columns: each moved value in
    its column on its event's rows (appended when the table lacks the column), null where it
    was, and the dropped columns dropped. A table that lacks a source column (not read) gets
    no moved values from it; a current part's table is returned as it is."""
    if version >= CURRENT or "event" not in table.column_names:
        return table
    event = _plain(table.column("event"))
    masks: dict[str, pa.ChunkedArray] = {}

    def on(name: str) -> pa.ChunkedArray:
        if name not in masks:
            masks[name] = pc.fill_null(pc.equal(event, name), False)
        return masks[name]

    def put(name: str, values: pa.ChunkedArray | pa.Array) -> pa.Table:
        if name not in table.column_names:
            return table.append_column(pa.field(name, values.type), values)
        typ = table.column(name).type
        return table.set_column(table.column_names.index(name), name,
                                values if values.type == typ else values.cast(typ))

    for new, old, ev in _moves(version):
        if old not in table.column_names:
            continue
        src = _plain(table.column(old))
        hit = on(ev)
        if new in KEPT:
            hit = pc.and_(hit, pc.fill_null(pc.not_equal(src, KEPT[new]), True))
        typ = BY_NAME[new].type
        if not pc.any(hit).as_py():  # nothing to move: the columns stay as read
            if new not in table.column_names:
                table = table.append_column(pa.field(new, typ), pa.nulls(table.num_rows, typ))
            continue
        into = (_plain(table.column(new)) if new in table.column_names
                else pa.scalar(None, typ))
        table = put(new, pc.if_else(hit, src.cast(typ), into))
        if old in BY_NAME:
            table = put(old, pc.if_else(hit, pa.scalar(None, src.type), src))
    dropped = [c for c, v in DROPPED.items() if v > version and c in table.column_names]
    return table.drop_columns(dropped) if dropped else table
