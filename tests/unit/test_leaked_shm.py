"""Removing the shared memory a killed server left: only new, matching, unmapped entries."""

from __future__ import annotations

import mmap
from pathlib import Path

from harness.adapters.launchers.process import mapped_shm, remove_leaked_shm, shm_entries


def test_only_new_matching_unmapped_entries_are_removed(tmp_path: Path) -> None:
    (tmp_path / "sglang_loads_old.shm").write_bytes(b"x")  # there before the server started
    before = shm_entries(tmp_path)
    for name in ("sglang_loads_a.shm", "sem.mp-b", "other_c", "sem.mp-in-use"):
        (tmp_path / name).write_bytes(b"\0" * 64)
    with open(tmp_path / "sem.mp-in-use", "r+b") as f, mmap.mmap(f.fileno(), 64):
        assert "sem.mp-in-use" in mapped_shm(tmp_path)  # a live process (this one) maps it
        removed = remove_leaked_shm(before, ("sglang_loads_", "sem.mp-"), tmp_path)
    assert removed == ["sem.mp-b", "sglang_loads_a.shm"]
    assert shm_entries(tmp_path) == {"sglang_loads_old.shm", "other_c", "sem.mp-in-use"}
    assert remove_leaked_shm(before, ("sem.mp-",), tmp_path / "missing") == []
