"""Fuzzing an importer's input, shared by the importers' tests: random edits of a small valid
JSON document, and the rule every edited input must meet (it imports into a valid workload, or
is refused in one line)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from harness.errors import InputError
from harness.traces.importers import import_trace
from harness.traces.validate import check_frame

# Deterministic in CI; HARNESS_FUZZ_EXAMPLES=5000 HARNESS_FUZZ_RANDOM=1 searches deeper.
FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "100")), deadline=None,
    derandomize=not os.environ.get("HARNESS_FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# A small JSON value put where an importer expects something else.
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**64) | st.floats()
                    | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=5)


def spots(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document, as the keys leading to it."""
    if isinstance(doc, list):
        doc = dict(enumerate(doc))
    if not isinstance(doc, dict):
        return [at]
    return [at] + [s for k, v in doc.items() for s in spots(v, (*at, k))]


def mutate(doc: Any, data: st.DataObject, most: int = 3) -> Any:
    """`doc` (changed in place) with one to `most` places replaced by random JSON or deleted."""
    for _ in range(data.draw(st.integers(1, most))):
        spot = data.draw(st.sampled_from(spots(doc)))
        if not spot:
            continue
        parent = doc
        for k in spot[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()):
            parent[spot[-1]] = data.draw(JSON)
        else:
            del parent[spot[-1]]
    return doc


def imports_or_is_one_line(fmt: str, path: Path) -> None:
    """Importing `path` as `fmt` gives a valid workload or an InputError of one line."""
    try:
        imp = import_trace(fmt, path, {})
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert check_frame(imp.steps, "imported") == []
