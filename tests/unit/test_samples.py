"""The shipped samples are valid and are exactly what their documented commands generate."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.traces.generator import generate
from harness.traces.profiles import load_profile
from harness.traces.schema import COLUMNS, to_table, upgrade
from harness.traces.validate import validate_file

TRACES = Path(__file__).resolve().parents[2] / "traces"
SAMPLES = {"bench-small": (24, 22), "seed-lab": (2, 0), "coding-agent": (20, 1),
           "mixed-tools": (50, 2), "flaky-tools": (50, 3), "coding-subagents": (6, 184)}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_is_valid_and_reproducible(name: str) -> None:
    path = TRACES / f"{name}.parquet"
    assert validate_file(path) == []
    n, seed = SAMPLES[name]
    expected = generate(load_profile(name), n, seed)
    # A version-1 sample reads with version 2's columns null, as the generator leaves them.
    stored = upgrade(pq.read_table(path)).select(list(COLUMNS)).replace_schema_metadata(None)
    assert stored.equals(to_table(expected).replace_schema_metadata(None))
    assert f"--seed {seed}" in (TRACES / "README.md").read_text() or name == "seed-lab"
