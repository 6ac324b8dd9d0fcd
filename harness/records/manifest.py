"""run.json as a typed, versioned manifest: what a run was asked to do, what it ran on, how it
ended.

A replay writes it at the start (status `running`) and again at the end, so a killed run leaves
a labelled, readable results directory; the simulator writes the same file. Reading checks the
schema version: a file of an older version is migrated, a newer one is refused with one line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.jsontypes import finite_json
from harness.records.store import RUN_JSON, write_json

# Disk set aside while a run writes its results (removed before run.json's last write): run.json
# is ended (never left `running`) on a disk that filled up during the run.
RUN_JSON_RESERVE = ".run.json.reserve"
RUN_JSON_RESERVE_BYTES = 64 * 1024
MANIFEST_VERSION = 4
# Version 1: the same fields without `schema_version` (and a top-level `kv_connector`);
# version 2: without `host`; version 3: without `shard`, `start_at` and `workers`.
OLDEST_READABLE = 1


@dataclass
class TraceRef:
    path: str
    sha256: str
    trajectories: int  # root trajectories (tasks)
    steps: int
    subagents: int = 0  # trajectories started by a parent, beside `trajectories`
    # every token count was multiplied by this (rounded up), at import and replay together
    token_scale: float = 1.0
    # the trace's best prefix-hit rate and each fixed policy's (harness.traces.reuse)
    ideal_reuse: dict[str, Any] | None = None
    copies: int = 1  # a bounded closed loop replays the trace this many times end to end


@dataclass
class ArrivalsRef:
    mode: str  # closed | poisson | trace
    concurrency: int
    rate: float | None
    time_scale: float = 1.0


@dataclass
class CpuPinning:
    """The CPUs the harness and a local server were pinned to (one decision per bench)."""

    harness: list[int]
    server: str  # taskset list


@dataclass
class Outcome:
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    unsupported_actions: int = 0
    server_failed: int = 0  # of `failed`: because the server failed (exit code 4)
    interrupted: int = 0  # ended by SIGINT/SIGTERM before they finished


CLEANUP_ERRORS_KEPT = 50  # a run that lost its server can have one per trajectory


@dataclass
class Cleanup:
    slots_idle: bool | None = None
    dump_files_left: list[str] | None = None  # None: the server's disk is not visible here
    errors: list[str] = field(default_factory=list)  # the first CLEANUP_ERRORS_KEPT
    # swap dumps written to a remote server's disk (its --slot-save-path), left there by name
    remote_dumps_left: list[str] = field(default_factory=list)
    errors_total: int = 0  # every cleanup error, also those not kept in `errors`
    # What the server still held for the run at its end (pinned contexts, sessions, host
    # copies), as the adapter names it; None: not visible from the client.
    held_left: list[str] | None = None

    def problems(self) -> list[str]:
        """What the cleanup left undone, one short phrase each however many errors it had
        (remote dumps, which no server API deletes, are not counted as undone)."""
        out = []
        if self.slots_idle is False:
            out.append("slots still busy at the end")
        if self.dump_files_left:
            out.append(f"{len(self.dump_files_left)} dump file(s) left")
        if self.held_left:
            out.append(f"{len(self.held_left)} context(s) still held on the server, the "
                       f"first: {self.held_left[0][:120]}")
        if self.errors:
            out.append(f"{max(self.errors_total, len(self.errors))} cleanup error(s), the "
                       f"first: {self.errors[0][:200]}")
        return out


@dataclass
class RunManifest:
    """run.json. Every field may be unknown (None) in a directory written by hand or by an
    interrupted run; `RunManifest()` stands for a directory without run.json."""

    run_id: str | None = None
    status: str | None = None  # running | finished | interrupted
    runtime: str | None = None  # llamacpp | vllm | sglang | simulator | ...
    policy: str | None = None
    policy_args: dict[str, str] = field(default_factory=dict)
    policy_sees_true_latency: bool | None = None
    harness_policy: str | None = None  # what the executor decided per pause, if not `policy`
    server_policy: str | None = None  # how the policy ran on this server, in words
    trace: TraceRef | None = None
    seed: int | None = None
    injection: dict[str, Any] | None = None
    arrivals: ArrivalsRef | None = None
    harness_version: str | None = None
    git_commit: str | None = None
    host: dict[str, Any] | None = None  # the machine measured on (harness.records.host)
    started_at: str | None = None
    calibration: dict[str, Any] | None = None
    # the server
    server_url: str | None = None
    server_flags: list[str] | None = None  # None: a server the harness did not start
    server_binary: str | None = None
    server_build: str | None = None
    server_python: str | None = None
    server_env: dict[str, str] | None = None
    server_start_s: float | None = None
    server_version: str | None = None
    server_model: str | None = None
    server_extra: dict[str, Any] | None = None
    model: dict[str, Any] | None = None  # name, path, geometry, kv_bytes_per_token
    vocab_size: int | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    cache_block_tokens: int | None = None
    # False: the server reuses prompt blocks only, not the KV of generated tokens (a resumed
    # call can reuse its context less the last call's output); None: not known (as True)
    cache_reuses_output: bool | None = None
    capabilities: dict[str, Any] | None = None
    cpu_pinning: CpuPinning | None = None
    http: dict[str, Any] | None = None  # the client's connection pool
    event_loop: str | None = None  # uvloop <version> | asyncio
    client_gc: dict[str, Any] | None = None  # the client's garbage-collector pauses
    history_window: int | None = None  # tool latencies per class a policy sees (0: all)
    # the client's own error on this machine (`harness selftest`, via --selftest): TTFT,
    # resume and client-lag error statistics, when, where and with how many agents measured
    instrument_error: dict[str, Any] | None = None
    # how it went
    wall_anchor_ns: int | None = None
    duration_s: float | None = None
    outcome: Outcome | None = None
    final_rates: dict[str, float] | None = None
    cleanup: Cleanup | None = None
    scrape_errors: list[str] = field(default_factory=list)
    scrape: dict[str, float] | None = None  # the server sampler: interval, samples, cost
    # a local server's pid, process group and private folder (what a killed run would leave)
    server_process: dict[str, Any] | None = None
    # a distributed run's local Ray instance: its private folder, which every one of its
    # processes names (what a killed driver would leave; `harness clean` stops them)
    ray_instance: dict[str, Any] | None = None
    stop_reason: str | None = None  # why a run ended early (its local server exited)
    bystanders_ended_s: float | None = None  # the planned bystanders ran out before the agents
    # trajectories left out because their context could not fit (--skip-oversized)
    skipped_oversized: list[str] | None = None
    client_cpu_s: float | None = None  # the harness process's CPU (all threads) over the replay
    # the simulator's own
    capacity: dict[str, Any] | None = None
    window: dict[str, float] | None = None  # a bounded run: warmup_s, duration_s (its horizon)
    simulator: dict[str, Any] | None = None
    # several load generators as one run (harness.plan.shard): a shard's own run.json names
    # its shard ('i/n') and the shared origin (`start_at`, Unix seconds); the merged run.json
    # lists every load generator (`workers`: shard, status, outcome, CPU, host, where)
    shard: str | None = None
    start_at: float | None = None
    workers: list[dict[str, Any]] | None = None
    # the job's inputs as given (harness.specs: the command and every input by its key in a
    # benchmark file, secrets left out, the trace's sha256 beside them), which `harness rerun`
    # runs again; None: a run.json written before specs were recorded, or by a library call
    spec: dict[str, Any] | None = None
    schema_version: int = MANIFEST_VERSION

    @property
    def kv_bytes_per_token(self) -> float | None:
        """model.kv_bytes_per_token as a float, None when unknown."""
        value = (self.model or {}).get("kv_bytes_per_token")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self, directory: Path) -> None:
        """Write run.json into `directory` atomically; a NaN or an infinity is written as null
        and named on stderr (finite_json)."""
        write_json(directory / RUN_JSON, finite_json(self.to_dict(), str(directory / RUN_JSON)))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = RUN_JSON,
                  damage: list[str] | None = None) -> RunManifest:
        """A manifest from run.json's content; InputError naming `where` for a version this
        harness cannot read or a field it does not know. With `damage` (a list), a field it
        does not know or of the wrong kind is left unknown and said there instead."""
        manifest: RunManifest = _build(cls, migrate(data, where), where, damage)
        return manifest


def migrate(data: dict[str, Any], where: str = RUN_JSON) -> dict[str, Any]:
    """run.json content of any readable version as the current version's fields."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object")
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise InputError(f"{where}: schema_version must be an integer, got {version!r}")
    if version > MANIFEST_VERSION:
        raise InputError(f"{where}: run.json schema version {version} is newer than this "
                         f"harness reads ({MANIFEST_VERSION}); upgrade the harness")
    if version < OLDEST_READABLE:
        raise InputError(f"{where}: run.json schema version {version} is older than this "
                         f"harness reads ({OLDEST_READABLE}-{MANIFEST_VERSION})")
    data = dict(data)
    if version == 1:
        connector = data.pop("kv_connector", None)
        if connector is not None:
            data["server_extra"] = {**(data.get("server_extra") or {}),
                                    "kv_connector": connector}
        data.pop("summary_written", None)
    data["schema_version"] = MANIFEST_VERSION
    return data


def read_manifest(results_dir: Path, damage: list[str] | None = None) -> RunManifest:
    """The run.json of a results directory (`RunManifest()` when there is none). With `damage`
    (a list), a run.json that is not a JSON object reads as none, and a field of the wrong kind
    as unknown, each said in `damage` instead of refused."""
    path = Path(results_dir) / RUN_JSON
    if not path.is_file():
        return RunManifest()
    try:
        data = json.loads(path.read_text())
        if damage is not None and not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except (OSError, ValueError) as exc:
        if damage is None:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        damage.append(f"{path}: not valid JSON ({str(exc)[:160]}): the run's configuration "
                      "(runtime, policy, server, host) left unknown")
        return RunManifest()
    return RunManifest.from_dict(data, str(path), damage)


def _build(cls: type[Any], data: dict[str, Any], where: str,
           damage: list[str] | None = None) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown and damage is None:
        raise InputError(f"{where}: unknown field {unknown[0]!r} in {cls.__name__}")
    values = {}
    for key, value in data.items():
        if key not in names:
            assert damage is not None
            damage.append(f"{where}: unknown field {key!r} in {cls.__name__}: left out")
            continue
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(value, dict):
            value = _build(sub, value, where, damage)
        elif value is not None and (kind := _container_of(hints[key], sub)) is not None \
                and not isinstance(value, kind):
            # a hand-edited or damaged file: refused here, never a traceback further on
            problem = (f"{where}: {cls.__name__} field {key!r} must be "
                       f"{'an object' if kind is dict else 'a list'}, got "
                       f"{type(value).__name__}")
            if damage is None:
                raise InputError(problem)
            damage.append(f"{problem}: left unknown")
            continue
        values[key] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise InputError(f"{where}: {cls.__name__}: {exc}") from None


def _container_of(hint: Any, sub: type[Any] | None) -> type[Any] | None:
    """dict for a field holding an object (a dataclass, or a dict), list for one holding a
    list, else None (a scalar: not checked here)."""
    if sub is not None:
        return dict
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for arg in args:
        origin = typing.get_origin(arg) or arg
        if origin in (dict, list):
            return dict if origin is dict else list
    return None


def _dataclass_of(hint: Any) -> type[Any] | None:
    """The dataclass in a hint `X` or `X | None`, else None."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for arg in args:
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None
