"""JSON documents as frozen dataclasses, read and written by their type hints.

A result file the harness writes (summary.json, capacity.json, advice.json) is one `JsonType`:
a frozen dataclass whose fields are the document's keys. `read(data, where)` types a JSON
object and `to_json()` gives it back, so that reading a file and writing it again gives the
same JSON:

- a key the object lacks is recorded in `absent`: its field takes its default, and the key
  stays out when the object is written again (a file of an older harness);
- keys the type does not know are kept as read in `extra` and written back unchanged (a file
  of a newer harness), in nested objects too;
- values are kept as read (an integer stays an integer): only their kind is checked against
  the field's hint, and a value of the wrong kind is one InputError naming `where` and the key.

The hints it reads: int, float (an integer is a number too), str, bool, a nested JsonType,
list[...] and dict[str, ...] (of JsonTypes, read as such; of anything else, kept as they are),
Any (anything, unchecked), each `| None` where null is allowed. The keys are the fields in
their order, or the class's `JSON_KEYS` where its document has only some of them.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from harness.errors import InputError

Json = dict[str, Any]  # a JSON object kept as it is

T = TypeVar("T", bound="JsonType")

# What a value of each kind of hint must be, and how a message names it.
_KINDS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
    list: (lambda v: isinstance(v, list), "a list"),
    dict: (lambda v: isinstance(v, dict), "a JSON object"),
}


@dataclass(frozen=True)
class _Key:
    """How one key is read: the kind its value must be (`ok` None: any), whether null is
    allowed, and the JsonType it holds (`typed`) directly, or in a list or a map (`within`)."""

    name: str
    ok: Callable[[Any], bool] | None
    want: str
    nullable: bool
    typed: type[JsonType] | None = None
    within: type | None = None  # list or dict: `typed` are its items

    def decode(self, value: Any, where: str) -> Any:
        if value is None and self.nullable:
            return None
        if self.ok is not None and not self.ok(value):
            null = " or null" if self.nullable else ""
            raise InputError(f"{where}: {self.name} must be {self.want}{null}, got "
                             f"{type(value).__name__}")
        typed = self.typed
        if typed is None:
            return value
        if self.within is list:
            return [_item(typed, x, where, self.name) for x in value]
        if self.within is dict:
            return {k: _item(typed, x, where, f"{self.name} {k}") for k, x in value.items()}
        return typed.read(value, f"{where} {self.name}")


def _item(typed: type[JsonType], value: Any, where: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise InputError(f"{where}: each of {key} must be a JSON object, got "
                         f"{type(value).__name__}")
    return typed.read(value, f"{where} {key}")


def _kind(hint: Any, where: str) -> tuple[Any, bool]:
    """The hint without None, and whether None was in it."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(hint))
        raise TypeError(f"{where}: no JSON reading of {hint}")
    return hint, False


def _json_type(hint: Any) -> type[JsonType] | None:
    return hint if isinstance(hint, type) and issubclass(hint, JsonType) else None


def _key(name: str, hint: Any, where: str) -> _Key:
    """How the key `name` of a field hinted `hint` is read."""
    base, nullable = _kind(hint, where)
    if base is Any:
        return _Key(name, None, "", True)
    typed = _json_type(base)
    if typed is not None:
        return _Key(name, _KINDS[dict][0], _KINDS[dict][1], nullable, typed)
    origin = typing.get_origin(base) or base
    if origin not in _KINDS:
        raise TypeError(f"{where}: no JSON reading of {hint}")
    ok, want = _KINDS[origin]
    args = typing.get_args(base)
    item = _json_type(args[-1]) if origin in (list, dict) and args else None
    return _Key(name, ok, want, nullable, item, origin if item is not None else None)


@dataclass(frozen=True)
class _Plan:
    """A JsonType's keys in order, how each is read, and those holding JsonTypes (written
    through their own to_json)."""

    keys: tuple[_Key, ...]
    names: frozenset[str]
    typed: frozenset[str]


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type[JsonType]) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        own = [f.name for f in dataclasses.fields(cls) if f.name not in ("absent", "extra")]
        names = cls.JSON_KEYS if cls.JSON_KEYS is not None else tuple(own)
        keys = tuple(_key(n, hints[n], f"{cls.__name__}.{n}") for n in names)
        plan = _Plan(keys, frozenset(names),
                     frozenset(k.name for k in keys if k.typed is not None))
        _PLANS[cls] = plan
    return plan


def non_finite(value: Any, at: str = "") -> str | None:
    """The key path (`a.b[2]`) of the first NaN or infinity in a JSON value, else None: JSON has
    neither, and a result file that held one would not read back as JSON elsewhere."""
    if isinstance(value, float):
        return None if math.isfinite(value) else at or "the value"
    if isinstance(value, dict):
        items: Any = ((f"{at}.{k}" if at else str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{at}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, v in items:
        found = non_finite(v, path)
        if found is not None:
            return found
    return None


def finite_json(data: Any, where: str) -> Any:
    """`data` with every NaN or infinity replaced by null (unknown), and one line on stderr
    naming `where` and the first such key. Every input a result is computed from is refused up
    front when outside its documented range, so this is a fault of the harness; a results file
    is still written (a run's end must never be lost), and never with a value JSON cannot
    hold."""
    found = non_finite(data)
    if found is None:
        return data
    sys.stderr.write(f"warning: {where}: {found} is not a finite number; written as null\n")
    return _nulled(data)


def _nulled(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulled(v) for v in value]
    return value


def encode(value: Any) -> Any:
    """The JSON form of a value that holds JsonTypes (directly, in lists or in maps)."""
    if isinstance(value, JsonType):
        return value.to_json()
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, eq=False)
class JsonType:
    """A JSON object read into a frozen dataclass's fields (see the module's note), with the
    known keys it lacked (`absent`) and the unknown ones it had (`extra`)."""

    absent: frozenset[str] = field(default=frozenset(), kw_only=True)
    extra: Json = field(default_factory=dict, kw_only=True)

    # The document's keys in order where they are not every field (several documents of one
    # set of fields); None: every field, in field order.
    JSON_KEYS: ClassVar[tuple[str, ...] | None] = None
    # What a message names by default: the document's file.
    JSON_NAME: ClassVar[str] = "JSON"

    @classmethod
    def read(cls: type[T], data: Mapping[str, Any], where: str) -> T:
        """The typed object of `data` (InputError naming `where` and the key for a value of
        the wrong kind)."""
        plan = _plan(cls)
        values = {k.name: k.decode(data[k.name], where) for k in plan.keys if k.name in data}
        absent = frozenset(k.name for k in plan.keys if k.name not in data)
        extra = {k: v for k, v in data.items() if k not in plan.names}
        return cls(**values, absent=absent, extra=extra)

    @classmethod
    def from_json(cls: type[T], data: Mapping[str, Any], where: str | None = None) -> T:
        """`read`, a message naming `where` or else the document's file (JSON_NAME)."""
        return cls.read(data, cls.JSON_NAME if where is None else where)

    @classmethod
    def json_keys(cls) -> tuple[str, ...]:
        """The document's known keys, in order."""
        return tuple(k.name for k in _plan(cls).keys)

    def json_value(self, key: str) -> Any:
        """The JSON form of the known key `key`'s value (as read, where it holds no
        JsonType)."""
        value = getattr(self, key)
        return encode(value) if key in _plan(type(self)).typed else value

    def to_json(self) -> Json:
        """The JSON object: the known keys it has, then the unknown ones, as read."""
        out = {k.name: self.json_value(k.name) for k in _plan(type(self)).keys
               if k.name not in self.absent}
        out.update(self.extra)
        return out
