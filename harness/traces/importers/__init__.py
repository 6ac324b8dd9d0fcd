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
from harness.traces.scale import scale_tokens
from harness.traces.schema import Provenance, write_trajectories
from harness.traces.validate import check_frame
from harness.userfiles import check_regular

FORMATS: dict[str, str] = {
    "atif": "harness.traces.importers.atif",
    "claude-code": "harness.traces.importers.claude_code",
    "codex": "harness.traces.importers.codex",
    "infercept": "harness.traces.importers.infercept",
    "kv-cache-tester": "harness.traces.importers.kv_cache_tester",
    "mini-swe-agent": "harness.traces.importers.mini_swe_agent",
    "mooncake": "harness.traces.importers.mooncake",
    "openai-chat": "harness.traces.importers.openai_chat",
    "otel-genai": "harness.traces.importers.otel_genai",
    "recording": "harness.traces.importers.recording",
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
        if not path.is_dir():  # a directory is the importer's to read (or refuse)
            check_regular(path)
    module = importlib.import_module(FORMATS[fmt])
    if len(paths) == 1:
        one: Imported = module.import_path(paths[0], options)
        return one
    if not hasattr(module, "import_paths"):
        raise InputError(f"{fmt} import takes one path, got {len(paths)}")
    many: Imported = module.import_paths(list(paths), options)
    return many


def import_to_file(fmt: str, paths: Sequence[Path], options: dict[str, str], out: Path,
                   token_scale: float = 1.0) -> Imported:
    """Import `paths` of format `fmt`, scale every token count by `token_scale` (recorded in
    the provenance), check the result and write it to `out`; InputError (nothing written) when
    the import is not a valid workload."""
    imported = import_traces(fmt, paths, options)
    if token_scale != 1.0:
        imported.steps = scale_tokens(imported.steps, token_scale)
        imported.provenance.extra["token_scale"] = token_scale
        imported.provenance.notes.append(
            f"every token count multiplied by {token_scale:g} and rounded up (--token-scale); "
            "an LLM step still generates at least 1 token")
    problems = check_frame(imported.steps, str(out))
    if problems:
        raise InputError("the import produced an invalid workload:\n"
                         + "\n".join(str(p) for p in problems[:20]))
    write_trajectories(imported.steps, out, imported.provenance)
    return imported
