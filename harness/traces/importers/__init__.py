"""Importers turn real public traces into the trajectory format; one small module per format.

Each module exposes `import_path(path: Path, options: dict[str, str]) -> Imported`; one that
takes several paths at once also `import_paths(paths: Sequence[Path], options) -> Imported`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.errors import InputError
from harness.traces.schema import Provenance

FORMATS: dict[str, str] = {
    "infercept": "harness.traces.importers.infercept",
    "kv-cache-tester": "harness.traces.importers.kv_cache_tester",
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
    """Import one path (a file, or a directory where the format reads one) of format `fmt`."""
    return import_traces(fmt, [path], options)


def import_traces(fmt: str, paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import several paths of format `fmt` into one workload; a format without
    `import_paths` takes exactly one."""
    if fmt not in FORMATS:
        raise InputError(f"unknown import format {fmt!r}; one of {', '.join(sorted(FORMATS))}")
    if not paths:
        raise InputError(f"{fmt} import: no path given")
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: does not exist")
    module = importlib.import_module(FORMATS[fmt])
    if len(paths) == 1:
        one: Imported = module.import_path(paths[0], options)
        return one
    if not hasattr(module, "import_paths"):
        raise InputError(f"{fmt} import takes one path, got {len(paths)}")
    many: Imported = module.import_paths(list(paths), options)
    return many
