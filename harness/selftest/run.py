"""The selftest: the harness's own error on this machine, against a server of known delays.

Starts the stub (harness.selftest.stub) in a process of its own, on a CPU other than the
harness's where two or more are allowed; times a plain reference client and then a harness
replay of a synthetic closed-loop trace on it; always stops the stub; writes the figures to a
JSON file that `harness run/bench --selftest` copy into run.json.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import __version__
from harness.errors import InputError
from harness.records.manifest import CpuPinning
from harness.replay import pinning
from harness.replay.loop import loop_name
from harness.replay.loop import run as run_loop
from harness.selftest.measure import (
    Replay,
    Stub,
    harness_replay,
    instrument_error,
    reference,
    start_stub,
    synthetic_trace,
)
from harness.selftest.result import SELFTEST_VERSION, host_info, write_selftest

OUT_TOKENS = 4  # tokens per call: enough to stream, few enough that TTFT dominates a call


@dataclass(frozen=True)
class SelftestConfig:
    """What one selftest measures and where it writes."""

    agents: int = 8
    ttft_ms: float = 50.0
    calls: int = 40  # LLM calls per agent
    tool_ms: float = 20.0  # the tool between two calls of an agent
    policy: str = "keep"
    out: Path = Path("selftest.json")
    keep_results: Path | None = None  # the replay's results directory, kept
    port: int | None = None  # the stub's port (default: a free one)


def check_config(cfg: SelftestConfig) -> None:
    """InputError for outputs that cannot be written, before anything starts."""
    if cfg.out.is_dir():
        raise InputError(f"--out {cfg.out}: is a directory; give a file name")
    k = cfg.keep_results
    if k is not None and (k.is_file() or (k.is_dir() and any(k.iterdir()))):
        raise InputError(f"--keep-results {k}: exists and is not an empty directory")


def _pinning_record(cpus: list[int], pin: CpuPinning | None, stub: Stub | None
                    ) -> dict[str, Any]:
    if pin is None:
        return {"pinned": False, "allowed_cpus": cpus, "harness_cpus": None, "stub_cpus": None,
                "note": "fewer than 2 CPUs allowed: the harness and the stub share them"}
    return {"pinned": True, "allowed_cpus": cpus, "harness_cpus": list(pin.harness),
            "stub_cpus": stub.cpus if stub else None}


def measure_error(cfg: SelftestConfig, work: Path) -> tuple[Replay, dict[str, Any]]:
    """Start the stub, time the reference loop and a harness replay on it, stop the stub
    whatever happens (an error, Ctrl-C); returns the replay and its error figures with the
    pinning they ran under. Pins this process to the harness's CPU for the run only."""
    cpus = pinning.available_cpus()
    pin = pinning.decide(cpus, True, True)
    before = os.sched_getaffinity(0) if cpus else None
    stub: Stub | None = None
    try:
        pinning.apply(pin)
        stub = start_stub(cfg.ttft_ms, pin.server if pin else None, cfg.port)
        ref_ttft, _ = run_loop(reference(stub.url, cfg.agents, cfg.calls, OUT_TOKENS,
                                         cfg.tool_ms / 1e3))
        trace = synthetic_trace(work / "trace.parquet", cfg.agents, cfg.calls,
                                cfg.tool_ms / 1e3, OUT_TOKENS)
        replay = harness_replay(stub.url, trace, cfg.agents, work, cfg.policy, pin)
    finally:
        if stub is not None:
            stub.stop()
        if before is not None:
            os.sched_setaffinity(0, before)  # a caller in the same process keeps its CPUs
    figures = instrument_error(replay, ref_ttft.ravel(), cfg.ttft_ms)
    return replay, {"pinning": _pinning_record(cpus, pin, stub), "instrument_error": figures}


def run_selftest(cfg: SelftestConfig) -> dict[str, Any]:
    """Measure and write the selftest file; returns its content."""
    check_config(cfg)
    work = cfg.keep_results or Path(tempfile.mkdtemp(prefix="harness-selftest-"))
    try:
        replay, figures = measure_error(cfg, work)
    finally:
        if cfg.keep_results is None:
            shutil.rmtree(work, ignore_errors=True)
    data = {"selftest_version": SELFTEST_VERSION,
            "measured_at": datetime.now(UTC).isoformat(), "harness_version": __version__,
            "host": host_info(), "agents": cfg.agents, "stub_ttft_ms": cfg.ttft_ms,
            "calls": cfg.calls, "tool_ms": cfg.tool_ms, "policy": cfg.policy,
            "event_loop": replay.run.event_loop or loop_name(), **figures}
    write_selftest(cfg.out, data)
    return data


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:+.2f}"


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The human summary of a selftest file's content: one line per figure."""
    err = data["instrument_error"]
    pin = data["pinning"]
    where = (f"harness on CPU {pin['harness_cpus']}, stub on CPU {pin['stub_cpus']}"
             if pin["pinned"] else "not pinned (" + pin.get("note", "") + ")")
    lines = [f"selftest: {data['agents']} agents x {data['calls']} calls, stub TTFT "
             f"{data['stub_ttft_ms']:g} ms, tools {data['tool_ms']:g} ms, policy "
             f"{data['policy']}, {data['event_loop']}", f"pinning: {where}"]
    for key, label, unit in (("ttft_ms", "TTFT error", "calls"),
                             ("resume_ms", "resume-latency error", "resumes"),
                             ("client_lag_ms", "client lag", "tool ends"),
                             ("reference_ttft_ms", "reference TTFT error", "calls")):
        s = err[key]
        lines.append(f"{label + ':':<22} mean {_ms(s['mean'])} ms, P50 {_ms(s['p50'])}, "
                     f"P95 {_ms(s['p95'])}, P99 {_ms(s['p99'])} ms ({s['n']} {unit})")
    lines.append(f"{'throughput:':<22} {err['calls_per_s']:,.1f} agent calls/s (tool pauses "
                 "included)")
    return lines
