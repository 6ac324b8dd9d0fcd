"""What every command shares: the Command class (a flag given twice, a number that is not
finite: refused), the report commands' results directories and SLO bounds, and the check of an
output file. The jobs' inputs are declared once in harness.specs; their flags come from there
(harness.commands.specopts). A bad value is an InputError naming the flag: one line and exit 2,
before anything starts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness.errors import InputError
from harness.metrics.outcomes import SLO_KEYS, parse_outcome_slo


class Command(click.Command):
    """A harness command: besides click's own parsing, two checks for every flag of every
    command. A flag that takes one value given twice is refused (click would keep the last
    without a word), and a number that is not finite (nan, inf) is refused wherever a float is
    read."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        seen: set[str] = set()
        for param in order:
            if (isinstance(param, click.Option) and not param.multiple and not param.count
                    and not param.is_eager and param.name is not None):
                if param.name in seen:
                    raise InputError(f"{_flag(param)} is given more than once; give it once")
                seen.add(param.name)
        rest = super().parse_args(ctx, args)
        for param in self.get_params(ctx):
            value = ctx.params.get(param.name or "")
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, float) and not math.isfinite(v):
                    raise InputError(f"{_flag(param)} must be a finite number, got {v}")
        return rest


class Group(click.Group):
    """A command group whose commands are harness Commands."""

    command_class = Command


def _flag(param: click.Parameter) -> str:
    """How the user wrote a flag: its longest name (the argument's name, upper case)."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return (param.name or "").upper()


# The report commands' results directories.
DIRS_ARGUMENT = click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))


def outcome_slo_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--slo KEY=VALUE, repeatable (the report commands' bounds on outcomes), given to the
    command as `slo` (a checked dict)."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        kw["slo"] = parse_outcome_slo(kw.pop("slo_items"))
        return f(*args, **kw)

    return click.option("--slo", "slo_items", multiple=True, metavar="KEY=VALUE",
                        help=f"SLO bound, repeatable; keys: {', '.join(SLO_KEYS)}.")(wrapper)


def check_out_file(out: Path) -> None:
    """InputError unless `out` can be a file: not a directory, its folder existing."""
    if out.is_dir():
        raise InputError(f"--out {out} is a directory; give the Parquet file to write")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: folder {out.parent} does not exist")
