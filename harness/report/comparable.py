"""Whether two runs may be compared at all, before any verdict is given.

A verdict between runs of different traces, policies, servers or machines says nothing about a
change of the harness or the server; `differences` lists each aspect in which two run.json
manifests differ, and `check_comparable` refuses (exit 2) unless every one is allowed by name.
Pure: functions of the manifests.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import InputError
from harness.records.host import host_key
from harness.records.manifest import RunManifest

# Each aspect and what it covers; the names are what --allow takes.
ASPECTS: dict[str, str] = {
    "trace": "the trace file's content (sha256)",
    "runtime": "the runtime (a simulated run's is 'simulator')",
    "server": "the server's build or version",
    "model": "the model served",
    "host": "the machine: CPU model and flags, cores, memory, GPUs",
    "policy": "the pause policy and its arguments",
    "injection": "the injection profile",
    "arrivals": "arrival mode, concurrency, rate, time scale and seed",
    "pinning": "the CPUs the harness and a local server were pinned to",
}


@dataclass(frozen=True)
class Difference:
    """One aspect in which two runs differ; a value is None where a run did not record it."""

    aspect: str
    base: str | None
    new: str | None

    @property
    def unknown(self) -> bool:
        """One side did not record this aspect (an older run.json): not checked."""
        return self.base is None or self.new is None

    def describe(self) -> str:
        return f"{self.aspect} ({self.base or 'not recorded'} vs {self.new or 'not recorded'})"


def aspect_values(run: RunManifest) -> dict[str, str | None]:
    """Each aspect of a run as one comparable string (None: not recorded)."""
    args = ",".join(f"{k}={v}" for k, v in sorted(run.policy_args.items()))
    a = run.arrivals
    pin = run.cpu_pinning
    model = run.server_model or (run.model or {}).get("name")
    return {
        "trace": run.trace.sha256[:16] if run.trace else None,
        "runtime": run.runtime,
        "server": run.server_build or run.server_version,
        "model": str(model) if model else None,
        "host": host_key(run.host),
        "policy": (f"{run.policy}({args})" if args else run.policy) if run.policy else None,
        "injection": str((run.injection or {}).get("name", "none")) if run.runtime else None,
        "arrivals": (f"{a.mode}, concurrency {a.concurrency}, rate {a.rate}, "
                     f"time scale {a.time_scale:g}, seed {run.seed}") if a else None,
        "pinning": (f"harness {pin.harness}, server {pin.server or '-'}" if pin
                    else "none") if run.runtime and run.runtime != "simulator" else None,
    }


def differences(base: RunManifest, new: RunManifest) -> list[Difference]:
    """Every aspect in which the two runs differ or that one of them did not record."""
    b, n = aspect_values(base), aspect_values(new)
    return [Difference(k, b[k], n[k]) for k in ASPECTS
            if b[k] != n[k] and not (b[k] is None and n[k] is None)]


def parse_allow(items: tuple[str, ...]) -> frozenset[str]:
    """--allow host,policy (repeatable) as aspect names; InputError for an unknown one."""
    names = {x.strip() for item in items for x in item.split(",") if x.strip()}
    unknown = sorted(names - set(ASPECTS))
    if unknown:
        raise InputError(f"--allow {unknown[0]!r}: not an aspect; one of {', '.join(ASPECTS)}")
    return frozenset(names)


def check_comparable(base: RunManifest, new: RunManifest, allow: frozenset[str],
                     what: str = "the runs") -> list[Difference]:
    """The differences that stand (allowed, or not recorded by one side); InputError in one
    line listing those that are neither."""
    diffs = differences(base, new)
    refused = [d for d in diffs if not d.unknown and d.aspect not in allow]
    if refused:
        names = ",".join(d.aspect for d in refused)
        raise InputError(f"{what} are not comparable: "
                         f"{'; '.join(d.describe() for d in refused)}; pass --allow {names} "
                         "to compare them anyway")
    return diffs
