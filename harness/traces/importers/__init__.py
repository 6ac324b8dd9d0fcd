"""Importers turn real public traces into the trajectory format; one small module per format.

Each module exposes `import_path(path: Path, options: dict[str, str]) -> Imported`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.errors import InputError
from harness.traces.schema import Provenance

FORMATS: dict[str, str] = {
    "infercept": "harness.traces.importers.infercept",
    "mini-swe-agent": "harness.traces.importers.mini_swe_agent",
    "mooncake": "harness.traces.importers.mooncake",
    "openai-chat": "harness.traces.importers.openai_chat",
}


@dataclass
class Imported:
    """An imported workload: steps in the canonical columns, provenance, and warnings to show."""

    steps: pd.DataFrame
    provenance: Provenance
    warnings: list[str] = field(default_factory=list)


def import_trace(fmt: str, path: Path, options: dict[str, str]) -> Imported:
    if fmt not in FORMATS:
        raise InputError(f"unknown import format {fmt!r}; one of {', '.join(sorted(FORMATS))}")
    if not path.exists():
        raise InputError(f"{path}: does not exist")
    module = importlib.import_module(FORMATS[fmt])
    result: Imported = module.import_path(path, options)
    return result
