"""The layers of the product, checked on its imports (those inside functions and under
TYPE_CHECKING included, so no arrow can hide from the check):

- commands on top (harness.commands and the root `cli`), then the studies that combine runs
  (bench, capacity, advise, calibrate, distributed, selftest), then replay and simulate, then
  the runtimes (adapters), then plan, records, metrics, report and model, then traces and
  policies, and the foundation (errors, limits, ...) at the bottom: a package imports its own
  layer or lower, never higher;
- outside adapters/, a runtime is reached only through the adapter seam (the Protocol, the
  registry, the shared HTTP client, process handling), never a runtime's own module;
- no import cycle between modules but the simulator's type-only one, listed by name, and none
  between packages at all;
- click only under harness/commands/ and the root cli;
- few imports of project modules inside functions (each one an arrow the reader cannot see);
- no module past a readable size, and no function taking more than eight parameters.

Each check is a function of the sources, so a planted violation shows that it bites.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LOCAL_IMPORTS = 25
# A function or constructor taking more than this many parameters (self and cls not counted)
# wants a typed value that names what travels together.
MAX_PARAMETERS = 8
# The exceptions, each with its reason: functions of the simulator's compiled event loop may
# pass scalars where a grouping value would cost an attribute load per event (none does today).
WIDE_FUNCTIONS: dict[str, str] = {}

# Higher imports lower or equal, never higher.
LAYERS: dict[str, int] = {
    "commands": 7, "cli": 7, "__main__": 7, "entry": 7,
    "bench": 6, "capacity": 6, "advise": 6, "calibrate": 6, "distributed": 6, "selftest": 6,
    "specs": 6,
    "replay": 5, "simulate": 5,
    "adapters": 4,
    "plan": 3, "records": 3, "metrics": 3, "report": 3, "model": 3,
    "traces": 2, "policies": 2, "proxy": 2,
    "": 1, "errors": 1, "limits": 1, "arrays": 1, "tomlfiles": 1, "signals": 1, "userfiles": 1,
    "jsontypes": 1,
}
# The adapter seam: what the core may import of harness.adapters.
ADAPTER_SEAM = frozenset({"harness.adapters.base", "harness.adapters.http",
                          "harness.adapters.runtimes", "harness.adapters.launchers.process"})
# The one cycle allowed: the simulator's engine, its state, its scheduler and a fleet of
# engines name each other's types, under TYPE_CHECKING only.
ALLOWED_CYCLES = [frozenset({"harness.simulate.engine", "harness.simulate.engine_state",
                             "harness.simulate.fleet", "harness.simulate.scheduler",
                             "harness.simulate.client", "harness.simulate.growth",
                             "harness.simulate.valve"})]
CLICK_ALLOWED = ("harness.commands", "harness.cli")


@dataclass(frozen=True)
class Import:
    """One import statement's target in a module of the product."""

    module: str  # the importing module
    target: str  # the imported module (a name imported from a module counts as that module)
    local: bool  # inside a function
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(rel: Path) -> str:
    """harness/replay/run.py -> harness.replay.run; adapters/x.py -> harness.adapters.x."""
    parts = list(rel.with_suffix("").parts)
    if parts[0] == "adapters":
        parts = ["harness", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def product_sources(root: Path = ROOT) -> dict[str, str]:
    """Every module of the product by name, with its source."""
    return dict(_read_sources(root))


@functools.cache
def _read_sources(root: Path) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((module_name(p.relative_to(root)), p.read_text())
                        for folder in ("harness", "adapters")
                        for p in (root / folder).rglob("*.py")))


def _walk(node: ast.AST, local: bool, type_only: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, local, type_only
        inner_local = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        inner_type = type_only or (isinstance(child, ast.If)
                                   and "TYPE_CHECKING" in ast.unparse(child.test))
        yield from _walk(child, inner_local, inner_type)


@functools.cache
def _statements(text: str) -> tuple[tuple[str | None, tuple[str, ...], bool, bool], ...]:
    """A source's import statements: (module of a `from` import or None, names, local,
    type_only)."""
    out = []
    for node, local, type_only in _walk(ast.parse(text), False, False):
        if isinstance(node, ast.Import):
            out.append((None, tuple(a.name for a in node.names), local, type_only))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, tuple(a.name for a in node.names), local, type_only))
    return tuple(out)


def imports(sources: dict[str, str]) -> list[Import]:
    """Every import in `sources` (third-party ones too), resolved to the module imported."""
    found = []
    for module, text in sources.items():
        for source, names, local, type_only in _statements(text):
            # `from harness.x import y`: y is a module of harness.x, or a name in it
            targets = list(names) if source is None else list(dict.fromkeys(
                f"{source}.{n}" if f"{source}.{n}" in sources else source for n in names))
            found += [Import(module, t, local, type_only) for t in targets]
    return found


def package(module: str) -> str:
    """The layer key of a module: harness.replay.run -> replay, harness.cli -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(sources: dict[str, str]) -> list[str]:
    """Imports of a higher layer, and packages missing from the layer table."""
    out = []
    for i in imports(sources):
        if not i.target.startswith("harness"):
            continue
        a, b = package(i.module), package(i.target)
        for p in (a, b):
            if p not in LAYERS:
                out.append(f"{i.module}: package {p!r} is in no layer")
        if a in LAYERS and b in LAYERS and LAYERS[b] > LAYERS[a]:
            out.append(f"{i.module} imports {i.target} ({b} is above {a})")
    return sorted(set(out))


def seam_violations(sources: dict[str, str]) -> list[str]:
    """Modules outside adapters/ that import a runtime's own module."""
    return sorted({f"{i.module} imports {i.target}" for i in imports(sources)
                   if i.target.startswith("harness.adapters")
                   and not i.module.startswith("harness.adapters")
                   and i.target not in ADAPTER_SEAM})


def cycles(sources: dict[str, str], with_type_only: bool = True) -> list[frozenset[str]]:
    """The module-level import cycles (strongly connected sets of two or more modules)."""
    edges: dict[str, set[str]] = {m: set() for m in sources}
    for i in imports(sources):
        if i.target in sources and i.target != i.module and (with_type_only or not i.type_only):
            edges[i.module].add(i.target)
    return _strongly_connected(edges)


def package_cycles(sources: dict[str, str]) -> list[frozenset[str]]:
    """The import cycles between packages (harness.traces, harness.proxy, ...): a package that
    imports another which, through any of its modules, imports it back. Type-only imports
    count too: they are arrows a reader follows."""
    edges: dict[str, set[str]] = {package(m): set() for m in sources}
    for i in imports(sources):
        if i.target in sources and package(i.target) != package(i.module):
            edges[package(i.module)].add(package(i.target))
    return _strongly_connected(edges)


def _strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of two or more nodes of a directed graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(frozenset(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def wide_functions(sources: dict[str, str]) -> list[str]:
    """Functions and methods with more than MAX_PARAMETERS parameters (self and cls, *args and
    **kwargs not counted), as module:qualified.name (N), less the WIDE_FUNCTIONS."""
    out = []
    for module, text in sources.items():
        for name, n in _parameter_counts(ast.parse(text)):
            key = f"{module}:{name}"
            if n > MAX_PARAMETERS and key not in WIDE_FUNCTIONS:
                out.append(f"{key} ({n})")
    return sorted(out)


def _parameter_counts(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _parameter_counts(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            if names[:1] in (["self"], ["cls"]):
                names = names[1:]
            yield f"{prefix}{node.name}", len(names)
            yield from _parameter_counts(node, f"{prefix}{node.name}.")


def click_violations(sources: dict[str, str]) -> list[str]:
    return sorted({i.module for i in imports(sources)
                   if i.target.split(".")[0] == "click"
                   and not i.module.startswith(CLICK_ALLOWED)})


def function_local_imports(sources: dict[str, str]) -> list[Import]:
    return [i for i in imports(sources) if i.local and i.target.startswith("harness")]


# The product as it is.

def test_no_import_of_a_higher_layer() -> None:
    assert layer_violations(product_sources()) == []


def test_runtimes_only_through_the_adapter_seam() -> None:
    assert seam_violations(product_sources()) == []


def test_no_import_cycle_but_the_simulators_type_only_one() -> None:
    sources = product_sources()
    assert sorted(map(sorted, cycles(sources))) == sorted(map(sorted, ALLOWED_CYCLES))
    assert cycles(sources, with_type_only=False) == []


def test_no_import_cycle_between_packages() -> None:
    assert package_cycles(product_sources()) == []


def test_click_only_in_the_commands() -> None:
    assert click_violations(product_sources()) == []


def test_no_function_takes_more_than_eight_parameters() -> None:
    assert wide_functions(product_sources()) == []


def test_every_wide_function_allowed_still_exists_and_is_wide() -> None:
    counts = {f"{m}:{name}": n for m, text in product_sources().items()
              for name, n in _parameter_counts(ast.parse(text))}
    assert {k: counts.get(k) for k in WIDE_FUNCTIONS
            if counts.get(k, 0) <= MAX_PARAMETERS} == {}


def test_few_function_local_imports_of_project_modules() -> None:
    local = function_local_imports(product_sources())
    assert len(local) <= MAX_FUNCTION_LOCAL_IMPORTS, [f"{i.module} -> {i.target}" for i in local]


def test_adapters_never_import_the_replay() -> None:
    offenders = [i for i in imports(product_sources())
                 if i.module.startswith("harness.adapters")
                 and i.target.startswith("harness.replay")]
    assert offenders == []


def test_no_module_past_the_size_limit() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for folder in ("harness", "adapters") for p in (ROOT / folder).rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}


# Planted violations: each check catches what it is for.

def _planted(**modules: str) -> dict[str, str]:
    return {**product_sources(), **modules}


def test_a_planted_upward_import_inside_a_function_is_caught() -> None:
    src = _planted(**{"harness.traces.planted": "def f():\n    from harness.replay.run "
                                                "import execute_run\n    return execute_run\n"})
    assert layer_violations(src) == [
        "harness.traces.planted imports harness.replay.run (replay is above traces)"]


def test_a_planted_package_outside_the_table_is_caught() -> None:
    src = _planted(**{"harness.newstage.x": "from harness.errors import InputError\n"})
    assert layer_violations(src) == ["harness.newstage.x: package 'newstage' is in no layer"]


def test_a_planted_runtime_import_is_caught() -> None:
    src = _planted(**{"harness.replay.planted": "from harness.adapters.vllm import VllmAdapter\n"})
    assert seam_violations(src) == ["harness.replay.planted imports harness.adapters.vllm"]


def test_a_planted_cycle_is_caught_even_inside_functions() -> None:
    src = _planted(**{"harness.plan.planted_a": "from harness.plan import planted_b\n",
                      "harness.plan.planted_b": "def f():\n    import harness.plan.planted_a\n"})
    assert frozenset({"harness.plan.planted_a", "harness.plan.planted_b"}) in cycles(src)


def test_a_planted_cycle_between_packages_is_caught() -> None:
    src = _planted(**{"harness.traces.planted": "from harness.proxy import events\n"},
                   **{"harness.proxy.planted": "def f():\n    import harness.traces.schema\n"})
    assert package_cycles(src) == [frozenset({"traces", "proxy"})]


def test_a_planted_wide_function_is_caught() -> None:
    src = _planted(**{"harness.plan.planted": "class A:\n    def f(self, a, b, c, d, e, f, g, h, "
                                              "i, *rest, **kw):\n        pass\n"})
    assert [w for w in wide_functions(src) if w.startswith("harness.plan.planted")] == [
        "harness.plan.planted:A.f (9)"]


def test_a_planted_click_import_is_caught() -> None:
    src = _planted(**{"harness.replay.planted": "import click\n"})
    assert click_violations(src) == ["harness.replay.planted"]


def test_planted_function_local_imports_are_counted() -> None:
    body = "".join(f"def f{k}():\n    from harness.errors import InputError\n"
                   for k in range(MAX_FUNCTION_LOCAL_IMPORTS + 1))
    local = function_local_imports(_planted(**{"harness.plan.planted": body}))
    assert len(local) > MAX_FUNCTION_LOCAL_IMPORTS
