"""One declaration per input: a Field is a job's input with its flag, type, bounds, default and
help, and turns a raw value (from the command line or a benchmark file) into a checked, typed
one. The commands build their flags from these (harness.commands.specopts); a benchmark file
(`--config FILE.toml`) gives the same inputs under the flag names without their dashes.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from harness.errors import InputError

Kind = Literal["int", "float", "str", "path", "flag", "choice"]
# How `--help` shows the value: its type ("plain": INTEGER, FLOAT, PATH, TEXT), as text whatever
# the kind ("text": the value is parsed here), or as a range of the bounds ("range").
Shown = Literal["plain", "text", "range"]


@dataclass(frozen=True)
class Field:
    """One input of a job. `name`: the spec's attribute (and the click parameter); `flag`: the
    option (its TOML key is the flag without the dashes); `low`/`high`: inclusive bounds
    (`low_open`: low exclusive); `multiple`: a repeatable flag (a TOML array); `many`: a
    comma-separated list in one value (a TOML array too); `secret`: never recorded;
    `recorded_as`: what run.json holds of the value where that is not all of it (a URL without
    its password); `check`: a further check and conversion of the typed value, given how the
    value was named."""

    name: str
    flag: str
    kind: Kind = "str"
    default: Any = None
    help: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    shown: Shown = "plain"
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    required: bool = False
    show_default: bool | str = False
    multiple: bool = False
    many: bool = False
    envvar: str | None = None
    secret: bool = False
    recorded_as: Callable[[Any], Any] | None = None
    check: Callable[[Any, str], Any] | None = None

    @property
    def key(self) -> str:
        """The field's key in a benchmark file: the flag without its dashes."""
        return self.flag[2:]

    def but(self, **changes: Any) -> Field:
        """This field as one command shows it (its help, default, how --help shows it); the
        type and bounds stay those declared once."""
        return replace(self, **changes)

    def attr(self) -> Any:
        """The spec's attribute holding this field (a dataclass field whose metadata is the
        declaration, so a spec lists its inputs once)."""
        default = () if self.multiple else self.default
        return dataclasses.field(default=default, metadata={"field": self})

    def value(self, raw: Any, label: str) -> Any:
        """`raw` checked and typed; InputError naming `label` (the flag, or the file and key)
        and the bound broken."""
        if raw is None:
            return () if self.multiple else None
        if self.multiple:
            items = raw if isinstance(raw, list | tuple) else [raw]
            return tuple(self._one(v, label) for v in items)
        if self.many:
            items = raw if isinstance(raw, list | tuple) else [
                x for x in str(raw).split(",") if x.strip()]
            out = [self._one(v, label) for v in items]
            if not out or len(set(out)) != len(out):
                raise InputError(f"{label} {raw!r}: expected distinct values, comma-separated")
            return tuple(out)
        return self._one(raw, label)

    def _one(self, raw: Any, label: str) -> Any:
        v = self._typed(raw, label)
        if self.kind in ("int", "float") and v is not None:
            self._bounded(v, label)
        return self.check(v, label) if self.check is not None else v

    def _typed(self, raw: Any, label: str) -> Any:
        if self.kind == "flag":
            if not isinstance(raw, bool):
                raise InputError(f"{label} must be true or false, got {raw!r}")
            return raw
        if self.kind == "int":
            if isinstance(raw, bool | float):
                raise InputError(f"{label} {raw!r}: not an integer")
            try:
                return int(raw)
            except ValueError:
                raise InputError(f"{label} {raw!r}: not an integer") from None
        if self.kind == "float":
            value = number(raw, label)
            if not math.isfinite(value):
                raise InputError(f"{label} must be a finite number, got {raw!r}")
            return value
        if not isinstance(raw, str | Path):
            raise InputError(f"{label} must be text, got {raw!r}")
        if self.kind == "choice" and str(raw) not in self.choices:
            raise InputError(f"{label} must be one of {', '.join(self.choices)}, got {raw!r}")
        return Path(raw) if self.kind == "path" else str(raw)

    def _bounded(self, v: float, label: str) -> None:
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if (v > low if self.low_open else v >= low) and v <= high:
            return
        if self.kind == "int":
            shown = f"[{low:,.0f}, {high:,.0f}], got {v:,}"
        else:
            shown = f"{'(' if self.low_open else '['}{low:g}, {high:g}], got {v:g}"
        raise InputError(f"{label} must be in {shown}")


def number(raw: Any, label: str) -> float:
    """`raw` (text or a number, not a bool) as a float, which may be infinite or NaN; InputError
    naming `label` when it is not a number."""
    if isinstance(raw, bool):
        raise InputError(f"{label} {raw!r}: not a number")
    try:
        return float(raw)
    except ValueError:
        raise InputError(f"{label} {raw!r}: not a number") from None


def recorded(value: Any) -> Any:
    """A field's value as run.json and a benchmark file hold it (paths as text, tuples as
    lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [recorded(v) for v in value]
    return value


def read_config(path: Path, fields: Sequence[Field]) -> dict[str, Any]:
    """A benchmark file's values by field name; InputError (one line naming the file and the
    key) for a file that cannot be read, an unknown key or a value of the wrong type or out of
    its bounds."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--config {path}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--config {path}: not valid TOML: {exc}") from None
    by_key = {f.key: f for f in fields}
    out: dict[str, Any] = {}
    for key, raw in doc.items():
        f = by_key.get(key)
        if f is None or f.secret:
            raise InputError(f"{path}: unknown key {key!r}; known: "
                             f"{', '.join(k for k, g in by_key.items() if not g.secret)}")
        out[f.name] = f.value(raw, f"{path}: {key}")
    return out


class Section:
    """Inputs declared together: a frozen dataclass whose attributes are `Field.attr()`
    declarations, or sections of their own (`Section.attr()`), in the order `--help` lists
    them. A group of inputs several jobs share is one section, which each job's spec names in
    one attribute; its inputs keep their own names on the command line, in a benchmark file
    and in run.json."""

    @classmethod
    def attr(cls) -> Any:
        """The attribute of a spec (or a section) holding this section: its inputs stand where
        it does in the order, each with its default."""
        return dataclasses.field(default_factory=cls, metadata={"section": cls})

    @classmethod
    def fields(cls) -> tuple[Field, ...]:
        """The inputs, in order (a section's where it stands)."""
        out: list[Field] = []
        for d in _declared(cls):
            section = d.metadata.get("section")
            out.extend(section.fields() if section is not None else [d.metadata["field"]])
        return tuple(out)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Self:
        """The section holding `values` (by field name, already checked; every one given)."""
        kw = {}
        for d in _declared(cls):
            section = d.metadata.get("section")
            kw[d.name] = section.of(values) if section is not None else values[d.name]
        return cls(**kw)

    def values(self) -> dict[str, Any]:
        """Every input by field name, the sections' included."""
        out: dict[str, Any] = {}
        for d in _declared(type(self)):
            value = getattr(self, d.name)
            out.update(value.values() if "section" in d.metadata else {d.name: value})
        return out


def _declared(cls: type[Section]) -> tuple[dataclasses.Field[Any], ...]:
    """The dataclass attributes of a section, in order."""
    return dataclasses.fields(cls)  # type: ignore[arg-type]


class Spec(Section):
    """A job's inputs, typed and checked: a section (a frozen dataclass of `Field.attr()` and
    `Section.attr()` declarations, in the order `--help` lists them) with the checks that join
    several inputs. `COMMAND` names the command that runs it."""

    COMMAND: ClassVar[str] = ""

    @classmethod
    def build(cls, values: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Self:
        """The spec of `values` by field name (a field not given: its default), each checked and
        named by `labels` (default: its flag), then the checks that join several inputs."""
        kw: dict[str, Any] = {}
        for f in cls.fields():
            raw = values.get(f.name, f.default)
            if f.required and raw is None:
                raise InputError(f"missing option {f.flag} (give it on the command line or in "
                                 "--config)")
            kw[f.name] = f.value(raw, (labels or {}).get(f.name, f.flag))
        spec = cls.of(kw)
        spec.check()
        return spec

    def check(self) -> None:
        """The checks that join several inputs (InputError); none by default."""

    def record(self) -> dict[str, Any]:
        """The spec as run.json records it: the command and every input by its key in a
        benchmark file (the secrets left out, a URL's password hidden), so `harness rerun`
        runs it again."""
        given = self.values()
        values = {}
        for f in self.fields():
            value = given[f.name]
            if f.secret:
                continue
            if f.recorded_as is not None and value is not None:
                value = f.recorded_as(value)
            values[f.key] = recorded(value)
        return {"command": self.COMMAND, "values": values}

    def replaced(self, **changes: Any) -> Self:
        """This spec with some inputs changed (checked again)."""
        return type(self).build({**self.values(), **changes})
