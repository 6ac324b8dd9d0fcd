"""Whether a process the live tests watch is still running."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie counts as gone (its parent, the harness, has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[1].split()[0] == "Z")
