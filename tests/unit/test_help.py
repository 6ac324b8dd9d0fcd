"""Every command's `--help`, word for word as recorded (tests/data/help/commands.json): a move
of the code behind the commands changes no flag, default or help text. A change meant to alter
a command's help re-records it: `python tests/unit/test_help.py --record`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from harness.cli import main

RECORDED = Path(__file__).resolve().parents[1] / "data" / "help" / "commands.json"
WIDTH = {"COLUMNS": "80"}  # the terminal width the recording was made at


def commands(cmd: click.Command = main, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[str, ...]]:
    """The path of every command and command group under `cmd` (its own included)."""
    yield path
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from commands(cmd.commands[name], (*path, name))


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*path, "--help"], env=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def record() -> dict[str, str]:
    return {" ".join(("harness", *p)): help_text(p) for p in commands()}


def test_every_command_is_recorded() -> None:
    assert sorted(" ".join(("harness", *p)) for p in commands()) == sorted(
        json.loads(RECORDED.read_text()))


@pytest.mark.parametrize("path", list(commands()), ids=lambda p: " ".join(p) or "harness")
def test_help_is_unchanged(path: tuple[str, ...]) -> None:
    assert help_text(path) == json.loads(RECORDED.read_text())[" ".join(("harness", *path))]


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORDED.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
