"""A results directory's job again: the spec its run.json records, rebuilt and checked, on the
same trace (its content hash compared with the one recorded) and the same seed.

Which run.json: DIR's own, else (a bench's root, a run's repeats) the first of its
sub-directories' that records a spec. A bench's replays each record the bench's spec, so the
rerun of a bench root, or of any of its policies' directories, runs the whole bench again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.records.manifest import RunManifest, read_manifest
from harness.records.store import RUN_JSON
from harness.specs.advise import AdviseSpec
from harness.specs.bench import BenchSpec
from harness.specs.capacity import CapacitySpec
from harness.specs.fields import Spec
from harness.specs.run import RunSpec
from harness.specs.simulate import SimSpec
from harness.traces.schema import file_sha256

SPECS: dict[str, type[Spec]] = {s.COMMAND: s for s in (
    RunSpec, SimSpec, BenchSpec, CapacitySpec, AdviseSpec)}


@dataclass(frozen=True)
class Recorded:
    """The job a results directory records: its spec as recorded, and the run.json it came
    from."""

    spec: Spec
    run_json: Path


def recorded_job(results: Path, out: Path | None = None,
                 secrets: Mapping[str, Any] | None = None) -> Recorded:
    """The job `results` records, rebuilt with its results going to `out` (default: beside
    `results`, named <name>-rerun) and the `secrets` given again (by field name: an API key,
    headers; never recorded); InputError (one line) when no run.json there records a spec, the
    trace is gone or changed, or a recorded input no longer passes its checks."""
    path, run, spec = _run_json(results)
    _check_trace(results, run)
    command, values = spec.get("command"), spec.get("values")
    spec_type = SPECS.get(str(command))
    if spec_type is None or not isinstance(values, dict):
        raise InputError(f"{path}: its spec names no job this harness runs ({command!r})")
    by_key = {f.key: f for f in spec_type.fields()}
    unknown = sorted(set(values) - set(by_key))
    if unknown:
        raise InputError(f"{path}: its spec holds inputs this harness does not know "
                         f"({', '.join(unknown)}): recorded by another version")
    given = {by_key[k].name: v for k, v in values.items()}
    given["out"] = out or results.parent / f"{results.name}-rerun"
    for name, value in (secrets or {}).items():
        if value:
            if not any(f.name == name and f.secret for f in spec_type.fields()):
                raise InputError(f"{path}: a {command} job takes no {name.replace('_', '-')}")
            given[name] = value
    labels = {by_key[k].name: f"{path}: spec {k}" for k in values}
    labels.pop("out", None)
    return Recorded(spec_type.build(given, labels), path)


def _run_json(results: Path) -> tuple[Path, RunManifest, dict[str, Any]]:
    """The run.json under `results` that records a spec: its own, else its sub-directories'
    (and theirs: a bench of repeats), in name order."""
    if not results.is_dir():
        raise InputError(f"{results}: not a results directory")
    found = [results / RUN_JSON, *sorted(results.glob(f"*/{RUN_JSON}")),
             *sorted(results.glob(f"*/*/{RUN_JSON}"))]
    for path in found:
        run = read_manifest(path.parent) if path.is_file() else None
        if run is not None and run.spec:
            return path, run, run.spec
    raise InputError(f"{results}: no run.json there records the job's spec (a library call, "
                     "or a harness older than the specs): nothing to rerun")


def _check_trace(results: Path, run: RunManifest) -> None:
    """InputError unless the recorded trace is where it was with the content it had."""
    if run.trace is None or not run.trace.sha256:
        raise InputError(f"{results}: run.json records no trace hash to check the trace against")
    trace = Path(run.trace.path)
    if not trace.is_file():
        raise InputError(f"{results}: its trace {trace} is gone; refusing to rerun")
    now = file_sha256(trace)
    if now != run.trace.sha256:
        raise InputError(f"{results}: its trace {trace} changed since the run (sha256 "
                         f"{run.trace.sha256[:12]} recorded, {now[:12]} now); refusing to rerun")
