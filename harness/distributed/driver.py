"""`harness run --workers N`: one run driven by N load generators, Ray actors on a local Ray
instance the driver starts (and stops) or on an existing cluster (`--ray-address`).

The driver plans the whole run (to check it, size the server and name each shard's
trajectories), starts or reaches the server once, starts the actors and gives each its shard,
the server's URL and one run id. Once every shard is planned and connected, the driver gives
them all one start a moment ahead (so none starts late), and waits. Each actor replays its
shard into OUT/shards/shard-I (harness.distributed.worker). The driver then merges the shards
into OUT (harness.records.merge), checks the server's end state once every shard has ended,
and writes the summary: OUT reads like a single process's results.

Faults: an actor that dies is recorded (its unfinished trajectories `failed`, reason
`worker-lost`) and the run goes on with the others; a shard's server error, the local server's
exit, Ctrl-C or SIGTERM stop every actor (each records what it measured and frees its slots),
then the actors, the Ray instance and the local server are stopped; nothing is left running.
A stop signal is acted on whenever it comes: one while Ray or its actors start stops them once
Ray's call has returned (harness.distributed.instance), and the run ends interrupted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import signals
from harness.adapters.base import RuntimeSession
from harness.adapters.http import connect
from harness.adapters.launchers.process import processes_of
from harness.adapters.runtimes import get_runtime
from harness.distributed.instance import check_reachable, fleet, import_ray
from harness.errors import HarnessError, InputError, ServerError, Terminated
from harness.plan.planner import Plan
from harness.plan.shard import Shard, check_shardable, shard_plan
from harness.records.manifest import CpuPinning, Outcome, RunManifest
from harness.records.merge import Planned, ShardInput, merge_shards
from harness.records.store import RECORDS_DIR, SERVER_METRICS_DIR, ensure_out_dir
from harness.replay import loop, pinning
from harness.replay.clock import NS
from harness.replay.options import AUTO, RunOptions
from harness.replay.run import new_run_id, plan_run, server_options
from harness.replay.runner import max_in_flight, record_details, write_summary

SHARDS_DIR = "shards"
START_LEAD_S = 0.5  # from the last load generator ready to the run's shared start
READY_TIMEOUT_S = 180.0  # for the actors to start (a cold Ray node imports the harness)
STOP_GRACE_S = loop.CLEANUP_S + 10.0  # for stopped shards to record and free what they hold
POLL_S = 0.25


def shard_dir(out: Path, shard: Shard) -> Path:
    return out / SHARDS_DIR / f"shard-{shard.index}"


def planned_by_shard(plan: Plan, count: int) -> dict[int, tuple[Planned, ...]]:
    """Every trajectory (sub-agents included) each shard is to replay, with its arrival."""
    out: dict[int, tuple[Planned, ...]] = {}
    for i in range(count):
        part = shard_plan(plan, Shard(i, count))
        out[i] = tuple(Planned(t.trajectory_id, int(root.arrival_s * NS), t.parent_id)
                       for root in part.trajectories for t in root.family())
    return out


@dataclasses.dataclass
class Outcomes:
    """What the actors did: each one's answer, the lost ones (when, why), the first error."""

    start_at: float = 0.0  # the shared start (Unix seconds)
    start_at_known: bool = False  # every shard was ready and was given the start
    answers: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    lost: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)
    error: HarnessError | None = None
    stopped_by: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """A run's environment of `workers` load generators as Ray actors, on a local Ray
    instance or the cluster at `address` (harness.replay.run.RunEnvironment)."""

    workers: int
    address: str | None = None

    def execute(self, o: RunOptions, echo: Callable[[str], None]) -> RunManifest:
        return run_distributed(o, self.workers, self.address, echo)


def run_distributed(o: RunOptions, workers: int, address: str | None,
                    echo: Callable[[str], None]) -> RunManifest:
    """Run `o` from `workers` load generators as one run; returns the merged run.json."""
    ray = import_ray()
    # Ray prefixes each actor's lines with its name and pid; without colour codes in logs.
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if address:
        check_reachable(address)
    rt = get_runtime(o.runtime)
    planned_run = plan_run(o, rt)
    whole = planned_run.plan
    check_shardable(whole, workers)
    ensure_out_dir(o.out)
    if any((o.out / RECORDS_DIR).glob("part-*.parquet")) or (o.out / SHARDS_DIR).exists():
        raise InputError(f"{o.out} already holds results; choose a new --out directory")
    pin = (pinning.decide(pinning.available_cpus(), o.url is None, rt.pins_local_server,
                          workers) if o.pinning == AUTO else o.pinning)
    run_id = o.run_id or new_run_id(o.policy)
    server = dataclasses.replace(server_options(o, run_id, pin, planned_run.policy),
                                 connections=max_in_flight(whole) + workers)
    planned = planned_by_shard(whole, workers)
    with rt.start(server, o.out) as session:
        for note in session.notes:
            echo(note)
        # What a killed driver would leave, written before it exists: `harness clean OUT`
        # stops the server and the local Ray instance from this.
        running = RunManifest(run_id=run_id, status="running", policy=o.policy,
                              runtime=o.runtime, started_at=datetime.now(UTC).isoformat(),
                              server_process=session.details.process)

        def ray_started(temp: str | None) -> None:
            running.ray_instance = {"tmp_dir": temp} if temp else None
            running.write(o.out)

        # From Ray's start to the merged run.json, a stop signal is only noted where it
        # arrives (inside Ray's calls it would leave Ray half started or half stopped) and
        # acted on between them: before the shards run, Ray is stopped and the run ends
        # interrupted with nothing measured; once they run, every shard is stopped and
        # merged; after they ended, the merged run is marked interrupted.
        def nothing_measured() -> None:  # run.json of a run that ended before its shards ran
            RunManifest(run_id=run_id, status="interrupted", policy=o.policy,
                        runtime=o.runtime, started_at=running.started_at,
                        outcome=Outcome()).write(o.out)

        result: Outcomes | None = None
        with signals.deferred() as stop:
            try:
                with fleet(ray, address, workers, ray_started, stop) as actors:
                    where = _where(ray, actors, stop)
                    here = ray.get_runtime_context().get_node_id()
                    opts = [dataclasses.replace(
                        o, url=session.details.url, shard=Shard(i, workers), start_at=None,
                        run_id=run_id, out=shard_dir(o.out, Shard(i, workers)),
                        pinning=_worker_pin(pin, i) if where[i]["node"] == here else None,
                        server_shared=(session.details.shared if where[i]["node"] == here
                                       else None))
                        for i in range(workers)]

                    def started(start_at: float) -> None:
                        _write_start(o.out, running, start_at, where)
                        hosts = ", ".join(sorted({w["host"] for w in where}))
                        echo(f"{workers} load generators ({hosts}) ready; the run starts at "
                             f"{datetime.fromtimestamp(start_at, UTC):%H:%M:%S.%f} UTC")

                    result = _drive(ray, actors, opts, session, echo, started, stop)
                    for i, a in enumerate(actors):  # results on another machine's disk
                        if where[i]["node"] != here and i not in result.lost:
                            _fetch(ray, a, opts[i].out)
            except BaseException:
                if result is None:  # stopped, or Ray failed, before any shard ran
                    nothing_measured()
                raise
            try:
                stop()  # a signal while Ray stopped
            except (KeyboardInterrupt, Terminated) as exc:
                result.stopped_by = result.stopped_by or exc
            if not all((opt.out / "run.json").is_file() for opt in opts):
                # a shard refused or was stopped before it began: nothing to merge
                nothing_measured()
                raise result.error or result.stopped_by or ServerError(
                    "a load generator ended before the run began")
            merged = _merge(o, session, result, opts, planned, where, pin)
            try:
                stop()  # a signal while the shards were merged
            except (KeyboardInterrupt, Terminated) as exc:
                result.stopped_by = result.stopped_by or exc
            if result.stopped_by is not None:
                merged.status = "interrupted"
            merged.write(o.out)
    if any((o.out / RECORDS_DIR).glob("part-*.parquet")):  # none: stopped as the shards began
        write_summary(o.out, merged)
    _drop_shard_records(o.out, workers)
    for i, (_, why) in sorted(result.lost.items()):
        echo(f"warning: load generator {i}/{workers} was lost ({why}); its unfinished "
             "trajectories are recorded failed, reason worker-lost")
    if result.stopped_by is not None:
        raise result.stopped_by
    if result.error is not None:
        raise result.error
    return merged


def _merge(o: RunOptions, session: RuntimeSession, result: Outcomes, opts: list[RunOptions],
           planned: dict[int, tuple[Planned, ...]], where: list[dict[str, Any]],
           pin: CpuPinning | None) -> RunManifest:
    """The shards' results merged into OUT, with the run's server details and end checks;
    its run.json is for the caller to write."""
    workers = len(opts)
    pins = [p.harness if isinstance(p := opts[i].pinning, CpuPinning) else None
            for i in range(workers)]
    shards = [ShardInput(opts[i].out, i in result.lost,
                         result.lost[i][0] if i in result.lost else None, planned[i],
                         {**where[i], "pinned_cpus": pins[i]}, shard=str(Shard(i, workers)))
              for i in range(workers)]
    merged = merge_shards(shards, o.out).run
    record_details(merged, session)
    merged.cpu_pinning = pin
    if merged.cleanup is not None:
        try:
            merged.cleanup.slots_idle = _slots_idle(session, o)
        except (KeyboardInterrupt, Terminated) as exc:  # a signal during the check
            result.stopped_by = result.stopped_by or exc
        if session.leftover_dumps is not None:
            merged.cleanup.dump_files_left = session.leftover_dumps(str(opts[0].run_id))
    return merged


def _worker_pin(pin: CpuPinning | None, i: int) -> CpuPinning | None:
    """Load generator i's own CPU of those the harness has (one each, round robin)."""
    if pin is None:
        return None
    return CpuPinning(harness=[pin.harness[i % len(pin.harness)]], server=pin.server)


def _where(ray: Any, actors: list[Any], stop: Callable[[], None]) -> list[dict[str, Any]]:
    """Where each actor runs, once all have started (READY_TIMEOUT_S); a stop signal meanwhile
    is raised."""
    refs = [a.where.remote() for a in actors]
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
        stop()
        if len(done) == len(refs):
            break
    found: list[dict[str, Any]] = ray.get(refs, timeout=POLL_S)
    return found


def _drive(ray: Any, actors: list[Any], opts: list[RunOptions], session: RuntimeSession,
           echo: Callable[[str], None], started: Callable[[float], None],
           stop: Callable[[], None]) -> Outcomes:
    """Run every shard to its end, started together once all are ready (`started` is told
    when); stop them all at the first server error, a local server's exit or a stop signal
    (the signal is kept in `stopped_by` for the caller to re-raise). Runs under
    signals.deferred (`stop` is its check): signals are noted while the driver waits in Ray,
    and raised between its calls."""
    refs = {a.run.remote(opt): i for i, (a, opt) in enumerate(zip(actors, opts, strict=True))}
    pending = list(refs)
    res = Outcomes(start_at=time.time())
    try:
        _start_together(ray, actors, stop, res, started)
        if not res.start_at_known:  # one refused or failed before it began
            pending = _stop_all(ray, actors, pending, refs, res, echo)
        _wait_all(ray, actors, pending, refs, session, stop, res, echo)
    except (KeyboardInterrupt, Terminated) as exc:
        res.stopped_by = exc
        echo("stopping every load generator (each records what it measured)")
        running = [r for r, i in refs.items() if i not in res.answers and i not in res.lost]
        _stop_all(ray, actors, running, refs, res, echo)
    return res


def _start_together(ray: Any, actors: list[Any], stop: Callable[[], None], res: Outcomes,
                    started: Callable[[float], None]) -> None:
    """Wait until every shard is ready, then give all one start (res.start_at)."""
    waiting = [a.wait_ready.remote(READY_TIMEOUT_S) for a in actors]
    while True:
        done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_S)
        stop()
        if len(done) == len(waiting):
            break
    if all(ray.get(waiting)):
        res.start_at = time.time() + START_LEAD_S
        res.start_at_known = True
        ray.get([a.begin.remote(res.start_at) for a in actors])
        started(res.start_at)


def _wait_all(ray: Any, actors: list[Any], pending: list[Any], refs: dict[Any, int],
              session: RuntimeSession, stop: Callable[[], None], res: Outcomes,
              echo: Callable[[str], None]) -> None:
    """Collect every shard as it ends; at a server error or the local server's exit, stop
    the others."""
    while pending:
        stop()
        done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
        for ref in done:
            _collect(ray, ref, refs[ref], res, echo)
        exited = session.server_exited() if session.server_exited else None
        if exited is not None and res.error is None:
            res.error = ServerError(exited)
        if res.error is not None and pending:
            pending = _stop_all(ray, actors, pending, refs, res, echo)


def _collect(ray: Any, ref: Any, i: int, res: Outcomes, echo: Callable[[str], None]) -> None:
    try:
        answer = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - the actor died (RayActorError and kin)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        res.lost[i] = (int((time.time() - res.start_at) * NS), why)
        echo(f"load generator {i} lost: {why}")
        return
    res.answers[i] = answer
    if answer.get("error") and res.error is None:
        cls = ServerError if answer.get("exit_code") == ServerError.exit_code else InputError
        res.error = cls(f"load generator {i}: {answer['error']}")


def _stop_all(ray: Any, actors: list[Any], pending: list[Any], refs: dict[Any, int],
              res: Outcomes, echo: Callable[[str], None]) -> list[Any]:
    """Ask every running shard to stop, wait STOP_GRACE_S for them, and collect them."""
    for a in actors:
        with suppress(Exception):
            a.stop.remote()
    deadline = time.monotonic() + STOP_GRACE_S
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
        for ref in done:
            _collect(ray, ref, refs[ref], res, echo)
    for ref in pending:  # did not stop in time: killed on the way out, recorded lost
        res.lost[refs[ref]] = (int((time.time() - res.start_at) * NS), "did not stop in time")
    return []


def _fetch(ray: Any, actor: Any, directory: Path) -> None:
    """A shard's results from the machine it ran on, written under `directory` here."""
    files: dict[str, bytes] = ray.get(actor.files.remote(str(directory)),
                                      timeout=READY_TIMEOUT_S)
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _slots_idle(session: RuntimeSession, o: RunOptions) -> bool | None:
    """The server's slots once every shard has ended (None: it cannot say)."""
    async def ask() -> bool | None:
        async with connect(session.details.url, 1, o.timeouts, o.headers) as http:
            idle: bool | None = await session.connect(http).slots_idle()
            return idle

    try:
        return loop.run(ask())
    except Exception:  # noqa: BLE001 - an end check that fails is unknown, not an error
        return None


def _write_start(out: Path, running: RunManifest, start_at: float,
                 where: list[dict[str, Any]]) -> None:
    """OUT/run.json while the shards run: which run, where its shards write (a driver killed
    now leaves them for `harness merge`), and what `harness clean` would stop."""
    n = len(where)
    if running.ray_instance:  # its processes, now that all have started (agents, actors)
        running.ray_instance["processes"] = processes_of(running.ray_instance["tmp_dir"])
    running.start_at = start_at
    running.workers = [{"shard": f"{i}/{n}", "dir": str(shard_dir(out, Shard(i, n))), **w}
                       for i, w in enumerate(where)]
    running.write(out)


def _drop_shard_records(out: Path, workers: int) -> None:
    """The shards' record parts, once merged (their run.json files stay, as provenance)."""
    for i in range(workers):
        for sub in (RECORDS_DIR, SERVER_METRICS_DIR):
            shutil.rmtree(shard_dir(out, Shard(i, workers)) / sub, ignore_errors=True)
