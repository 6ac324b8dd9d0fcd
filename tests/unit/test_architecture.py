"""The runtime seam runs one way: the core drives the adapters, the adapters never call back
into the replay; and no module of the product grows past a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 500


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_adapters_never_import_the_replay() -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p)
                                                  if n.startswith("harness.replay"))
                 for p in (ROOT / "adapters").rglob("*.py")}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_no_module_past_the_size_limit() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for folder in ("harness", "adapters") for p in (ROOT / folder).rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}
