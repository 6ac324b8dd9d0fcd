"""Every package directory is installed: pyproject lists packages explicitly."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {"harness." + ".".join(p.parent.relative_to(ROOT / "harness").parts)
             for p in (ROOT / "harness").rglob("__init__.py")}
    found = {f.rstrip(".") for f in found} | {"harness"}
    found |= {"harness.adapters" + "".join("." + x for x in p.parent.relative_to(
        ROOT / "adapters").parts) for p in (ROOT / "adapters").rglob("__init__.py")}
    found.discard("harness.")
    assert found <= listed, f"not installed: {sorted(found - listed)}"


def test_package_data_lives_in_listed_packages() -> None:
    # A data folder named by a parent's pattern ("profiles/*.toml") makes setuptools warn that the
    # folder "would be ignored"; each data folder is a listed package with its own patterns.
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    for package, patterns in cfg["package-data"].items():
        assert package in listed, f"package-data for an unlisted package: {package}"
        nested = [p for p in patterns if "/" in p]
        assert not nested, f"{package}: list the folder as a package instead of {nested}"
