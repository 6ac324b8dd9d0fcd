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
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import signals
from harness.adapters.base import RuntimeSession
from harness.adapters.http import connect
from harness.adapters.launchers.process import processes_of
from harness.adapters.runtimes import get_runtime
from harness.distributed.worker import LoadGenerator
from harness.errors import HarnessError, InputError, ServerError, Terminated
from harness.plan.planner import Plan
from harness.plan.shard import Shard, check_shardable, shard_plan
from harness.records.manifest import CpuPinning, RunManifest
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


def import_ray() -> Any:
    """The ray module; InputError naming the extra to install when it is missing."""
    try:
        import ray
    except ImportError:
        raise InputError("--workers needs Ray: install the extra, pip install "
                         "'agent-pause-harness[distributed]' (make setup does)") from None
    return ray


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

        with _fleet(ray, address, workers, ray_started) as actors:
            where = ray.get([a.where.remote() for a in actors], timeout=READY_TIMEOUT_S)
            here = ray.get_runtime_context().get_node_id()
            opts = [dataclasses.replace(
                o, url=session.details.url, shard=Shard(i, workers), start_at=None,
                run_id=run_id, out=shard_dir(o.out, Shard(i, workers)),
                pinning=_worker_pin(pin, i) if where[i]["node"] == here else None,
                server_shared=session.details.shared if where[i]["node"] == here else None)
                for i in range(workers)]
            def started(start_at: float) -> None:
                _write_start(o.out, running, start_at, where)
                hosts = ", ".join(sorted({w["host"] for w in where}))
                echo(f"{workers} load generators ({hosts}) ready; the run starts at "
                     f"{datetime.fromtimestamp(start_at, UTC):%H:%M:%S.%f} UTC")

            result = _drive(ray, actors, opts, session, echo, started)
            for i, a in enumerate(actors):  # results on another machine's disk: fetched
                if where[i]["node"] != here and i not in result.lost:
                    _fetch(ray, a, opts[i].out)
        if not all((opt.out / "run.json").is_file() for opt in opts):
            # a shard refused or was stopped before it began: nothing to merge
            RunManifest(run_id=run_id, status="interrupted", policy=o.policy,
                        runtime=o.runtime).write(o.out)
            raise result.error or result.stopped_by or ServerError(
                "a load generator ended before the run began")
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
            merged.cleanup.slots_idle = _slots_idle(session, o)
            if session.leftover_dumps is not None:
                merged.cleanup.dump_files_left = session.leftover_dumps(run_id)
        merged.write(o.out)
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


def _worker_pin(pin: CpuPinning | None, i: int) -> CpuPinning | None:
    """Load generator i's own CPU of those the harness has (one each, round robin)."""
    if pin is None:
        return None
    return CpuPinning(harness=[pin.harness[i % len(pin.harness)]], server=pin.server)


@contextmanager
def _fleet(ray: Any, address: str | None, workers: int, started: Callable[[str | None], None]
           ) -> Iterator[list[Any]]:
    """`workers` LoadGenerator actors on a local Ray instance (started here, in a private
    folder, no dashboard) or on the cluster at `address`; every actor is killed on exit, and
    the local instance stopped and its folder removed. `started` is told the local instance's
    folder (None: a cluster's) before anything of it starts."""
    temp = None if address else tempfile.mkdtemp(prefix="harness-ray-")
    started(temp)
    # ray.init installs its own SIGTERM handler (a stack dump, then exit 1): the harness's
    # are put back, so SIGTERM stops the shards cleanly as Ctrl-C does.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if address:
            ray.init(address=address, include_dashboard=False, logging_level="ERROR",
                     configure_logging=True)
        else:
            # A token of the run's own for the local instance (Ray 2.59+ authenticates local
            # clusters), in the environment its processes inherit: none is written to ~/.ray.
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
            ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False,
                     logging_level="ERROR", _temp_dir=temp)
    except Exception as exc:  # noqa: BLE001 - Ray's own errors vary by version
        with suppress(Exception):
            ray.shutdown()
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
        what = f"the Ray cluster at {address}" if address else "a local Ray instance"
        hint = (" (a cluster with token authentication needs RAY_AUTH_MODE=token and its token"
                " in RAY_AUTH_TOKEN or ~/.ray/auth_token, as on its nodes)" if address else "")
        raise ServerError(f"{what} could not be started or reached: "
                          f"{type(exc).__name__}: {exc}"[:300] + hint) from None
    # Threads: the shard's run, and the driver's wait_ready, begin and stop beside it.
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)
    actor_cls = ray.remote(num_cpus=1, max_concurrency=4, max_restarts=0)(LoadGenerator)
    actors = [actor_cls.options(scheduling_strategy="SPREAD").remote() for _ in range(workers)]
    try:
        yield actors
    finally:
        for a in actors:
            with suppress(Exception):
                ray.kill(a, no_restart=True)
        with suppress(Exception):
            ray.shutdown()
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


RAY_CONNECT_S = 5.0  # for a cluster's address to accept a connection (Ray itself waits minutes)


def check_reachable(address: str) -> None:
    """InputError unless `address` is HOST:PORT (or ray://HOST:PORT); ServerError when nothing
    accepts a connection there within RAY_CONNECT_S."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--ray-address must be HOST:PORT (or ray://HOST:PORT), got "
                         f"{address[:80]!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        raise ServerError(f"the Ray cluster at {address} cannot be reached: "
                          f"{exc.strerror or exc}") from None


def _drive(ray: Any, actors: list[Any], opts: list[RunOptions], session: RuntimeSession,
           echo: Callable[[str], None], started: Callable[[float], None]) -> Outcomes:
    """Run every shard to its end, started together once all are ready (`started` is told
    when); stop them all at the first server error, a local server's exit or a stop signal
    (the signal is kept in `stopped_by` for the caller to re-raise)."""
    refs = {a.run.remote(opt): i for i, (a, opt) in enumerate(zip(actors, opts, strict=True))}
    pending = list(refs)
    res = Outcomes(start_at=time.time())
    # Signals are noted while the driver waits in Ray, and raised between its calls.
    with signals.deferred() as stop:
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
