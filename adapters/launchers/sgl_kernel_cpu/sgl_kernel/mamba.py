"""`sgl_kernel.mamba` stand-in: importable; every function raises NotImplementedError."""

from __future__ import annotations

from typing import Any

from . import missing


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return missing(f"sgl_kernel.mamba.{name}")
