"""Checks of a calibration file's values (harness.model.calibration): each raises InputError
naming the file (`where`) and the key when a value is malformed, and returns it parsed."""

from __future__ import annotations

import math
from typing import Any

from harness.errors import InputError


def check_wake(wake_ms: Any, tau_ms: Any, where: str) -> None:
    """wake_ms (finite, >= 0) and wake_tau_ms (finite, > 0): both or neither."""
    if (wake_ms is None) != (tau_ms is None):
        raise InputError(f"{where}: wake_ms and wake_tau_ms are given together")
    for key, v, low in (("wake_ms", wake_ms, 0.0), ("wake_tau_ms", tau_ms, 1e-9)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not math.isfinite(v) or v < low):
            raise InputError(f"{where}: {key} must be a finite number "
                             f"{'>= 0' if low == 0 else '> 0'}, got {v!r}")


def parse_wake_curve(value: Any, where: str) -> tuple[tuple[float, float, float], ...]:
    """wake_curve_ms: absent, or [idle_ms, server_ms, way_ms] triples of finite numbers, idle
    > 0 and strictly ascending, both parts >= 0 and non-decreasing."""
    if value is None:
        return ()
    why = ("a list of [idle_ms, server_ms, way_ms] triples of finite numbers, idle > 0 and "
           "ascending, server_ms and way_ms >= 0 and non-decreasing")
    if not isinstance(value, list | tuple) or not value:
        raise InputError(f"{where}: wake_curve_ms must be {why}")
    out: list[tuple[float, float, float]] = []
    for row in value:
        if (not isinstance(row, list | tuple) or len(row) != 3
                or not all(isinstance(v, int | float) and not isinstance(v, bool)
                           and math.isfinite(v) for v in row)):
            raise InputError(f"{where}: wake_curve_ms must be {why}, got {row!r}")
        idle, server, way = (float(v) for v in row)
        prev = out[-1] if out else (0.0, 0.0, 0.0)
        if idle <= prev[0] or server < prev[1] or way < prev[2]:
            raise InputError(f"{where}: wake_curve_ms must be {why}, got {row!r}")
        out.append((idle, server, way))
    return tuple(out)


def parse_overhead(value: Any, where: str, key: str = "request_overhead_ms") -> float | None:
    """request_overhead_ms (or `key`): None, or a finite number >= 0."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise InputError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return float(value)


def parse_samples(value: Any, where: str, key: str = "request_overhead_samples_ms"
             ) -> tuple[float, ...]:
    """request_overhead_samples_ms (or `key`): absent, or at least 2 finite ascending numbers
    >= 0."""
    if value is None:
        return ()
    if (not isinstance(value, list) or len(value) < 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise InputError(f"{where}: {key} must be a list of at least 2 numbers")
    qs = tuple(float(v) for v in value)
    if not all(math.isfinite(v) and v >= 0 for v in qs) or list(qs) != sorted(qs):
        raise InputError(f"{where}: {key} must be finite, >= 0 and ascending")
    return qs


def positive_number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: {key} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"{where}: {key} must be finite and > 0, got {value!r}")
    return v


def parse_swap_rate(value: Any, key: str, where: str) -> float:
    """A swap rate: positive, or None (the engine has no swap), held as 0.0."""
    return 0.0 if value is None else positive_number(value, key, where)


def parse_count(value: Any, key: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def check_points(points: tuple[tuple[int, float], ...] | list[tuple[int, float]],
                  where: str, key: str = "prefill_points") -> None:
    last = 0
    for i, point in enumerate(points):
        if len(point) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [context_len, tok_s]")
        ctx, rate = point
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= last:
            raise InputError(f"{where}: {key}[{i}] context_len must be a positive "
                             "integer, increasing")
        positive_number(rate, f"{key}[{i}] tok_s", where)
        last = ctx


def parse_points(data: dict[str, Any], key: str, where: str) -> tuple[tuple[int, float], ...]:
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
