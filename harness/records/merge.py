"""Merging the results of load generators that ran one run in shards into one results
directory, the same as a single process would have written.

Every shard's records share the run's timeline (one origin, harness.plan.shard), so merging is
a concatenation ordered by time, with the sequence numbers renumbered so that they are unique
and in time order as one process's are. run.json is the first shard's, with what differs per
shard added up (outcomes, client CPU, connections, cleanup) and every shard listed in `workers`.

A shard whose load generator was lost (its run.json still reads `running`, or the driver saw
it die) is recorded, never dropped: each of its trajectories that has no end in its records
gets one, `failed` with reason `worker-lost` (and a start too when it never started and the
driver can name it), at the time of the loss.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.errors import InputError
from harness.records import legacy
from harness.records.kinds import WORKER_LOST
from harness.records.manifest import Cleanup, Outcome, RunManifest, read_manifest
from harness.records.parts import write_part
from harness.records.schema import RECORDS_SCHEMA, RECORDS_VERSION_KEY, SERVER_METRICS_SCHEMA
from harness.records.store import RECORDS_DIR, SERVER_METRICS_DIR, records_version

MERGED_PART_ROWS = 500_000  # rows per merged records part (as the simulator writes them)


@dataclass(frozen=True)
class Planned:
    """A trajectory a shard was to replay: its id, parent (sub-agents) and arrival (ns)."""

    trajectory_id: str
    planned_ns: int = 0
    parent_id: str | None = None


@dataclass
class ShardInput:
    """One shard's results directory, and what the driver knows about it: whether its load
    generator was lost (and when, ns on the run's timeline), every trajectory it was to replay
    (to record those a lost one never started), and where it ran."""

    directory: Path
    lost: bool = False
    lost_at_ns: int | None = None
    planned: tuple[Planned, ...] = ()
    where: dict[str, Any] = field(default_factory=dict)
    shard: str | None = None  # 'i/n', for a lost shard that died before writing run.json


@dataclass(frozen=True)
class MergeResult:
    run: RunManifest
    records: int
    lost_shards: list[str]
    # trajectories of lost shards that never started and could not be named (a merge without
    # the plan): counted here, absent from the records
    unnamed_lost: int


def merge_shards(shards: Sequence[ShardInput], out: Path) -> MergeResult:
    """Merge the shards' results into `out` (records, server samples, run.json); returns the
    merged run.json and what was lost. InputError when the directories are not the shards of
    one run, or `out` holds records already. The server-wide end checks (slots idle, dump
    files left) are the caller's to add: no shard could make them while others ran."""
    manifests = _with_placeholders(shards, [read_manifest(s.directory) for s in shards])
    check_shards(shards, manifests)
    records_dir = out / RECORDS_DIR
    if any(records_dir.glob("part-*.parquet")):
        raise InputError(f"{out} already holds records; choose a new --out directory")
    tables: list[pa.Table] = []
    workers: list[dict[str, Any]] = []
    for k, (s, m) in enumerate(zip(shards, manifests, strict=True)):
        table = _read_records(s.directory / RECORDS_DIR)
        lost = s.lost or m.status in (None, "running")
        if lost:
            extra = _lost_ends(table, s, str(m.run_id))
            table = pa.concat_tables([table, extra]) if extra.num_rows else table
        tables.append(table.append_column("_shard", pa.array(np.full(table.num_rows, k))))
        workers.append(_worker_entry(s, m, table, lost))
    samples = _read_server_metrics([s.directory for s in shards])
    merged = _ordered(tables)
    n = _write_records(merged, records_dir)
    _write_server_metrics(samples, out / SERVER_METRICS_DIR)
    run = _merged_manifest(manifests, workers)
    run.write(out)
    lost_names = [w["shard"] for w in workers if w["lost"]]
    return MergeResult(run, n, lost_names, _unnamed_lost(shards, workers, run, merged))


def _unnamed_lost(shards: Sequence[ShardInput], workers: list[dict[str, Any]],
                  run: RunManifest, merged: pa.Table) -> int:
    """How many trajectories a lost shard never started that no record names: only known for
    a lost shard merged without its plan, in a run meant to play the whole trace."""
    if run.window is not None or run.trace is None or not any(
            w["lost"] and not s.planned for s, w in zip(shards, workers, strict=True)):
        return 0
    starts = pc.equal(merged.column("event"), "trajectory_start")
    seen = len(pc.unique(merged.filter(starts).column("trajectory_id")))
    return max(0, run.trace.trajectories + run.trace.subagents - seen)


def _with_placeholders(shards: Sequence[ShardInput], manifests: list[RunManifest]
                       ) -> list[RunManifest]:
    """A lost shard that never wrote run.json stands in as another shard's run.json with its
    own shard and nothing measured (status None: lost)."""
    known = next((m for m in manifests if m.shard is not None), None)
    if known is None:
        return manifests
    return [dataclasses.replace(known, shard=s.shard, status=None, outcome=None,
                                client_cpu_s=None, duration_s=None, cleanup=None, http=None,
                                scrape_errors=[], capabilities=None)
            if m.run_id is None and s.lost and s.shard else m
            for s, m in zip(shards, manifests, strict=True)]


def check_shards(shards: Sequence[ShardInput], manifests: list[RunManifest]) -> int:
    """The shard count; InputError unless the directories are every shard of one run."""
    if not shards:
        raise InputError("give the results directories of a run's shards")
    for s, m in zip(shards, manifests, strict=True):
        if m.shard is None:
            raise InputError(f"{s.directory}: not a shard of a run (its run.json has no "
                             "shard; was it run with --shard i/n?)")
    first = manifests[0]
    same = ("run_id", "policy", "seed", "start_at", "runtime")
    for s, m in zip(shards[1:], manifests[1:], strict=False):
        for name in same:
            if getattr(m, name) != getattr(first, name):
                raise InputError(f"{s.directory}: another run's shard ({name} "
                                 f"{getattr(m, name)!r}, not {getattr(first, name)!r})")
        if (m.trace and m.trace.sha256) != (first.trace and first.trace.sha256):
            raise InputError(f"{s.directory}: a shard of a run of another trace")
    indices = [_shard_parts(str(m.shard), s.directory) for s, m in zip(shards, manifests,
                                                                      strict=True)]
    counts = {c for _, c in indices}
    if len(counts) != 1:
        raise InputError(f"the shards split the run differently: {sorted(counts)} shards")
    count = counts.pop()
    seen = Counter(i for i, _ in indices)
    if dup := sorted(i for i, c in seen.items() if c > 1):
        raise InputError(f"shard {dup[0]}/{count} is given twice")
    if missing := sorted(set(range(count)) - set(seen)):
        raise InputError(f"shard {missing[0]}/{count} is missing (a merge needs every shard; "
                         "a lost one's directory is enough)")
    return count


def _shard_parts(text: str, where: Path) -> tuple[int, int]:
    i, _, n = text.partition("/")
    try:
        return int(i), int(n)
    except ValueError:
        raise InputError(f"{where}: run.json shard {text!r} is not i/n") from None


def _read_records(directory: Path) -> pa.Table:
    parts = sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []
    tables = [read_part(p, RECORDS_SCHEMA, "records") for p in parts]
    return pa.concat_tables(tables) if tables else RECORDS_SCHEMA.empty_table()


def read_part(part: Path, schema: pa.Schema, what: str) -> pa.Table:
    """One Parquet part of a shard's results, in `schema` (a records part of an older version
    as the current one: harness.records.legacy); InputError naming the file when it cannot be
    read (truncated, zero bytes, not Parquet) or lacks the schema's columns."""
    try:
        table = pq.read_table(part)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{part}: a {what} part that cannot be read "
                         f"({str(exc).splitlines()[0][:160]})") from None
    if RECORDS_VERSION_KEY in (schema.metadata or {}):
        table = legacy.upgrade(table, records_version(part, table.schema))
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise InputError(f"{part}: a {what} part without the column(s) "
                         f"{', '.join(missing[:5])}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(f"{part}: a {what} part whose columns are not the {what}' types "
                         f"({str(exc).splitlines()[0][:160]})") from None


def _lost_ends(table: pa.Table, shard: ShardInput, run_id: str) -> pa.Table:
    """The records a lost shard's unfinished trajectories get."""
    events = table.column("event").to_pylist()
    tids = table.column("trajectory_id").to_pylist()
    traffic = table.column("traffic").to_pylist()
    started = {t for e, t, tr in zip(events, tids, traffic, strict=True)
               if e == "trajectory_start" and tr == "agent"}
    ended = {t for e, t in zip(events, tids, strict=True) if e == "trajectory_end"}
    last = int(pc.max(table.column("t_ns")).as_py() or 0) if table.num_rows else 0
    at = max(last, shard.lost_at_ns or 0)
    rows: list[dict[str, Any]] = []
    for p in shard.planned:
        if p.trajectory_id in ended:
            continue
        if p.trajectory_id not in started:
            rows.append({"event": "trajectory_start", "trajectory_id": p.trajectory_id,
                         "planned_ns": p.planned_ns, "parent_id": p.parent_id,
                         "detail": WORKER_LOST})
        rows.append({"event": "trajectory_end", "trajectory_id": p.trajectory_id,
                     "status": "failed", "reason": WORKER_LOST})
    named = {p.trajectory_id for p in shard.planned}
    rows += [{"event": "trajectory_end", "trajectory_id": t, "status": "failed",
              "reason": WORKER_LOST} for t in sorted(started - ended - named)]
    for r in rows:
        r.update(run_id=run_id, seq=0, t_ns=at, traffic="agent")
    return pa.Table.from_pylist(rows, schema=RECORDS_SCHEMA)


def _ordered(tables: list[pa.Table]) -> pa.Table:
    """The shards' records as one table in time order (ties: shard, then its own order), the
    sequence numbers renumbered 0.. in that order."""
    merged = pa.concat_tables(tables)
    merged = merged.sort_by([("t_ns", "ascending"), ("_shard", "ascending"),
                             ("seq", "ascending")])
    merged = merged.drop_columns(["_shard"])
    seq = pa.array(np.arange(merged.num_rows, dtype=np.int64))
    return merged.set_column(merged.schema.get_field_index("seq"), "seq", seq)


def _write_records(table: pa.Table, directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    table = table.cast(RECORDS_SCHEMA)
    for k, start in enumerate(range(0, max(table.num_rows, 1), MERGED_PART_ROWS)):
        batches = table.slice(start, MERGED_PART_ROWS).to_batches()
        write_part(directory / f"part-{k:05d}.parquet", RECORDS_SCHEMA, batches)
    return int(table.num_rows)


def _read_server_metrics(dirs: list[Path]) -> list[pa.Table]:
    """Every shard's server-sample parts (one shard samples), read before anything is
    written, so a damaged one stops the merge with nothing merged."""
    return [read_part(part, SERVER_METRICS_SCHEMA, "server-metrics")
            for d in dirs for part in (sorted((d / SERVER_METRICS_DIR).glob("part-*.parquet"))
                                       if (d / SERVER_METRICS_DIR).is_dir() else [])]


def _write_server_metrics(tables: list[pa.Table], out: Path) -> None:
    """The server samples, renumbered into one folder."""
    for k, table in enumerate(tables):
        out.mkdir(parents=True, exist_ok=True)
        write_part(out / f"part-{k:05d}.parquet", SERVER_METRICS_SCHEMA, table.to_batches())


def _worker_entry(s: ShardInput, m: RunManifest, table: pa.Table, lost: bool
                  ) -> dict[str, Any]:
    ends = [st for e, st in zip(table.column("event").to_pylist(),
                                table.column("status").to_pylist(), strict=True)
            if e == "trajectory_end"]
    outcome = (dataclasses.asdict(m.outcome) if m.outcome is not None and not lost
               else {k: ends.count(k) for k in ("completed", "cancelled", "failed",
                                                  "interrupted")})
    return {"shard": m.shard, "status": "lost" if lost else m.status, "lost": lost,
            "outcome": outcome, "client_cpu_s": m.client_cpu_s, "duration_s": m.duration_s,
            "event_loop": m.event_loop, "client_gc": m.client_gc, "http": m.http,
            "host": (m.host or {}).get("hostname"), "dir": str(s.directory), **s.where}


def _merged_manifest(manifests: list[RunManifest], workers: list[dict[str, Any]]
                     ) -> RunManifest:
    order = sorted(range(len(manifests)),
                   key=lambda k: _shard_parts(str(workers[k]["shard"]), Path())[0])
    alive = [k for k in order if not workers[k]["lost"] and manifests[k].capabilities]
    base = manifests[(alive or order)[0]]
    run = dataclasses.replace(base, shard=None, workers=[workers[k] for k in order])
    lost = any(w["lost"] for w in workers)
    statuses = {m.status for m in manifests}
    run.status = "finished" if statuses == {"finished"} and not lost else "interrupted"
    run.outcome = _summed_outcome(workers)
    run.duration_s = max((m.duration_s or 0.0 for m in manifests), default=None)
    run.client_cpu_s = sum(m.client_cpu_s or 0.0 for m in manifests)
    run.stop_reason = next((m.stop_reason for m in manifests if m.stop_reason),
                           WORKER_LOST if lost else None)
    run.scrape_errors = [e for m in manifests for e in m.scrape_errors]
    run.skipped_oversized = sorted({t for m in manifests for t in m.skipped_oversized or []}
                                   ) or None
    ended = [m.bystanders_ended_s for m in manifests if m.bystanders_ended_s is not None]
    run.bystanders_ended_s = max(ended) if ended else None
    run.http = _summed_http(manifests)
    run.cleanup = _merged_cleanup(manifests)
    return run


def _summed_outcome(workers: list[dict[str, Any]]) -> Outcome:
    total = Outcome()
    for w in workers:  # each worker's outcome: its run.json's, or counted from a lost one's records
        part = Outcome(**w["outcome"])
        for f in dataclasses.fields(Outcome):
            setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
    return total


def _summed_http(manifests: list[RunManifest]) -> dict[str, Any] | None:
    """The first shard's client settings, with the counts that add up across shards added."""
    https = [m.http for m in manifests if m.http]
    if not https:
        return None
    out = dict(https[0])
    for key in ("connection_limit", "connections_opened"):
        values = [h[key] for h in https if isinstance(h.get(key), int)]
        if values:
            out[key] = sum(values)
    return out


def _merged_cleanup(manifests: list[RunManifest]) -> Cleanup:
    cleanups = [m.cleanup for m in manifests if m.cleanup is not None]
    dumps = [d for c in cleanups for d in c.dump_files_left or []]
    errors = [e for c in cleanups for e in c.errors]
    return Cleanup(
        slots_idle=None,
        dump_files_left=(sorted(set(dumps)) if any(c.dump_files_left is not None
                                                   for c in cleanups) else None),
        errors=errors[:50], remote_dumps_left=[d for c in cleanups for d in c.remote_dumps_left],
        errors_total=sum(max(c.errors_total, len(c.errors)) for c in cleanups),
        held_left=(sorted({h for c in cleanups for h in c.held_left or []})
                   if any(c.held_left is not None for c in cleanups) else None))
