"""Names the harness gives server-side state: cache salts and swap dump files, each unique per
pause of a trajectory and made of characters every server accepts."""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def safe_key(run_id: str, trajectory_id: str, step: int) -> str:
    """A key for one pause of one trajectory that servers accept as a name: letters, digits,
    '-' and '_' only (a sub-agent's id has '/', which vLLM refuses in a cache salt and a
    server refuses in a file name), at most ~100 characters, unique per trajectory (a short
    hash of its raw id)."""
    digest = hashlib.blake2b(trajectory_id.encode(), digest_size=4).hexdigest()
    slug = _UNSAFE.sub("_", trajectory_id)[:40]
    return f"{_UNSAFE.sub('_', run_id)[:48]}-{slug}-{digest}-{step}"


def cache_salt(run_id: str, trajectory_id: str, step: int) -> str:
    """A fresh cache salt for one pause: `run-trajectory-step` as it is where that is a name
    servers accept (at most 128 of letters, digits, '-' and '_'), else `safe_key`'s."""
    plain = f"{run_id}-{trajectory_id}-{step}"
    return plain if len(plain) <= 128 and not _UNSAFE.search(plain) else safe_key(
        run_id, trajectory_id, step)


def dump_name(run_id: str, trajectory_id: str, step: int) -> str:
    """A swap dump's file name (no dots but its suffix, so no '..' a server would refuse)."""
    return safe_key(run_id, trajectory_id, step) + ".bin"
