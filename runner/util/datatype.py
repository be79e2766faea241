"""`@datatype`: a plain data class, as `dataclasses.dataclass` writes it, at a fraction of its cost to define.

Every run of runner imports some two dozen small record classes, and `dataclass` costs about 0.3 ms to build
each one (it generates and compiles `__init__`, `__repr__`, `__eq__`, `__hash__` and the frozen setters one
`exec` at a time, and inspects every annotation): several per cent of a converged apply. `datatype` compiles one
`__init__` and shares the rest, so a class costs a few microseconds.

What it keeps of dataclass: fields are the class's own annotations in order (not ClassVar ones, and not a
base class's: inheriting them is refused); a default is the class attribute, `field(default_factory=...)`
makes one per instance and `field(compare=False)` leaves a field out of `==` and the hash; `__post_init__` is
called; `frozen=True` refuses assignment, and a frozen class hashes by its compared fields, a mutable one is
unhashable (dataclass's eq=True rules). `replace(obj, **changes)` is `dataclasses.replace`. `typing`'s
dataclass_transform tells mypy all of this, so the generated `__init__` is type-checked as dataclass's is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")

_NOTHING: Any = object()


class _Field:
    __slots__ = ("default", "factory", "compare")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, compare: bool) -> None:
        self.default = default
        self.factory = factory
        self.compare = compare


def field(*, default: Any = _NOTHING, default_factory: Callable[[], Any] | None = None, compare: bool = True) -> Any:
    """A field's default made per instance (`default_factory`), or a field left out of `==` (`compare=False`)."""
    return _Field(default, default_factory, compare)


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen value."""


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _repr(self: Any) -> str:
    inside = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__value_fields__)
    return f"{type(self).__qualname__}({inside})"


def _key(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in type(self).__value_compared__)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self: Any) -> int:
    return hash(_key(self))


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar"))


def _build(cls: type[T], frozen: bool) -> type[T]:
    if any(hasattr(base, "__value_fields__") for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: a @datatype class does not inherit fields (use dataclasses for that)")
    annotations = cls.__dict__.get("__annotations__", {})
    names: list[str] = []
    compared: list[str] = []
    params: list[str] = []
    body: list[str] = []
    scope: dict[str, Any] = {"_NOTHING": _NOTHING}
    seen_default = False
    for name, annotation in annotations.items():
        if _is_classvar(annotation):
            continue
        names.append(name)
        declared = cls.__dict__.get(name, _NOTHING)
        spec = declared if isinstance(declared, _Field) else _Field(declared, None, True)
        if spec.compare:
            compared.append(name)
        if spec.factory is not None:
            scope[f"_f_{name}"] = spec.factory
            params.append(f"{name}=_NOTHING")
            initial = f"_f_{name}() if {name} is _NOTHING else {name}"
            seen_default = True
        elif spec.default is not _NOTHING:
            scope[f"_d_{name}"] = spec.default
            params.append(f"{name}=_d_{name}")
            initial = name
            seen_default = True
        else:
            if seen_default:
                raise TypeError(f"{cls.__qualname__}: field {name!r} without a default follows one with a default")
            params.append(name)
            initial = name
        if isinstance(declared, _Field):
            if spec.default is _NOTHING:
                delattr(cls, name)  # as dataclass: no class attribute for a field without a plain default
            else:
                setattr(cls, name, spec.default)
        body.append(f"_set(self, {name!r}, {initial})" if frozen else f"self.{name} = {initial}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    scope["_set"] = object.__setattr__
    source = f"def __init__({', '.join(['self', *params])}):\n    " + ("\n    ".join(body) or "pass")
    exec(source, scope)  # noqa: S102 - one compiled __init__, from field names only
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    made: dict[str, Any] = {
        "__init__": init,
        "__value_fields__": tuple(names),
        "__value_compared__": tuple(compared),
    }
    if "__repr__" not in cls.__dict__:
        made["__repr__"] = _repr
    if "__eq__" not in cls.__dict__:
        made["__eq__"] = _eq
        made["__hash__"] = _hash if frozen else None
    if frozen:
        made["__setattr__"] = _frozen_setattr
        made["__delattr__"] = _frozen_delattr
    for name, member in made.items():
        setattr(cls, name, member)
    return cls


@overload
def datatype(cls: type[T], /) -> type[T]: ...


@overload
def datatype(*, frozen: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(field,))
def datatype(cls: type[T] | None = None, /, *, frozen: bool = False) -> Any:
    """The class decorator: `@datatype` or `@datatype(frozen=True)`."""
    if cls is not None:
        return _build(cls, frozen)
    return lambda c: _build(c, frozen)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of `obj` with `changes`: `dataclasses.replace` for a `@datatype` class (through `__init__`, so
    `__post_init__` runs, when the class has one; a copy of the fields otherwise)."""
    cls = type(obj)
    fields = cls.__value_fields__  # type: ignore[attr-defined]
    unknown = changes.keys() - set(fields)
    if unknown:
        raise TypeError(f"{cls.__qualname__} has no field {sorted(unknown)[0]!r}")
    if hasattr(cls, "__post_init__"):
        return cls(**{name: changes.get(name, getattr(obj, name)) for name in fields})
    copy = object.__new__(cls)
    copy.__dict__.update(obj.__dict__)
    copy.__dict__.update(changes)
    return copy
