"""Compiles the simulator's event loop with mypyc; everything else is in pyproject.toml.

The loop (the harness.simulate modules listed in harness/simulate/native_sources.py) is plain,
typed Python that mypyc turns into C extensions about twice as fast. The extension is optional:
without a C compiler, or with HARNESS_SIMULATOR=python at install, the package installs as pure
Python and harness.simulate.native loads the sources. Next to the extension, native_build.json
records a digest of the sources it was built from, so that an edited source is never shadowed by
a stale build.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "harness" / "simulate"))
from native_sources import BUILD_RECORD, GROUP, source_paths, sources_digest  # noqa: E402


class BuildLoop(build_ext):
    """build_ext that writes native_build.json beside the extensions, once all of them built
    (an optional extension that fails to build is skipped, perhaps leaving an older one)."""

    def run(self) -> None:
        self._built: set[str] = set()
        record = Path(self.get_ext_fullpath("harness.simulate.engine")).parent / BUILD_RECORD
        record.unlink(missing_ok=True)
        super().run()
        if not self.extensions:
            return
        if self._built != {e.name for e in self.extensions}:
            print("note: the simulator's loop was not compiled; it runs as pure Python",
                  file=sys.stderr)
            return
        digest = sources_digest(ROOT / "harness" / "simulate")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"sources_sha256": digest}) + "\n")

    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)  # raises when it fails
        self._built.add(ext.name)


def extensions() -> list[Extension]:
    if os.environ.get("HARNESS_SIMULATOR") == "python":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("note: mypyc is missing; the simulator's loop stays pure Python", file=sys.stderr)
        return []
    exts = mypycify(source_paths(), group_name=GROUP, opt_level="3")
    for ext in exts:
        ext.optional = True  # no compiler: install anyway, as pure Python
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildLoop})
