"""What the launchers and adapters read from model files on this machine: the vocabulary size
and the KV geometry, for the run's record and its rates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.model.geometry import from_gguf, from_hf_config


def local_vocab(folder: Any) -> int | None:
    """vocab_size from a Hugging Face model folder's config.json (None when not readable here)."""
    try:
        cfg = json.loads((Path(str(folder)) / "config.json").read_text())
        return int(cfg.get("text_config", cfg)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gguf_geometry(model: Path) -> dict[str, Any]:
    """KV geometry from a GGUF file's metadata, or {"error": ...} when it cannot be parsed."""
    try:
        return from_gguf(model).to_dict()
    except Exception as exc:  # geometry is metadata: a model we cannot parse still replays
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def hf_geometry(folder: Path) -> dict[str, Any]:
    """KV geometry from a Hugging Face model folder, or {"error": ...}."""
    try:
        return from_hf_config(folder / "config.json").to_dict()
    except InputError as exc:
        return {"error": str(exc)[:200]}


def kv_bytes_per_token(geometry: dict[str, Any]) -> float | None:
    """The KV bytes per token a geometry (or a model record) gives, None when unknown."""
    value = geometry.get("kv_bytes_per_token")
    return float(value) if value is not None else None


def model_record(model: Path, geometry: dict[str, Any]) -> dict[str, Any]:
    """run.json's `model`: the file or folder, its geometry and KV bytes per token."""
    return {"name": model.name, "path": str(model), "geometry": geometry,
            "kv_bytes_per_token": kv_bytes_per_token(geometry)}
