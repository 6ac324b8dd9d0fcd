"""The selftest file (`harness selftest --out`): what was measured, where and when, and the
instrument's error; and reading it back for `harness run/bench --selftest`, which copy its
error into run.json (`instrument_error`) so results carry the error of the client that took
them.

Light on imports on purpose: the replay's command line reads these files before it starts.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.records.atomic import write_text_atomic

SELFTEST_VERSION = 1
# The figures of `instrument_error` that are error statistics ({n?, mean, p50, p95, p99}).
ERROR_KEYS = ("ttft_ms", "resume_ms", "client_lag_ms", "reference_ttft_ms")
STAT_KEYS = ("mean", "p50", "p95", "p99")
TOP_KEYS = ("selftest_version", "measured_at", "host", "agents", "stub_ttft_ms", "calls",
            "event_loop", "pinning", "instrument_error")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first 'model name' of /proc/cpuinfo; None where there is none (not Linux, ARM)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip() or None
    return None


def host_info() -> dict[str, Any]:
    """The machine measured: node name, CPU model (when known), CPU count."""
    return {"name": platform.node(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count()}


def write_selftest(path: Path, data: dict[str, Any]) -> None:
    """Write the selftest file (its parent made); InputError when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _check_stats(where: str, name: str, stats: Any) -> None:
    if not isinstance(stats, dict):
        raise InputError(f"{where}: instrument_error.{name} must be an object of "
                         f"{', '.join(STAT_KEYS)}")
    for key in STAT_KEYS:
        if key not in stats:
            raise InputError(f"{where}: instrument_error.{name} lacks {key!r}")
        if stats[key] is not None and not _number(stats[key]):
            raise InputError(f"{where}: instrument_error.{name}.{key} must be a number or "
                             f"null, got {stats[key]!r}")


def validate_selftest(data: Any, where: str) -> dict[str, Any]:
    """`data` if it is a selftest file this harness reads; else InputError naming `where` and
    the first problem."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object (a `harness selftest` file)")
    version = data.get("selftest_version")
    if version != SELFTEST_VERSION or isinstance(version, bool):
        raise InputError(f"{where}: selftest_version {version!r}; this harness reads "
                         f"{SELFTEST_VERSION} (rerun `harness selftest`)")
    missing = [k for k in TOP_KEYS if k not in data]
    if missing:
        raise InputError(f"{where}: not a complete selftest file: no {missing[0]!r}")
    if not isinstance(data["measured_at"], str) or not data["measured_at"]:
        raise InputError(f"{where}: measured_at must be a UTC ISO time string")
    agents = data["agents"]
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < 1:
        raise InputError(f"{where}: agents must be a positive integer, got {agents!r}")
    if not isinstance(data["host"], dict):
        raise InputError(f"{where}: host must be an object")
    err = data["instrument_error"]
    if not isinstance(err, dict):
        raise InputError(f"{where}: instrument_error must be an object")
    for name in ERROR_KEYS:
        if name not in err:
            raise InputError(f"{where}: instrument_error lacks {name!r}")
        _check_stats(where, name, err[name])
    if "calls_per_s" not in err or not _number(err["calls_per_s"]):
        raise InputError(f"{where}: instrument_error.calls_per_s must be a number")
    return data


def read_selftest(path: Path) -> dict[str, Any]:
    """What run.json records of a selftest file (its `instrument_error` with when, on what
    and with how many agents it was measured); InputError with one line when the file is
    missing, not JSON, of another version or incomplete."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--selftest {path}: no such file (write one with `harness "
                         "selftest`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--selftest {path}: cannot read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--selftest {path}: not valid JSON ({exc})") from None
    data = validate_selftest(data, f"--selftest {path}")
    return {**data["instrument_error"], "measured_at": data["measured_at"],
            "agents": data["agents"], "stub_ttft_ms": data["stub_ttft_ms"],
            "host": data["host"], "source": str(path)}
