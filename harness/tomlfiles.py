"""Data files in TOML: built-in ones shipped inside the package, or a user's file by path."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from harness.errors import InputError


def builtin_names(package: str, folder: str) -> list[str]:
    """Names (without .toml) of the built-in files in `package`/`folder`."""
    root = resources.files(package).joinpath(folder)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_toml(name_or_path: str, package: str, folder: str, kind: str,
              also_builtin: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """Parsed TOML and where it came from: a path (ends in .toml or exists) or a built-in name.

    Errors name the `kind` of file ("profile", "injection"), the file and the problem.
    """
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise InputError(f"{kind} file {path} does not exist")
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as exc:
            raise InputError(f"{kind} file {path} is not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from None
    else:
        res = resources.files(package).joinpath(folder, f"{name_or_path}.toml")
        if not res.is_file():
            names = [*also_builtin, *builtin_names(package, folder)]
            raise InputError(f"unknown {kind} {name_or_path!r}; built-in {kind}s: "
                             f"{', '.join(names)}")
        text, where = res.read_text(), f"{name_or_path}.toml"
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{kind} {where}: not valid TOML: {exc}") from None
