"""harness.jsontypes: a JSON object read into a frozen dataclass by its hints and written back
as it was read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from harness.errors import InputError
from harness.jsontypes import Json, JsonType


@dataclass(frozen=True)
class Leaf(JsonType):
    n: int | None = None
    x: float | None = None
    ok: bool | None = None


@dataclass(frozen=True)
class Doc(JsonType):
    name: str | None = "doc"
    leaf: Leaf = field(default_factory=Leaf)
    leaves: list[Leaf] | None = None
    by_name: dict[str, Leaf] | None = None
    tags: list[str] = field(default_factory=list)
    raw: Json | None = None
    anything: Any = None

    JSON_NAME: ClassVar[str] = "doc.json"


@dataclass(frozen=True)
class Part(Doc):
    JSON_KEYS: ClassVar[tuple[str, ...] | None] = ("tags", "name")


def test_a_document_reads_into_its_types_and_writes_back_as_read() -> None:
    data = {"name": "a", "leaf": {"n": 1, "x": 2, "new": [1]},
            "leaves": [{"n": 2}, {"ok": True}], "by_name": {"k": {"x": 0.5}},
            "tags": ["t"], "raw": {"deep": {"y": 1}}, "anything": [1, "a"], "later": {"z": 1}}
    d = Doc.from_json(data)
    assert d.leaf == Leaf(n=1, x=2, absent=frozenset({"ok"}), extra={"new": [1]})
    assert isinstance(d.leaf.x, int)  # kept as read: the same JSON
    assert d.leaves is not None and d.leaves[1].ok is True and d.leaves[1].absent == {"n", "x"}
    assert d.by_name is not None and d.by_name["k"].x == 0.5
    assert d.extra == {"later": {"z": 1}} and d.absent == frozenset()
    assert d.to_json() == data and list(d.to_json()) == list(data)
    assert d.raw is data["raw"]  # plain JSON is kept, not copied


def test_absent_keys_take_their_defaults_and_stay_out() -> None:
    d = Doc.from_json({"tags": []})
    assert d.name == "doc" and d.leaf == Leaf() and d.absent == set(Doc.json_keys()) - {"tags"}
    assert d.to_json() == {"tags": []}
    assert Doc().to_json()["leaf"] == {"n": None, "x": None, "ok": None}


def test_a_document_of_some_fields_names_its_keys() -> None:
    p = Part.from_json({"name": "p", "leaf": {"n": 1}})
    assert Part.json_keys() == ("tags", "name")
    assert p.leaf == Leaf() and p.extra == {"leaf": {"n": 1}} and p.absent == {"tags"}
    assert p.to_json() == {"name": "p", "leaf": {"n": 1}}


@pytest.mark.parametrize("data, message", [
    ({"name": 1}, "doc.json: name must be a string or null, got int"),
    ({"leaf": None}, "doc.json: leaf must be a JSON object, got NoneType"),
    ({"leaf": {"n": True}}, "doc.json leaf: n must be an integer or null, got bool"),
    ({"leaf": {"x": "1"}}, "doc.json leaf: x must be a number or null, got str"),
    ({"leaf": {"ok": 1}}, "doc.json leaf: ok must be true or false or null, got int"),
    ({"leaves": {}}, "doc.json: leaves must be a list or null, got dict"),
    ({"leaves": [None]}, "doc.json: each of leaves must be a JSON object, got NoneType"),
    ({"by_name": {"k": 1}}, "doc.json: each of by_name k must be a JSON object, got int"),
    ({"by_name": {"k": {"n": 0.5}}}, "doc.json by_name k: n must be an integer or null"),
    ({"tags": None}, "doc.json: tags must be a list, got NoneType"),
    ({"raw": []}, "doc.json: raw must be a JSON object or null, got list"),
])
def test_a_value_of_the_wrong_kind_is_one_input_error_naming_the_key(
        data: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=f"^{message}"):
        Doc.from_json(data)


def test_a_hint_it_cannot_read_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Odd(JsonType):
        both: int | str | None = None

    with pytest.raises(TypeError, match="Odd.both"):
        Odd.from_json({})
