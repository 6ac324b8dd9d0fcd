"""Claude Code 2.1.x sub-agent meta files: `<session>/subagents/agent-<id>.meta.json`.

Beside each sub-agent transcript `agent-<id>.jsonl` Claude Code writes a small JSON object
naming the call that started it: `toolUseId` (the id of the parent's Agent / Task `tool_use`,
in the main transcript or in another sub-agent's) and `spawnDepth` (1 for a child of the main
agent, 2 for a grandchild, ...), with `agentType` and `description`. The link it gives is
exact, where matching a sub-agent's first prompt against the calls' prompts is a guess (nested
agents are often given the same prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import InputError
from harness.traces.importers._common import quote
from harness.userfiles import read_json

META_SUFFIX = ".meta.json"
MAX_META_BYTES = 1 << 20  # a meta file is a few hundred bytes; anything past this is not one


@dataclass(frozen=True)
class AgentMeta:
    """What a sub-agent's meta file says of its parent."""

    tool_use_id: str
    spawn_depth: int | None


def meta_path(transcript: Path) -> Path | None:
    """The meta file beside a sub-agent transcript `agent-<id>.jsonl` (None for any other)."""
    name = transcript.name
    if not name.startswith("agent-") or not name.endswith(".jsonl"):
        return None
    return transcript.with_name(name[: -len(".jsonl")] + META_SUFFIX)


def read_meta(path: Path) -> AgentMeta:
    """Parse one meta file; anything unusable is an InputError naming the file and the fault
    (the importer warns and falls back to matching prompts)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > MAX_META_BYTES:
        raise InputError(f"{path}: {size} bytes, more than a meta file holds")
    d = read_json(path)
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object")
    tid = d.get("toolUseId")
    if not isinstance(tid, str) or not tid:
        raise InputError(f"{path}: toolUseId must be a non-empty string, got {quote(tid)}")
    depth = d.get("spawnDepth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or depth < 1):
        raise InputError(f"{path}: spawnDepth must be a whole number from 1, "
                         f"got {quote(depth)}")
    return AgentMeta(tid, depth)
