"""The calibration file: rates measured on a live server, read by the model and the simulator.

JSON with these keys (all rates positive and finite):

    {"runtime": "llama.cpp", "server_version": "b6000", "model": "SmolLM2-135M-Instruct.Q4_1",
     "kv_bytes_per_token": 23040, "prefill_tok_s": 240.0,
     "prefill_points": [[512, 260.0], [4096, 210.0]],   # (context_len, tok_s), optional
     "decode_tok_s": 30.0, "swap_out_bytes_per_s": 5e9, "swap_in_bytes_per_s": 6e9,
     "decode_points": [[64, 30.0], [1024, 21.0]],       # (context_len, tok_s), optional
     "append_points": [[64, 90.0], [1024, 40.0]],       # (context_len, tok_s), optional
     "measured_at": "2026-11-29T21:00:00Z"}

`prefill_tok_s` is the headline rate; `prefill_points` give it by context length when measured,
and `prefill_tok_s_at` interpolates between them (clamped at both ends). `decode_points` give one
sequence's decode rate by context length; `append_points` the rate of a 32-token prompt
appended to a cached context of that length (a kept request's resume). The simulator's iteration
model (harness.model.iteration) uses them, when present, for the cost of attention in decode
steps and short prompt chunks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.arrays import FloatArray
from harness.errors import InputError
from harness.policies.base import ServerRates
from harness.records.store import write_json

CALIBRATION_VERSION = "1"
_RATE_KEYS = ("kv_bytes_per_token", "prefill_tok_s", "decode_tok_s", "swap_out_bytes_per_s",
              "swap_in_bytes_per_s")
_TEXT_KEYS = ("runtime", "server_version", "model", "measured_at")


def _positive(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: {key} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"{where}: {key} must be finite and > 0, got {value!r}")
    return v


def prefill_rate_at(points: tuple[tuple[int, float], ...], default: float,
                    context_len: FloatArray) -> FloatArray:
    """Prefill rate at each context length: linear between points, clamped; `default` if none."""
    if not points:
        return np.full(np.shape(context_len), float(default))
    xs = np.array([c for c, _ in points], dtype=float)
    ys = np.array([r for _, r in points], dtype=float)
    rates: FloatArray = np.interp(context_len, xs, ys)
    return rates


def _check_points(points: tuple[tuple[int, float], ...] | list[tuple[int, float]],
                  where: str, key: str = "prefill_points") -> None:
    last = 0
    for i, point in enumerate(points):
        if len(point) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [context_len, tok_s]")
        ctx, rate = point
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= last:
            raise InputError(f"{where}: {key}[{i}] context_len must be a positive "
                             "integer, increasing")
        _positive(rate, f"{key}[{i}] tok_s", where)
        last = ctx


def _parse_points(data: dict[str, Any], key: str, where: str) -> tuple[tuple[int, float], ...]:
    raw = data.get(key) or []
    if not isinstance(raw, list):
        raise InputError(f"{where}: {key} must be a list of [context_len, tok_s]")
    points: list[tuple[int, float]] = []
    for i, pt in enumerate(raw):
        if not isinstance(pt, list | tuple) or len(pt) != 2:
            raise InputError(f"{where}: {key}[{i}] must be [context_len, tok_s]")
        points.append((pt[0], pt[1]))
    _check_points(points, where, key)
    return tuple(points)


@dataclass(frozen=True)
class Calibration:
    """Rates measured on one server with one model (see the module docstring for the file)."""

    runtime: str
    server_version: str
    model: str
    kv_bytes_per_token: float
    prefill_tok_s: float
    decode_tok_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    measured_at: str
    prefill_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    decode_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    append_points: tuple[tuple[int, float], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.validate("calibration")

    def validate(self, where: str) -> None:
        """Raise InputError naming `where` and the key when a value is malformed."""
        for key in _TEXT_KEYS:
            if not isinstance(getattr(self, key), str):
                raise InputError(f"{where}: {key} must be a string")
        for key in _RATE_KEYS:
            _positive(getattr(self, key), key, where)
        _check_points(self.prefill_points, where)
        _check_points(self.decode_points, where, "decode_points")
        _check_points(self.append_points, where, "append_points")

    def prefill_tok_s_at(self, context_len: float) -> float:
        """Prefill tokens/s at a context length: linear between measured points, else the rate."""
        return float(prefill_rate_at(self.prefill_points, self.prefill_tok_s,
                                     np.asarray(context_len, dtype=float)))

    def rates(self) -> ServerRates:
        """The rates a pause policy prices its options with (restore uses swap-in bandwidth)."""
        return ServerRates(prefill_tok_s=self.prefill_tok_s,
                           swap_bytes_per_s=self.swap_in_bytes_per_s,
                           kv_bytes_per_token=self.kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"version": CALIBRATION_VERSION}
        for key in (*_TEXT_KEYS, *_RATE_KEYS):
            d[key] = getattr(self, key)
        d["prefill_points"] = [[c, r] for c, r in self.prefill_points]
        if self.decode_points:
            d["decode_points"] = [[c, r] for c, r in self.decode_points]
        if self.append_points:
            d["append_points"] = [[c, r] for c, r in self.append_points]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "calibration") -> Calibration:
        """Build and validate from parsed JSON; unknown keys are refused by name."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a JSON object")
        known = {"version", "prefill_points", "decode_points", "append_points", *_TEXT_KEYS,
                 *_RATE_KEYS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in (*_TEXT_KEYS, *_RATE_KEYS) if k not in data]
        if missing:
            raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
        version = str(data.get("version", CALIBRATION_VERSION))
        if version != CALIBRATION_VERSION:
            raise InputError(f"{where}: version {version!r} is not the supported "
                             f"{CALIBRATION_VERSION!r}")
        for k in _TEXT_KEYS:
            if not isinstance(data[k], str):
                raise InputError(f"{where}: {k} must be a string")
        rates = {k: _positive(data[k], k, where) for k in _RATE_KEYS}
        return cls(runtime=data["runtime"], server_version=data["server_version"],
                   model=data["model"], measured_at=data["measured_at"],
                   prefill_points=_parse_points(data, "prefill_points", where),
                   decode_points=_parse_points(data, "decode_points", where),
                   append_points=_parse_points(data, "append_points", where), **rates)


def read_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; InputError names the file and the bad key."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: calibration file does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: cannot read as JSON: {exc}") from None
    return Calibration.from_dict(data, str(p))


def write_calibration(path: str | Path, cal: Calibration) -> Path:
    """Write a calibration file atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json(p, cal.to_dict())
    return p
