"""Resolving `harness model` inputs: preset < config file < GGUF/HF config/calibration < flags.

A preset gives a geometry (and, for `seed-lab`, a workload and rates); `--config FILE.toml` holds
the same keys as the flags (underscored: `kv_heads`, `pause_s = [0.05, 5]`, `policy = [...]`);
`--gguf`/`--hf-config` give the geometry, `--calibration` the rates (and the KV bytes per token
when nothing else gives a geometry), `--trace` the pauses. An explicit flag always wins.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.model.analytical import GIB, Pauses, Rates
from harness.model.calibration import resolve_calibration
from harness.model.geometry import (
    DEFAULT_KV_DTYPE_BYTES,
    Geometry,
    from_gguf,
    from_hf_config,
    lookup_preset,
)
from harness.policies import SLOT_MODEL_POLICIES, PausePolicy, make_policy
from harness.traces.schema import KIND_TOOL
from harness.traces.stats import retained_tokens_at_pauses
from harness.traces.validate import load_trajectories

CONFIG_KEYS = {
    "preset": str, "layers": int, "kv_heads": int, "head_dim": int, "dtype_bytes": int,
    "tokens": int, "pause_s": list, "bandwidth_gib_s": float, "prefill_tok_s": float,
    "policy": list, "gguf": Path, "hf_config": Path, "trace": Path, "calibration": Path,
    "predicted_wait_s": float, "ttl_s": float, "ttl_after": str, "free_fraction": float,
    "default_deadline_s": float,
}
DEFAULT_DEADLINE_S = 30.0  # as the replay plan (harness.plan.injection)


@dataclass(frozen=True)
class ModelRequest:
    """Everything `harness model` prices: geometry, rates, pauses and the policies."""

    geometry: dict[str, Any]
    kv_bytes_per_token: float
    rates: Rates
    pauses: Pauses
    policies: dict[str, PausePolicy]
    free_fraction: float


def read_config(path: Path) -> dict[str, Any]:
    """A model config TOML: known keys only; paths relative to the file."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: config file does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: cannot read as TOML: {exc}") from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = CONFIG_KEYS.get(key)
        if kind is None:
            raise InputError(f"{path}: unknown key {key!r}; known: {', '.join(CONFIG_KEYS)}")
        if kind is Path:
            if not isinstance(value, str):
                raise InputError(f"{path}: {key} must be a path string")
            out[key] = (path.parent / value) if not Path(value).is_absolute() else Path(value)
        elif kind is list:
            out[key] = list(value) if isinstance(value, list) else [value]
        elif kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, kind) and not isinstance(value, bool):
            out[key] = value
        else:
            raise InputError(f"{path}: {key} must be {kind.__name__}, got {value!r}")
    return out


def pauses_from_trace(path: Path, default_deadline_s: float) -> Pauses:
    """Every tool step of a trajectory file as a pause (see the analytical module docstring)."""
    df = load_trajectories(path)
    tool = (df["kind"] == KIND_TOOL).to_numpy()
    retained = retained_tokens_at_pauses(df).to_numpy(dtype=np.int64)
    tid = df["trajectory_id"].astype(object).to_numpy()
    nxt_same = np.zeros(len(df), dtype=bool)
    nxt_same[:-1] = tid[1:] == tid[:-1]
    lat = df["latency_s"].to_numpy(dtype=float, na_value=np.nan)[tool]
    dl = df["deadline_s"].to_numpy(dtype=float, na_value=np.nan)[tool]
    with np.errstate(invalid="ignore"):
        returns = ~np.isnan(lat) & (np.isnan(dl) | (lat <= dl))
    ends = np.where(np.isnan(dl), default_deadline_s, dl)
    pause_s = np.where(returns, lat, ends)
    classes = [str(c) for c in df["tool_class"].astype(object).to_numpy()[tool]]
    return Pauses(retained, pause_s, returns & nxt_same[tool], classes, dl,
                  [str(t) for t in tid[tool]])


def _pick(flags: dict[str, Any], cfg: dict[str, Any], key: str) -> Any:
    v = flags.get(key)
    if v is None or (isinstance(v, tuple | list) and not v):
        return cfg.get(key)
    return v


def _geometry(flags: dict[str, Any], cfg: dict[str, Any],
              cal_bpt: float | None) -> tuple[dict[str, Any], float, Any]:
    preset = _pick(flags, cfg, "preset")
    geo, scenario = lookup_preset(preset) if preset else (None, None)
    if cfg.get("gguf") or cfg.get("hf_config"):
        geo = _read_geometry(cfg.get("gguf"), cfg.get("hf_config"))
    if flags.get("gguf") or flags.get("hf_config"):
        geo = _read_geometry(flags.get("gguf"), flags.get("hf_config"))
    dims = {k: _pick(flags, cfg, k) for k in ("layers", "kv_heads", "head_dim", "dtype_bytes")}
    given = {k: v for k, v in dims.items() if v is not None}
    if geo is None and not given and cal_bpt is not None:
        return {"name": "calibration", "source": "calibration",
                "kv_bytes_per_token": cal_bpt}, cal_bpt, scenario
    if geo is None:
        missing = [k for k in ("layers", "kv_heads", "head_dim") if k not in given]
        if missing:
            raise InputError("no geometry: give --preset, --gguf, --hf-config, --calibration or "
                             f"all of --layers --kv-heads --head-dim (missing "
                             f"{', '.join('--' + m.replace('_', '-') for m in missing)})")
        geo = Geometry(given["layers"], given["kv_heads"], given["head_dim"],
                       given.get("dtype_bytes", DEFAULT_KV_DTYPE_BYTES))
    elif given:
        values = {k: given.get(k, getattr(geo, k)) for k in dims}
        geo = Geometry(**values, name=geo.name, source=f"{geo.source} + flags")
    geo = geo.validate()
    return geo.to_dict(), float(geo.kv_bytes_per_token), scenario


def _read_geometry(gguf: Path | None, hf: Path | None) -> Geometry:
    if gguf and hf:
        raise InputError("--gguf and --hf-config both give the geometry: pass one")
    return from_gguf(gguf) if gguf else from_hf_config(hf)  # type: ignore[arg-type]


def _positive(name: str, v: Any) -> float:
    f = float(v)
    if not math.isfinite(f) or f <= 0:
        raise InputError(f"--{name.replace('_', '-')} must be finite and > 0, got {v!r}")
    return f


def build_policies(names: list[str], flags: dict[str, Any],
                   cfg: dict[str, Any]) -> dict[str, PausePolicy]:
    """The named policies (all when none), with the model's policy options applied."""
    names = names or list(SLOT_MODEL_POLICIES)
    wait, ttl_s, after = (_pick(flags, cfg, k) for k in ("predicted_wait_s", "ttl_s", "ttl_after"))
    out: dict[str, PausePolicy] = {}
    for name in names:
        args: dict[str, str] = {}
        if name in ("threshold", "min-waste") and wait is not None:
            args["default_wait_s"] = str(_positive("predicted_wait_s", wait))
        if name == "ttl":
            if ttl_s is not None:
                args["tau"] = str(_positive("ttl_s", ttl_s))
            if after is not None:
                args["after"] = str(after)
        out[name] = make_policy(name, args)
    return out


def resolve(flags: dict[str, Any]) -> ModelRequest:
    """Merge preset, config file, geometry files, calibration, trace and flags into a request."""
    cfg = read_config(flags["config"]) if flags.get("config") else {}
    cal_path = _pick(flags, cfg, "calibration")
    cal = resolve_calibration(cal_path) if cal_path else None
    geometry, bpt, scenario = _geometry(flags, cfg, cal.kv_bytes_per_token if cal else None)

    bw, prefill = _pick(flags, cfg, "bandwidth_gib_s"), _pick(flags, cfg, "prefill_tok_s")
    out_bps = in_bps = pre = None
    points: tuple[tuple[int, float], ...] = ()
    source = "flags"
    if scenario is not None:
        out_bps = in_bps = scenario.bandwidth_gib_s * GIB
        pre, source = scenario.prefill_tok_s, "preset"
    if cal is not None:
        out_bps, in_bps, pre = cal.swap_out_bytes_per_s, cal.swap_in_bytes_per_s, cal.prefill_tok_s
        points, source = cal.prefill_points, f"calibration {Path(cal_path).name}"
    if bw is not None:
        out_bps = in_bps = _positive("bandwidth_gib_s", bw) * GIB
    elif cal is not None and not cal.has_swap:
        raise InputError(f"calibration {cal_path}: {cal.engine_kind} has no swap (null swap "
                         "rates), which the model prices; give --bandwidth-gib-s")
    if prefill is not None:
        pre, points = _positive("prefill_tok_s", prefill), ()
    if out_bps is None or in_bps is None or pre is None:
        raise InputError("no rates: give --bandwidth-gib-s and --prefill-tok-s, --calibration "
                         "or a preset that has them (seed-lab)")
    rates = Rates(out_bps, in_bps, pre, points, source).validate()

    deadline = _positive("default_deadline_s",
                         _pick(flags, cfg, "default_deadline_s") or DEFAULT_DEADLINE_S)
    trace = _pick(flags, cfg, "trace")
    tokens, pause_s = flags.get("tokens"), list(flags.get("pause_s") or [])
    if trace is not None:
        if tokens is not None or pause_s:
            raise InputError("--trace gives the pauses: drop --tokens and --pause-s")
        pauses = pauses_from_trace(Path(trace), deadline)
    else:
        tokens = tokens if tokens is not None else cfg.get("tokens")
        pause_s = pause_s or list(cfg.get("pause_s") or [])
        if scenario is not None:
            tokens = tokens if tokens is not None else scenario.tokens
            pause_s = pause_s or list(scenario.pauses_s)
        if tokens is None or not pause_s:
            raise InputError("empty workload: give --tokens and --pause-s (repeatable), "
                             "--trace, or a preset with a workload (seed-lab)")
        if isinstance(tokens, bool) or int(tokens) != tokens or tokens <= 0:
            raise InputError(f"--tokens must be a positive integer, got {tokens!r}")
        try:
            values = [float(p) for p in pause_s]
        except (TypeError, ValueError):
            raise InputError(f"--pause-s values must be numbers, got {pause_s!r}") from None
        pauses = Pauses.uniform(int(tokens), values)
    pauses.validate()

    free = _pick(flags, cfg, "free_fraction")
    free = 1.0 if free is None else float(free)
    if not 0 <= free <= 1:
        raise InputError(f"--free-fraction must be in [0, 1], got {free!r}")
    names = list(flags.get("policy") or cfg.get("policy") or [])
    return ModelRequest(geometry, bpt, rates, pauses, build_policies(names, flags, cfg), free)
