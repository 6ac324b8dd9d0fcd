"""Chooses between the compiled event loop and its pure-Python sources, before either loads.

setup.py compiles the event loop's modules (native_sources.COMPILED) with mypyc when it can; an
extension module shadows its .py file on import. That is right only while the sources are those
the extension was built from, so `select` (run by the package's __init__, importing nothing)
points the import system at the sources instead when the build is stale (an edited source, or no
record of the build) or when HARNESS_SIMULATOR=python asks for it. `ENGINE` says which one runs; the
run's run.json records it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from harness.simulate.native_sources import BUILD_RECORD, COMPILED, sources_digest

PACKAGE = "harness.simulate"
COMPILED_ENGINE = "compiled (mypyc)"
ENGINE = "python"  # COMPILED_ENGINE, or "python (why)"; set by `select`


def compiled_files(package_dir: Path) -> list[Path]:
    """The extension file this interpreter would import for each compiled module that has one."""
    found = []
    for m in COMPILED:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # in the import system's order
            if (package_dir / f"{m}{suffix}").exists():
                found.append(package_dir / f"{m}{suffix}")
                break
    return found


def python_reason(package_dir: Path, wanted: str | None) -> str | None:
    """Why the sources must run instead of the compiled loop (None: the compiled one runs).
    `wanted`: the value of HARNESS_SIMULATOR (auto or python)."""
    if wanted not in (None, "", "auto", "python"):
        raise ValueError(f"HARNESS_SIMULATOR must be auto or python, got {wanted!r}")
    if wanted == "python":
        return "HARNESS_SIMULATOR=python"
    found = compiled_files(package_dir)
    if not found:
        return "not compiled: no C compiler or mypyc at install"
    if len(found) != len(COMPILED):
        return "incomplete build: some compiled modules are missing; reinstall (make setup)"
    try:
        recorded = json.loads((package_dir / BUILD_RECORD).read_text())["sources_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"stale build: no readable {BUILD_RECORD}; reinstall (make setup)"
    if recorded != sources_digest(package_dir):
        return "stale build: its sources changed since; reinstall (make setup)"
    return None


class SourceFinder:
    """A meta path finder that imports the compiled modules from their .py files."""

    def __init__(self, package_dir: Path) -> None:
        self.sources = {f"{PACKAGE}.{m}": package_dir / f"{m}.py" for m in COMPILED}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname,
                                                                                  source)


def select() -> str:
    """Decide which loop runs (before it is imported); returns ENGINE."""
    global ENGINE
    package_dir = Path(__file__).resolve().parent
    reason = python_reason(package_dir, os.environ.get("HARNESS_SIMULATOR"))
    if reason is None:
        ENGINE = COMPILED_ENGINE
        return ENGINE
    if compiled_files(package_dir) and not any(isinstance(f, SourceFinder)
                                               for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(package_dir))
    ENGINE = f"python ({reason})"
    return ENGINE
