"""What every importer is: a function from paths and options to an `Imported` workload.

Each format module declares one `Format` (its name, its import function, whether it takes
several paths); `harness.traces.importers.FORMATS` lists them, so the call from the command
to a format's reader is a typed one that mypy follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from harness.traces.schema import Provenance


@dataclass
class Imported:
    """An imported workload: steps in the canonical columns, provenance, and warnings to show."""

    steps: pd.DataFrame
    provenance: Provenance
    warnings: list[str] = field(default_factory=list)


class ImportPaths(Protocol):
    """A format's reader: every path (file or directory) of one import, and its options."""

    def __call__(self, paths: Sequence[Path], options: dict[str, str], /) -> Imported: ...


class ImportPath(Protocol):
    """A reader of one path (file or directory) and its options."""

    def __call__(self, path: Path, options: dict[str, str], /) -> Imported: ...


@dataclass(frozen=True)
class Format:
    """One import format: `many` when it reads several paths into one workload (else one)."""

    name: str
    read: ImportPaths
    many: bool


def one_path(fn: ImportPath) -> ImportPaths:
    """The reader of a format that takes exactly one path (the registry checks the count)."""

    def read(paths: Sequence[Path], options: dict[str, str], /) -> Imported:
        (path,) = paths
        return fn(path, options)

    return read
