"""Turn by turn: each call's tool wait before it, time to first token and decode, exactly."""

from __future__ import annotations

import pytest
from records_factory import Records

from harness.metrics.frames import build_frames
from harness.report.turns import turn_table, turns


def _long(calls: int) -> Records:
    b = Records()
    t = b.agent("long")
    t.call(ttft=0.5, decode=1.0)
    for _ in range(calls - 1):
        t.tool(wait=3.0, action="swap", retained=100, queue=0.05, swap_in_ms=100.0)
        t.call(ttft=0.25, decode=2.0)
    t.end()
    return b


def test_each_turn_is_its_wait_first_token_and_decode() -> None:
    frames = build_frames(_long(3).frame())
    code = int(frames.calls["_code"].iloc[0])
    t = turn_table(frames, code)
    assert t["wait_s"].tolist() == pytest.approx([0.0, 3.0, 3.0])
    assert t["action"].tolist() == ["", "swap", "swap"]
    assert t["queue_s"].tolist() == pytest.approx([0.0, 0.05, 0.05])
    assert t["restore_s"].tolist() == pytest.approx([0.0, 0.1, 0.1])
    assert t["first_s"].tolist() == pytest.approx([0.5, 0.25, 0.25])
    assert t["decode_s"].tolist() == pytest.approx([1.0, 2.0, 2.0])
    assert t["resumed"].tolist() == [False, True, True]


def test_only_long_trajectories_get_the_turn_view() -> None:
    assert turns(build_frames(_long(3).frame())) is None
    assert str(turns(build_frames(_long(12).frame()))).startswith("data:image/png;base64,")
