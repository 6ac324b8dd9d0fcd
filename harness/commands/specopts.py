"""A job's flags generated from its spec's field declarations (harness.specs), and its
benchmark file: `--config FILE.toml` gives the same inputs under the flag names without their
dashes; a flag given on the command line overrides the file."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from harness.specs.fields import Field, Spec, read_config

S = TypeVar("S", bound=Spec)
CONFIG_HELP = ("A benchmark file (TOML): this command's inputs by their flag names without "
               "the dashes (e.g. ctx-per-slot = 4096); a flag given overrides the file.")
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


class SpecOption(click.Option):
    """A spec's option: `--help` shows it [required] as it always has, but a benchmark file may
    give it, so its absence is decided once the file is read (Spec.build)."""

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        required, self.required = self.required, False
        try:
            return super().process_value(ctx, value)
        finally:
            self.required = required


def _click_type(f: Field) -> Any:
    if f.shown == "text":
        return click.STRING
    if f.shown == "range" and f.kind == "int":
        return click.IntRange(None if f.low is None else int(f.low),
                              None if f.high is None else int(f.high))
    if f.shown == "range" and f.kind == "float":
        return click.FloatRange(f.low, f.high, min_open=f.low_open)
    return {"int": int, "float": float, "path": click.Path(path_type=Path),
            "choice": click.Choice(list(f.choices)), "str": click.STRING}[f.kind]


def _option_kw(f: Field) -> dict[str, Any]:
    """click's settings of one field's option, shown as its declaration says."""
    kw: dict[str, Any] = {"help": f.help, "show_default": f.show_default,
                          "required": f.required, "metavar": f.metavar}
    if f.kind == "flag":
        kw["is_flag"] = True
    else:
        kw.update(type=_click_type(f), default=None if f.multiple else f.default,
                  multiple=f.multiple)
    if f.envvar is not None:
        kw.update(envvar=f.envvar, show_envvar=True)
    return kw


def field_option(f: Field) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one field of a spec: its value is checked when the spec is built
    (with the benchmark file's, if any)."""
    return click.option(f.flag, f.name, cls=SpecOption, **_option_kw(f))


def checked_option(f: Field) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one field for a command without a spec: the command gets the value
    checked and typed as a spec would hold it (InputError naming the flag)."""
    return click.option(f.flag, f.name, callback=lambda _c, _p, v: f.value(v, f.flag),
                        **_option_kw(f))


def spec_options(spec: type[S]) -> Callable[[Callable[[S], Any]], Callable[..., Any]]:
    """The flags of `spec`'s fields (in its order) and --config; the command is called with the
    spec built from the file and the flags, checked (InputError: one line, exit 2)."""
    def decorate(run: Callable[[S], Any]) -> Callable[..., Any]:
        @functools.wraps(run)
        def wrapper(**kw: Any) -> Any:
            return run(spec_of(spec, click.get_current_context(), kw))

        command: Callable[..., Any] = click.option(
            "--config", "config", type=click.Path(path_type=Path), metavar="FILE.toml",
            help=CONFIG_HELP)(wrapper)
        for f in reversed(spec.fields()):
            command = field_option(f)(command)
        return command
    return decorate


def spec_of(spec: type[S], ctx: click.Context, kw: dict[str, Any]) -> S:
    """The spec of a command line's values (`kw`) over its benchmark file's, if any."""
    config: Path | None = kw.pop("config", None)
    values: dict[str, Any] = {}
    labels: dict[str, str] = {}
    if config is not None:
        values = read_config(config, spec.fields())
        labels = {f.name: f"{config}: {f.key}" for f in spec.fields()}
    for f in spec.fields():
        if ctx.get_parameter_source(f.name) in _GIVEN or f.name not in values:
            values[f.name] = kw.get(f.name)
            labels.pop(f.name, None)
    return spec.build(values, labels)
