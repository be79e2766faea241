"""runner.util.datatype against dataclasses: the same class written with each behaves the same, case by case."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest

from runner.util import datatype as dt


def build(kind: str, frozen: bool) -> type[Any]:
    """One class, with a required field, a plain default, a made default, an uncompared field and a ClassVar,
    decorated by `kind`."""
    make = dt.datatype if kind == "datatype" else dataclasses.dataclass
    spec = dt.field if kind == "datatype" else dataclasses.field

    class Sample:
        LIMIT: ClassVar[int] = 3
        name: str
        count: int = 0
        tags: list[str] = spec(default_factory=list)
        seen: dict[str, int] = spec(default_factory=dict, compare=False)

        def total(self) -> int:
            return self.count + self.LIMIT

    return make(frozen=frozen)(Sample)  # type: ignore[no-any-return]


KINDS = ["datatype", "dataclass"]


@pytest.mark.parametrize("frozen", [False, True])
def test_construction_defaults_equality_and_repr_match_dataclass(frozen: bool) -> None:
    ours, theirs = build("datatype", frozen), build("dataclass", frozen)
    for cls in (ours, theirs):
        a = cls("a")
        assert (a.name, a.count, a.tags, a.seen) == ("a", 0, [], {})
        assert cls("a").tags is not a.tags  # a made default is one per instance
        assert cls("a", 2, ["x"]) == cls("a", 2, ["x"], {"other": 1})  # `seen` is not compared
        assert cls("a", 2) != cls("a", 3)
        assert cls("a") != ("a", 0, [], {})
        assert cls(name="b", tags=["t"]).tags == ["t"]
        assert cls("a").total() == 3
        assert "LIMIT" not in repr(cls("a"))
        with pytest.raises(TypeError):
            cls()  # the required field
        with pytest.raises(TypeError):
            cls("a", nope=1)
    assert repr(ours("a", 1, ["x"])).split("(", 1)[1] == repr(theirs("a", 1, ["x"])).split("(", 1)[1]


def test_frozen_refuses_assignment_and_hashes_by_compared_fields() -> None:
    for kind in KINDS:
        cls = build(kind, True)
        a = cls("a", 1, ("x",), {"n": 1})  # type: ignore[arg-type]
        with pytest.raises(AttributeError):
            a.name = "b"
        with pytest.raises(AttributeError):
            del a.count
        assert hash(a) == hash(cls("a", 1, ("x",), {"m": 2}))  # type: ignore[arg-type]
        assert len({a, cls("a", 1, ("x",)), cls("b", 1, ("x",))}) == 2  # type: ignore[arg-type]


def test_mutable_assigns_and_is_unhashable() -> None:
    for kind in KINDS:
        cls = build(kind, False)
        a = cls("a")
        a.count = 5
        assert a.count == 5
        with pytest.raises(TypeError):
            hash(a)


def test_post_init_runs_and_replace_makes_a_changed_copy() -> None:
    @dt.datatype(frozen=True)
    class Span:
        start: int
        end: int

        def __post_init__(self) -> None:
            if self.end < self.start:
                raise ValueError("end before start")

    span = Span(1, 4)
    moved = dt.replace(span, end=9)
    assert (moved.start, moved.end, span.end) == (1, 9, 4)
    with pytest.raises(ValueError, match="end before start"):
        dt.replace(span, end=0)  # __post_init__ runs on the copy too
    with pytest.raises(TypeError, match="no field 'middle'"):
        dt.replace(span, middle=2)


def test_a_required_field_after_a_default_is_refused_as_dataclass_does() -> None:
    class Bad:
        a: int = 0
        b: int

    with pytest.raises(TypeError, match="'b' without a default"):
        dt.datatype(Bad)


def test_replace_without_post_init_copies_and_stays_frozen() -> None:
    cls = build("datatype", True)
    a = cls("a", 1, ("x",))  # type: ignore[arg-type]
    b = dt.replace(a, count=2)
    assert (a.count, b.count, b.name, b.tags) == (1, 2, "a", ("x",))
    assert b == cls("a", 2, ("x",)) and b != a  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        b.count = 3


def test_inheriting_fields_is_refused_rather_than_dropped() -> None:
    @dt.datatype
    class Base:
        a: int

    class Child(Base):
        b: int

    with pytest.raises(TypeError, match="does not inherit fields"):
        dt.datatype(Child)
