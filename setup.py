"""Compiles the simulator's event loop with mypyc; everything else is in pyproject.toml.

The loop (harness.simulate.scheduler and harness.simulate.engine) is plain, typed Python that
mypyc turns into a C extension about twice as fast. The extension is optional: without a C
compiler, or with HARNESS_SIMULATOR=python at install, the package installs as pure Python and
harness.simulate.native loads the sources. Next to the extension, native_build.json records a
digest of the sources it was built from, so that an edited source is never shadowed by a stale
build.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "harness" / "simulate"))
from native_sources import COMPILED, GROUP, sources_digest  # noqa: E402


class BuildLoop(build_ext):
    """build_ext that writes native_build.json beside the extensions it built."""

    def run(self) -> None:
        super().run()
        built = [e for e in self.extensions if Path(self.get_ext_fullpath(e.name)).exists()]
        if len(built) != len(self.extensions):
            print("note: the simulator's loop was not compiled; it runs as pure Python",
                  file=sys.stderr)
            return
        target = Path(self.get_ext_fullpath(f"{GROUP.rsplit('.', 1)[0]}.x")).parent
        digest = sources_digest(ROOT / "harness" / "simulate")
        (target / "native_build.json").write_text(json.dumps({"sources_sha256": digest}) + "\n")


def extensions() -> list:
    if os.environ.get("HARNESS_SIMULATOR") == "python":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("note: mypyc is missing; the simulator's loop stays pure Python", file=sys.stderr)
        return []
    exts = mypycify([f"harness/simulate/{m}.py" for m in COMPILED], group_name=GROUP,
                    opt_level="3")
    for ext in exts:
        ext.optional = True  # no compiler: install anyway, as pure Python
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildLoop})
