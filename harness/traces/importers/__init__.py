"""Importers turn real public traces into the trajectory format; one small module per format.

Each format module declares its `Format` as IMPORTER (base.py): its name, its reader of the
import's paths and options, and whether it takes several paths. FORMATS is their registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.errors import InputError
from harness.traces.importers import (
    atif,
    claude_code,
    codex,
    infercept,
    kv_cache_tester,
    mini_swe_agent,
    mooncake,
    openai_chat,
    otel_genai,
    recording,
)
from harness.traces.importers._common import ERROR_CHARS, clip_error
from harness.traces.importers.base import Format, Imported
from harness.traces.scale import scale_tokens
from harness.traces.schema import write_trajectories
from harness.traces.validate import check_frame
from harness.userfiles import check_regular, real_path

FORMATS: dict[str, Format] = {f.name: f for f in (
    atif.IMPORTER, claude_code.IMPORTER, codex.IMPORTER, infercept.IMPORTER,
    kv_cache_tester.IMPORTER, mini_swe_agent.IMPORTER, mooncake.IMPORTER, openai_chat.IMPORTER,
    otel_genai.IMPORTER, recording.IMPORTER)}

__all__ = ["FORMATS", "Format", "Imported", "import_to_file", "import_trace", "import_traces"]


def import_trace(fmt: str, path: Path, options: dict[str, str]) -> Imported:
    """Import one path (a file, or a directory where the format reads one) of format `fmt`."""
    return import_traces(fmt, [path], options)


def import_traces(fmt: str, paths: Sequence[Path], options: dict[str, str]) -> Imported:
    """Import several paths of format `fmt` into one workload; a format that is not `many`
    takes exactly one."""
    if fmt not in FORMATS:
        raise InputError(f"unknown import format {fmt!r}; one of {', '.join(sorted(FORMATS))}")
    if not paths:
        raise InputError(f"{fmt} import: no path given")
    for path in paths:
        if not path.exists():
            if path.is_symlink():  # a link that leads nowhere, or back to itself
                real_path(path)
                raise InputError(f"{path}: symbolic link to nothing")
            raise InputError(f"{path}: does not exist")
        if not path.is_dir():  # a directory is the importer's to read (or refuse)
            check_regular(path)
    importer = FORMATS[fmt]
    if len(paths) > 1 and not importer.many:
        raise InputError(f"{fmt} import takes one path, got {len(paths)}")
    try:
        return importer.read(list(paths), options)
    except InputError as exc:  # one readable line, however deep the place it names
        if len(str(exc)) <= ERROR_CHARS:
            raise
        raise InputError(clip_error(str(exc))) from None


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
