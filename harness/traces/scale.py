"""Token scaling: a trace's contexts shrunk (or grown) by one factor, so that a session recorded
on a 200k-context model replays on a small local one with the same shape.

Every token count is multiplied by the factor and rounded up (an LLM call still appends at
least what it appended, scaled; it still generates at least one token). Rounding up keeps the
rules of the format: a call that kept no more than its context held still does, because
ceil(a F) <= ceil(b F) + ceil(c F) whenever a <= b + c.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.traces.schema import KIND_LLM, read_provenance

SCALED_COLUMNS = ("input_tokens", "output_tokens", "keep_tokens", "prefix_tokens")


def check_token_scale(factor: float) -> float:
    """The factor, or InputError unless it is a finite number in (0, 1000]."""
    if not (math.isfinite(factor) and 0 < factor <= 1000):
        raise InputError(f"--token-scale must be a number > 0 and <= 1000, got {factor:g}")
    return factor


def scale_tokens(df: pd.DataFrame, factor: float) -> pd.DataFrame:
    """A copy of `df` with every token count times `factor`, rounded up; output tokens of an
    LLM step at least 1. factor 1 returns `df` itself."""
    check_token_scale(factor)
    if factor == 1.0:
        return df
    out = df.copy()
    for col in SCALED_COLUMNS:
        if col not in out.columns:
            continue
        raw = out[col].to_numpy(dtype="float64", na_value=np.nan)
        # A tiny epsilon first: 0.1 * 30 is 3.0000000000000004 in floats, which must stay 3.
        scaled = np.ceil(raw * factor - 1e-9)
        if col == "output_tokens":
            is_llm = (out["kind"].astype(object) == KIND_LLM).to_numpy()
            scaled = np.where(is_llm & ~np.isnan(scaled), np.maximum(scaled, 1), scaled)
        series = pd.Series(scaled, index=out.index)
        out[col] = (series.astype("Int32") if str(out[col].dtype) == "Int32"
                    else series.astype("Int64"))
    return out


def imported_token_scale(trace: Path) -> float:
    """The token scale a trace file was imported with (its provenance's `token_scale`), 1 when
    none: a run records this times its own --token-scale, the whole way from the source."""
    prov = read_provenance(trace)
    value = prov.extra.get("token_scale", 1.0) if prov else 1.0
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0
