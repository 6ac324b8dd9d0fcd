"""Token scaling: exact rounded-up counts, the format's rules kept, the scale a file carries."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.errors import InputError
from harness.traces.context import context_lengths
from harness.traces.scale import imported_token_scale, scale_tokens
from harness.traces.schema import Provenance, steps_table, write_trajectories
from harness.traces.validate import check_frame
from tests.unit.test_executor_subagents import frame_rows

DEFAULTS = {"start_s": 0.0, "priority": "interactive", "tenant": "t"}


def frame() -> pd.DataFrame:
    return steps_table(frame_rows(), DEFAULTS).to_pandas()


def test_counts_scale_and_round_up() -> None:
    out = scale_tokens(frame(), 0.1)
    assert out["input_tokens"].tolist()[:3] == [10, pd.NA, 1]
    assert out["output_tokens"].tolist()[:3] == [1, pd.NA, 1]  # 0.5 -> 1, never 0
    assert out["keep_tokens"].tolist()[2] == 7  # 6.4 -> 7
    assert out["prefix_tokens"].tolist()[0] == 4
    assert str(out["keep_tokens"].dtype) == "Int64"
    assert check_frame(out, "scaled") == []  # a cut still fits the context it finds
    lengths = context_lengths(out)
    assert lengths.prompt.tolist()[:3] == [10, 0, 8]


def test_scale_one_is_the_same_frame_and_bad_factors_are_refused() -> None:
    df = frame()
    assert scale_tokens(df, 1.0) is df
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1001.0):
        with pytest.raises(InputError, match="--token-scale"):
            scale_tokens(df, bad)


def test_the_scale_a_file_was_imported_with(tmp_path: Path) -> None:
    table = steps_table(frame_rows(), DEFAULTS)
    scaled = write_trajectories(table, tmp_path / "s.parquet",
                                Provenance("kv-cache-tester", extra={"token_scale": 0.05}))
    plain = write_trajectories(table, tmp_path / "p.parquet", Provenance("test"))
    assert imported_token_scale(scaled) == 0.05
    assert imported_token_scale(plain) == 1.0
