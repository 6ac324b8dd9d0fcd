"""benchmarks/engine_collisions.py's table: the waits it derives from the timed calls."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "engine_collisions", ROOT / "benchmarks" / "engine_collisions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def call(sent: float, first: float, prompt_ms: float) -> dict[str, float | int]:
    return {"sent_s": sent, "first_s": first, "prompt_ms": prompt_ms, "cached": 512}


def test_the_table_reads_each_wait_from_the_timed_calls() -> None:
    b = bench()
    rows: list[dict[str, object]] = []
    for n in range(2):
        # alone: B waits 4 ms beyond its 10-ms prompt, A 5 ms beyond its 50-ms prompt
        rows.append({"trial": n, "offset_ms": None, "b": call(0.0, 0.014, 10.0)})
        rows.append({"trial": n, "offset_ms": None, "a": call(0.0, 0.055, 50.0)})
        for off in b.OFFSETS_MS:
            # B sent `off` ms after A; A's first token at 55 ms; B's at 55 + 10 + 4 - 2 ms:
            # it waited A's remaining time less 2 ms (A's way back) beyond its overhead
            sent = off / 1e3
            first_b = 0.055 + 0.010 + 0.004 - 0.002
            rows.append({"trial": n, "offset_ms": off, "a": call(0.0, 0.055, 50.0),
                         "b": call(sent, first_b, 10.0), "a_remaining_ms": 55.0 - off})
    lines = b.table(rows).splitlines()
    assert lines[2] == "| B alone | 2 | 4.0 (4.0) | - | - | - |"
    assert lines[3] == "| (A alone) | 2 | 5.0 (5.0) | - | - | - |"
    # offset 10: B's first token 57 ms after its send, less its 10-ms prompt: a 47-ms wait,
    # 43 beyond its overhead, against A's remaining 45 ms: excess -2
    assert lines[6] == "| 10 ms | 2 | 47.0 (47.0) | 43.0 (43.0) | 45.0 (45.0) | -2.0 (-2.0) |"


def test_save_replaces_the_file_whole(tmp_path: Path) -> None:
    b = bench()
    path = tmp_path / "collisions.json"
    b.save([{"trial": 0}], path)
    b.save([{"trial": 0}, {"trial": 1}], path)
    assert json.loads(path.read_text()) == [{"trial": 0}, {"trial": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collisions.json"]
