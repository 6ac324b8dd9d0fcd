"""ATIF documents (Agent Trajectory Interchange Format, Harbor / terminal-bench): reading them and
resolving their references to sub-agent trajectories and continuations.

A reference (`subagent_trajectory_ref[]`) names its trajectory by `trajectory_id` (v1.7: one of
the parent's embedded `subagent_trajectories`), by `trajectory_path` (a file: relative to the
parent's folder; where that file is absent, the one file beside the parent whose name ends with
that name, as Harbor's test outputs prefix the parent's name), or, before v1.7, by `session_id`
(a document of the import, or a file beside the parent, with that session id). A
`continued_trajectory_ref` names a file the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.userfiles import read_json

SOURCES = ("system", "user", "agent")


@dataclass
class Doc:
    """One ATIF trajectory: a file, or one embedded in a file's `subagent_trajectories`."""

    path: Path
    where: str  # the file, with the JSON path of an embedded one
    data: dict[str, Any]
    steps: list[Any]
    embedded: list[Doc] = field(default_factory=list)

    def text(self, key: str) -> str | None:
        v = self.data.get(key)
        return v if isinstance(v, str) and v else None

    @property
    def agent(self) -> str:
        a = self.data.get("agent")
        name = a.get("name") if isinstance(a, dict) else None
        return name if isinstance(name, str) and name else "subagent"

    @property
    def version(self) -> str:
        a = self.data.get("agent")
        parts = [self.text("schema_version") or "ATIF"]
        if isinstance(a, dict):
            parts += [str(a[k]) for k in ("name", "version") if isinstance(a.get(k), str)]
        return " ".join(parts)


def looks_atif(data: Any) -> bool:
    """A document that claims to be ATIF (its schema_version) or has ATIF's steps."""
    if not isinstance(data, dict):
        return False
    version = data.get("schema_version")
    return (isinstance(version, str) and version.upper().startswith("ATIF")) or (
        isinstance(data.get("steps"), list) and isinstance(data.get("agent"), dict))


def make_doc(path: Path, where: str, data: Any, at: tuple[int, ...] = ()) -> Doc:
    """A Doc of a parsed document; its embedded sub-agent trajectories too. `at`: the index of
    an embedded one at each level, named `subagent_trajectories[0/2]` (the third of the first's
    own), which keeps a deep one's name short."""
    here = f"{where}: subagent_trajectories[{'/'.join(map(str, at))}]" if at else where
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise InputError(f"{here}: expected an ATIF trajectory (a JSON object with 'steps')")
    doc = Doc(path, here, data, data["steps"])
    subs = data.get("subagent_trajectories")
    if subs is not None:
        if not isinstance(subs, list):
            raise InputError(f"{here}: 'subagent_trajectories' must be a list")
        if len(at) >= MAX_SUBAGENT_DEPTH:
            raise InputError(f"{path}: subagent_trajectories nested deeper than "
                             f"{MAX_SUBAGENT_DEPTH} levels (the limit)")
        doc.embedded = [make_doc(path, where, s, (*at, i)) for i, s in enumerate(subs)]
    return doc


def load(path: Path) -> Doc:
    """One ATIF file."""
    return make_doc(path, str(path), read_json(path))


class Resolver:
    """Finds the trajectories references name: in the import, else beside the referrer."""

    def __init__(self, docs: list[Doc]) -> None:
        self.by_path: dict[Path, Doc] = {d.path.resolve(): d for d in docs}
        self.imported = list(docs)
        self.folders: dict[Path, list[Doc]] = {}

    def _at(self, p: Path) -> Doc | None:
        key = p.resolve()
        if key not in self.by_path:
            try:
                data = read_json(p)
            except InputError:
                return None  # a referenced file that cannot be read is a missing one
            if not looks_atif(data):
                return None
            self.by_path[key] = make_doc(p, str(p), data)
        return self.by_path[key]

    def _folder(self, folder: Path) -> list[Doc]:
        """The ATIF files of a folder (read once; others skipped)."""
        if folder not in self.folders:
            found: list[Doc] = []
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                names = []
            for n in names:
                if n.endswith((".json", ".json.gz")) and (folder / n).is_file():
                    d = self._at(folder / n)
                    if d is not None:
                        found.append(d)
            self.folders[folder] = found
        return self.folders[folder]

    def by_file(self, parent: Doc, ref: Any) -> Doc | None:
        """The file a reference names, relative to the referring file's folder."""
        if not isinstance(ref, str) or not ref or "://" in ref or "\x00" in ref:
            return None
        p = Path(ref)
        here = parent.path.parent
        full = p if p.is_absolute() else here / p
        if full.is_file():
            return self._at(full)
        try:
            near = [q for q in sorted(here.iterdir()) if q.is_file() and q.name.endswith(
                p.name) and q.resolve() != parent.path.resolve()]
        except OSError:
            return None
        if not near:
            return None
        # Several: the one whose name shares the most with the referrer's.
        best = max(near, key=lambda q: len(os.path.commonprefix([q.name, parent.path.name])))
        return self._at(best)

    def subagent(self, parent: Doc, ref: dict[str, Any]) -> Doc | None:
        """The trajectory a subagent_trajectory_ref names, or None when it is not found."""
        tid = ref.get("trajectory_id")
        if isinstance(tid, str) and tid:
            for d in parent.embedded:
                if d.text("trajectory_id") == tid:
                    return d
        found = self.by_file(parent, ref.get("trajectory_path"))
        if found is not None:
            return found
        sid = ref.get("session_id")
        if isinstance(sid, str) and sid:
            known = {id(d) for d in self.imported}
            pool = self.imported + [d for d in self._folder(parent.path.parent)
                                    if id(d) not in known]
            hits = [d for d in pool if d.text("session_id") == sid and d is not parent]
            if len(hits) == 1:
                return hits[0]
        return None
