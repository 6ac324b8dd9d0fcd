"""The sample traces shipped in the repository's traces/ folder (made by the generator)."""

from __future__ import annotations

from pathlib import Path

from harness.errors import InputError


def shipped_trace(name: str = "bench-small") -> Path:
    """A sample trace shipped in the repository's traces/ folder, by name."""
    repo = Path(__file__).resolve().parents[2]
    path = repo / "traces" / f"{name}.parquet"
    if not path.exists():
        raise InputError(f"shipped trace {path} not found; pass --trace FILE")
    return path
