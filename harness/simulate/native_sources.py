"""Which modules of the simulator are compiled, and the digest that ties a build to them.

Imported by setup.py (as a plain file, before the package is installed) and by
harness.simulate.native: standard library only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# the harness.simulate modules mypyc compiles, in build order (a module imports only earlier ones)
COMPILED = ("trajectory", "block_cache", "scheduler", "client", "growth", "valve",
            "engine_state", "engine")
GROUP = "harness.simulate._loop"  # their shared library: harness/simulate/_loop__mypyc.*.so
BUILD_RECORD = "native_build.json"  # beside them: the digest of the sources they were built from


def source_paths() -> list[str]:
    """The compiled modules' sources, relative to the repository root."""
    return [f"harness/simulate/{m}.py" for m in COMPILED]


def sources_digest(package_dir: Path) -> str:
    """sha256 over the compiled modules' sources (names and bytes, in order)."""
    h = hashlib.sha256()
    for name in COMPILED:
        h.update(name.encode() + b"\0")
        h.update((package_dir / f"{name}.py").read_bytes())
    return h.hexdigest()


if __name__ == "__main__":  # for the Makefile: what to watch for a rebuild
    print(" ".join(source_paths()))
