"""Checks of a calibration file's values (harness.model.calibration): each raises InputError
naming the file (`where`) and the key when a value is malformed or outside its documented range
(harness.limits), and returns it parsed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.limits import (
    MAX_BYTES_PER_S,
    MAX_MS,
    MAX_NOISE_FACTOR,
    MAX_TOK_S,
    MAX_TOKENS,
    MIN_BYTES_PER_S,
    MIN_NOISE_FACTOR,
    MIN_TOK_S,
)


def _finite(value: Any) -> float | None:
    """`value` as a float when it is a finite JSON number (not a bool), else None; an integer
    too large for a float is not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _show(x: float) -> str:
    """A bound as a message names it: whole numbers with thousands separators."""
    return f"{int(x):,}" if x.is_integer() and abs(x) < 1e16 else f"{x:g}"


def number(value: Any, key: str, where: str, low: float, high: float,
           low_open: bool = False) -> float:
    """A finite number in [low, high] (`low_open`: above low), as a float; else InputError
    naming `where`, `key` and the range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: {key} must be a number, got {value!r}")
    v = _finite(value)
    if v is None or v > high or v < low or (low_open and v == low):
        raise InputError(f"{where}: {key} must be a finite number {'>' if low_open else '>='} "
                         f"{_show(low)} and <= {_show(high)}, got {value!r}")
    return v


def check_wake(wake_ms: Any, tau_ms: Any, where: str) -> None:
    """wake_ms (>= 0) and wake_tau_ms (> 0), both at most MAX_MS: both or neither."""
    if (wake_ms is None) != (tau_ms is None):
        raise InputError(f"{where}: wake_ms and wake_tau_ms are given together")
    if wake_ms is not None:
        number(wake_ms, "wake_ms", where, 0.0, MAX_MS)
        number(tau_ms, "wake_tau_ms", where, 0.0, MAX_MS, low_open=True)


def parse_wake_curve(value: Any, where: str) -> tuple[tuple[float, float, float], ...]:
    """wake_curve_ms: absent, or [idle_ms, server_ms, way_ms] triples of numbers at most
    MAX_MS, idle > 0 and strictly ascending, both parts >= 0 and non-decreasing."""
    if value is None:
        return ()
    why = ("a list of [idle_ms, server_ms, way_ms] triples of finite numbers, idle > 0 and "
           f"ascending, server_ms and way_ms >= 0 and non-decreasing, each <= {_show(MAX_MS)}")
    if not isinstance(value, list | tuple) or not value:
        raise InputError(f"{where}: wake_curve_ms must be {why}")
    out: list[tuple[float, float, float]] = []
    for row in value:
        parts = ([_finite(v) for v in row] if isinstance(row, list | tuple) and len(row) == 3
                 else [None])
        if any(v is None or v > MAX_MS for v in parts):
            raise InputError(f"{where}: wake_curve_ms must be {why}, got {row!r}")
        idle, server, way = (float(v or 0.0) for v in parts)
        prev = out[-1] if out else (0.0, 0.0, 0.0)
        if idle <= prev[0] or server < prev[1] or way < prev[2]:
            raise InputError(f"{where}: wake_curve_ms must be {why}, got {row!r}")
        out.append((idle, server, way))
    return tuple(out)


def parse_overhead(value: Any, where: str, key: str = "request_overhead_ms") -> float | None:
    """request_overhead_ms (or `key`): None, or milliseconds in [0, MAX_MS]."""
    return None if value is None else number(value, key, where, 0.0, MAX_MS)


def parse_samples(value: Any, where: str, key: str = "request_overhead_samples_ms"
                  ) -> tuple[float, ...]:
    """request_overhead_samples_ms (or `key`): absent, or at least 2 ascending numbers, each
    milliseconds in [0, MAX_MS] (iteration_noise_samples: factors in [MIN_NOISE_FACTOR,
    MAX_NOISE_FACTOR])."""
    if value is None:
        return ()
    if (not isinstance(value, list | tuple) or len(value) < 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise InputError(f"{where}: {key} must be a list of at least 2 numbers")
    low, high = ((MIN_NOISE_FACTOR, MAX_NOISE_FACTOR) if key == "iteration_noise_samples"
                 else (0.0, MAX_MS))
    qs = [_finite(v) for v in value]
    ok = [v for v in qs if v is not None and low <= v <= high]
    if len(ok) < len(qs) or ok != sorted(ok):
        raise InputError(f"{where}: {key} must be ascending, each a finite number >= "
                         f"{_show(low)} and <= {_show(high)}")
    return tuple(ok)


def positive_number(value: Any, key: str, where: str, high: float = MAX_TOK_S,
                    low: float = MIN_TOK_S) -> float:
    """A rate (or another positive value given its range): a finite number in [low, high]."""
    return number(value, key, where, low, high)


def parse_swap_rate(value: Any, key: str, where: str) -> float:
    """A swap rate in bytes/s (MIN_BYTES_PER_S to MAX_BYTES_PER_S), or None (the engine has no
    swap), held as 0.0."""
    return 0.0 if value is None else number(value, key, where, MIN_BYTES_PER_S, MAX_BYTES_PER_S)


def parse_count(value: Any, key: str, where: str, high: int) -> int | None:
    """None, or an integer in [1, high]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= high:
        raise InputError(f"{where}: {key} must be a positive integer <= {high:,}, got "
                         f"{value!r}")
    return value


def check_points(points: tuple[tuple[int, float], ...] | list[tuple[int, float]],
                 where: str, key: str = "prefill_points") -> None:
    """[context_len, tok_s] pairs: context lengths increasing integers in [1, MAX_TOKENS],
    rates in [MIN_TOK_S, MAX_TOK_S]."""
    last = 0
    for i, point in enumerate(points):
        if len(point) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [context_len, tok_s]")
        ctx, rate = point
        if (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= last
                or ctx > MAX_TOKENS):
            raise InputError(f"{where}: {key}[{i}] context_len must be a positive "
                             f"integer <= {MAX_TOKENS:,}, increasing")
        positive_number(rate, f"{key}[{i}] tok_s", where)
        last = ctx


def parse_points(data: dict[str, Any], key: str, where: str) -> tuple[tuple[int, float], ...]:
    """A list of [context_len, tok_s] (check_points), absent: empty."""
    raw = data.get(key) or []
    if not isinstance(raw, list):
        raise InputError(f"{where}: {key} must be a list of [context_len, tok_s]")
    points: list[tuple[int, float]] = []
    for i, pt in enumerate(raw):
        if not isinstance(pt, list | tuple) or len(pt) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [context_len, tok_s]")
        points.append((pt[0], pt[1]))
    check_points(points, where, key)
    return tuple(points)


PROVENANCE_STATUSES = ("measured", "published", "declared")
MAX_SOURCE_CHARS = 4000


def _check_entry(field: Any, status: Any, source: Any, where: str) -> None:
    if status not in PROVENANCE_STATUSES:
        raise InputError(f"{where}: provenance.{field}.status must be one of "
                         f"{', '.join(PROVENANCE_STATUSES)}, got {str(status)[:40]!r}")
    if not isinstance(source, str) or not source.strip() or len(source) > MAX_SOURCE_CHARS:
        raise InputError(f"{where}: provenance.{field}.source must be a non-empty string of at "
                         f"most {MAX_SOURCE_CHARS} characters")


def parse_provenance(value: Any, fields: set[str], where: str
                     ) -> tuple[tuple[str, str, str], ...]:
    """A calibration's `provenance` (absent: none): an object from each of `fields` it covers
    to {"status": measured | published | declared, "source": text}, as (field, status, source)
    in file order; InputError naming the field otherwise."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError(f"{where}: provenance must be an object of fields")
    out = []
    for field, entry in value.items():
        if field not in fields or field in ("version", "provenance", "declared"):
            raise InputError(f"{where}: provenance names {str(field)[:60]!r}, not a "
                             "calibration field")
        if not isinstance(entry, dict) or set(entry) != {"status", "source"}:
            raise InputError(f"{where}: provenance.{field} must be an object with exactly "
                             "status and source")
        _check_entry(field, entry["status"], entry["source"], where)
        out.append((str(field), str(entry["status"]), str(entry["source"])))
    return tuple(out)


def check_provenance(entries: tuple[tuple[str, str, str], ...], where: str) -> None:
    """The same checks on an in-memory calibration's (field, status, source) entries."""
    for field, status, source in entries:
        _check_entry(field, status, source, where)


def overhead_samples(samples: list[float]) -> tuple[float, ...]:
    """Overhead samples as a calibration keeps them: ms, >= 0, ascending, to the microsecond;
    empty with fewer than 2."""
    if len(samples) < 2:
        return ()
    return tuple(sorted(round(max(float(v), 0.0), 3) for v in samples))


def noise_from(times: list[float]) -> tuple[float, ...]:
    """Noise samples as a calibration keeps them: each of the same measurement's times over
    their median, ascending, to 1e-4; empty with fewer than 2 (or a median of 0)."""
    mid = float(np.median(times)) if len(times) >= 2 else 0.0
    if mid <= 0:
        return ()
    return tuple(sorted(round(float(t) / mid, 4) for t in times))
