"""The calibration file's documented ranges (docs/simulator.md, "Calibration file ranges") are
the ranges the reader applies (harness.limits): each row's bounds are taken and a value just
past either is refused; and the flags for the same values take the same bounds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.errors import InputError
from harness.limits import MAX_BLOCK_SIZE, MAX_POOL_TOKENS
from harness.model.calibration import PRESETS_DIR, Calibration
from harness.specs.advise import AdviseSpec
from harness.specs.simulate import SimSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
PRESET = json.loads((PRESETS_DIR / "vllm-tiny-cpu.json").read_text())


def _rows() -> dict[str, tuple[float, float]]:
    """Each row of the documented table: its text -> (low, high)."""
    text = DOC.read_text().split("### Calibration file ranges", 1)[1].split("\n### ", 1)[0]
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\| (.+) \| ([\d.,]+) to ([\d.,]+)(?: [\w/]+)? \|", line)
        if m:
            out[m[1]] = (float(m[2].replace(",", "")), float(m[3].replace(",", "")))
    return out


def _row(key: str) -> tuple[float, float]:
    found = [bounds for text, bounds in _rows().items() if f"`{key}`" in text]
    assert len(found) == 1, f"no documented range for {key}"
    return found[0]


def _patch(key: str, v: float) -> dict[str, Any]:
    """The preset with `key` (or what stands for it) at `v`."""
    if key == "swap_out_bytes_per_s":
        return {"swap_out_bytes_per_s": v, "swap_in_bytes_per_s": v}
    if key == "iteration_noise_samples":
        return {key: [v, v]}
    if key == "wake_ms":
        return {"wake_ms": v, "wake_tau_ms": 1.0}
    if key == "batch_tokens_point":
        return {"decode_points": [[int(v), 30.0]]}
    return {key: int(v) if key in INTEGER else v}


INTEGER = ("block_size", "kv_capacity_tokens", "batch_tokens", "free_tokens")


PROBED = ["prefill_tok_s", "decode_tok_s", "batch_tokens", "kv_bytes_per_token",
          "swap_out_bytes_per_s", "block_size", "kv_capacity_tokens", "request_overhead_ms",
          "wake_ms", "front_end_ms", "stream_token_ms", "iteration_noise_samples", "free_tokens"]


def test_every_documented_row_is_parsed() -> None:
    assert len(_rows()) == 9


@pytest.mark.parametrize("key", PROBED)
def test_the_documented_bounds_are_the_readers(key: str) -> None:
    low, high = _row(key)
    integer = key in INTEGER
    for v in (low, high):
        Calibration.from_dict(PRESET | _patch(key, v))  # each bound itself is taken
    step_up = high + 1 if integer else high * 1.001
    step_down = low - 1 if integer else (low * 0.999 if low > 0 else -1e-3)
    for v in (step_up, step_down):
        with pytest.raises(InputError, match=re.escape(key)):
            Calibration.from_dict(PRESET | _patch(key, v))


def test_a_point_context_len_has_the_batch_tokens_range() -> None:
    low, high = _row("batch_tokens")
    Calibration.from_dict(PRESET | _patch("batch_tokens_point", high))
    with pytest.raises(InputError, match="context_len"):
        Calibration.from_dict(PRESET | _patch("batch_tokens_point", high + 1))


def test_the_flags_take_the_files_bounds() -> None:
    sim = {f.name: f for f in SimSpec.fields()}
    advise = {f.name: f for f in AdviseSpec.fields()}
    assert sim["block_size"].high == MAX_BLOCK_SIZE == _row("block_size")[1]
    assert sim["capacity_tokens"].high == MAX_POOL_TOKENS == _row("kv_capacity_tokens")[1]
    assert advise["kv_tokens"].high == MAX_POOL_TOKENS
