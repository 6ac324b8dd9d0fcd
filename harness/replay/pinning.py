"""CPU pinning: the harness on one core, a local server on the others, decided once.

On a machine of two or more cores the load generator and a local server would otherwise share a
core, and the server's latency would carry the harness's own work. The decision is made once
(per `harness run`, and once per `harness bench` for all of its policies alike) from the CPUs the
process may use when it starts, so every policy's server gets the same CPUs, and it is recorded
in each run.json.
"""

from __future__ import annotations

import os

from harness.records.manifest import CpuPinning


def available_cpus() -> list[int]:
    """The CPUs this process may run on ([] where the platform does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def decide(cpus: list[int], local_server: bool, server_pinnable: bool,
           load_generators: int = 1) -> CpuPinning | None:
    """The first CPU for the harness and the rest for a local server, on 2+ CPUs; None when
    there is no local server, it cannot be pinned, or there is one CPU only. Several load
    generators get one CPU each while at least one is left for the server. Pure."""
    if not local_server or not server_pinnable or len(cpus) < 2:
        return None
    k = max(1, min(load_generators, len(cpus) - 1))
    return CpuPinning(harness=cpus[:k], server=",".join(str(c) for c in cpus[k:]))


def apply(pinning: CpuPinning | None) -> None:
    """Pin this process to the harness's CPUs (idempotent; nothing when None)."""
    if pinning is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(pinning.harness))
