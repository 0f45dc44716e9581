"""The type nodes: each annotation an event may use, compiled once per class into a
node that checks and converts a value on the way in and a stored value on the way out.

An annotation with no node raises :class:`CannotHandle` saying what to write instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import types
import uuid
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

from django.db import models

SUPPORTED_TYPES = (
    "str, int, float, bool, None, Decimal, datetime, date, UUID, Enum subclasses, "
    "Literal[...], and X | None, list[X], tuple[X, ...] or tuple[X, Y] of these"
)
JSON_SCALARS = (str, int, float, bool, type(None))


# ---------------------------------------------------------------- conversion nodes


class Mismatch(Exception):
    """A value does not fit the node at ``path``; turned into a public error by the caller."""

    def __init__(self, path: str, expected: str, value: object, detail: str = "") -> None:
        super().__init__(path)
        self.path = path
        self.expected = expected
        self.value = value
        self.detail = detail


class CannotHandle(Exception):
    """An annotation the codec has no conversion for; ``hint`` says what to write instead."""

    def __init__(self, hint: str) -> None:
        super().__init__(hint)
        self.hint = hint


class Node:
    """The conversion for one annotation, compiled once per event class."""

    def describe(self) -> str:
        raise NotImplementedError

    def encode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def decode(self, stored: Any, path: str) -> Any:
        raise NotImplementedError

    def mismatch(self, path: str, value: object, detail: str = "") -> Mismatch:
        return Mismatch(path, self.describe(), value, detail)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class _Str(Node):
    def describe(self) -> str:
        return "str"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, str):
            raise self.mismatch(path, value)
        # A str-valued enum member (e.g. TextChoices) is stored as its plain value.
        return value.value if isinstance(value, enum.Enum) else str.__str__(value)

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        return stored


@dataclasses.dataclass(frozen=True)
class _Int(Node):
    def describe(self) -> str:
        return "int"

    def encode(self, value: Any, path: str) -> Any:
        if not _is_int(value):
            raise self.mismatch(path, value, _bool_detail(value))
        return int(value)

    def decode(self, stored: Any, path: str) -> Any:
        if not _is_int(stored):
            raise self.mismatch(path, stored, _bool_detail(stored))
        return int(stored)


@dataclasses.dataclass(frozen=True)
class _Float(Node):
    def describe(self) -> str:
        return "float"

    def encode(self, value: Any, path: str) -> Any:
        number = self._number(value, path)
        if not math.isfinite(number):
            raise self.mismatch(path, value, "; JSON has no NaN or infinity, use Decimal")
        return number

    def decode(self, stored: Any, path: str) -> Any:
        return self._number(stored, path)

    def _number(self, value: Any, path: str) -> float:
        """An int is a float too (as in type hints), but a bool is not."""
        if not (_is_int(value) or isinstance(value, float)):
            raise self.mismatch(path, value, _bool_detail(value))
        try:
            return float(value)
        except OverflowError:
            raise self.mismatch(path, value, "; it is too large for a float") from None


@dataclasses.dataclass(frozen=True)
class _Bool(Node):
    def describe(self) -> str:
        return "bool"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, bool):
            raise self.mismatch(path, value)
        return value

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, bool):
            raise self.mismatch(path, stored)
        return stored


@dataclasses.dataclass(frozen=True)
class _NoneNode(Node):
    def describe(self) -> str:
        return "None"

    def encode(self, value: Any, path: str) -> Any:
        if value is not None:
            raise self.mismatch(path, value)
        return None

    def decode(self, stored: Any, path: str) -> Any:
        if stored is not None:
            raise self.mismatch(path, stored)
        return None


@dataclasses.dataclass(frozen=True)
class _Decimal(Node):
    def describe(self) -> str:
        return "Decimal"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, decimal.Decimal):
            raise self.mismatch(path, value)
        return str(value)

    def decode(self, stored: Any, path: str) -> Any:
        if _is_int(stored):
            return decimal.Decimal(stored)
        if isinstance(stored, float):
            raise self.mismatch(path, stored, "; Decimals are stored as strings to keep precision")
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        try:
            return decimal.Decimal(stored)
        except decimal.InvalidOperation:
            raise self.mismatch(path, stored, "; it is not a decimal number") from None


@dataclasses.dataclass(frozen=True)
class _Text(Node):
    """A value stored as its text and parsed back from it: a datetime, a date, a UUID."""

    name: str
    accepts: Callable[[object], bool]
    text: Callable[[Any], str]
    parse: Callable[[str], Any]
    not_one: str  # the detail for a string that does not parse

    def describe(self) -> str:
        return self.name

    def encode(self, value: Any, path: str) -> Any:
        if not self.accepts(value):
            raise self.mismatch(path, value)
        return self.text(value)

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        try:
            return self.parse(stored)
        except ValueError:
            raise self.mismatch(path, stored, f"; it is not {self.not_one}") from None


_DATETIME = _Text(
    "datetime",
    lambda value: isinstance(value, datetime.datetime),
    lambda value: value.isoformat(),
    datetime.datetime.fromisoformat,
    "an ISO 8601 datetime",
)
_DATE = _Text(
    "date",
    # A datetime is a date too, but would not come back as one: refuse it.
    lambda value: isinstance(value, datetime.date) and not isinstance(value, datetime.datetime),
    lambda value: value.isoformat(),
    datetime.date.fromisoformat,
    "an ISO 8601 date",
)
_UUID = _Text("UUID", lambda value: isinstance(value, uuid.UUID), str, uuid.UUID, "a UUID")


@dataclasses.dataclass(frozen=True)
class _Enum(Node):
    enum_class: type[enum.Enum]

    def describe(self) -> str:
        return self.enum_class.__qualname__

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, self.enum_class):
            raise self.mismatch(path, value, f"; pass a member such as {self._example()}")
        return value.value

    def decode(self, stored: Any, path: str) -> Any:
        valid = ", ".join(repr(m.value) for m in self.enum_class)
        try:
            member = self.enum_class(stored)
        except (ValueError, TypeError):
            raise self.mismatch(path, stored, f"; no member has that value ({valid})") from None
        # Enum lookup treats True and 1.0 as 1: insist on the stored value's own type.
        if not _literal_match(member.value, stored):
            raise self.mismatch(path, stored, f"; no member has that value ({valid})")
        return member

    def _example(self) -> str:
        first = next(iter(self.enum_class), None)
        return f"{self.enum_class.__qualname__}.{first.name}" if first else "a member"


def _literal_match(arg: object, value: object) -> bool:
    """``value == arg`` without letting True stand for 1, 1.0 for 1 or a member for its value."""
    if isinstance(arg, enum.Enum) or isinstance(value, enum.Enum):
        return arg is value
    if arg is None or value is None or isinstance(arg, bool) or isinstance(value, bool):
        return arg is value
    return isinstance(value, type(arg)) and value == arg


@dataclasses.dataclass(frozen=True)
class _Literal(Node):
    values: tuple[Any, ...]

    def describe(self) -> str:
        return f"Literal[{', '.join(_literal_repr(v) for v in self.values)}]"

    def encode(self, value: Any, path: str) -> Any:
        for arg in self.values:
            if _literal_match(arg, value):
                return arg.value if isinstance(arg, enum.Enum) else arg
        raise self.mismatch(path, value, "; it is not one of the allowed values")

    def decode(self, stored: Any, path: str) -> Any:
        for arg in self.values:
            stored_form = arg.value if isinstance(arg, enum.Enum) else arg
            if _literal_match(stored_form, stored):
                return arg
        raise self.mismatch(path, stored, "; it is not one of the allowed values")


def _literal_repr(value: object) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    return repr(value)


@dataclasses.dataclass(frozen=True)
class _Optional(Node):
    inner: Node

    def describe(self) -> str:
        return f"{self.inner.describe()} | None"

    def encode(self, value: Any, path: str) -> Any:
        if value is None:
            return None
        try:
            return self.inner.encode(value, path)
        except Mismatch as exc:
            if exc.path != path:
                raise
            raise self.mismatch(path, value, exc.detail) from None

    def decode(self, stored: Any, path: str) -> Any:
        if stored is None:
            return None
        try:
            return self.inner.decode(stored, path)
        except Mismatch as exc:
            if exc.path != path:
                raise
            raise self.mismatch(path, stored, exc.detail) from None


@dataclasses.dataclass(frozen=True)
class _List(Node):
    item: Node

    def describe(self) -> str:
        return f"list[{self.item.describe()}]"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise self.mismatch(path, value)
        return [self.item.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, list | tuple):
            raise self.mismatch(path, stored)
        return [self.item.decode(v, f"{path}[{i}]") for i, v in enumerate(stored)]


@dataclasses.dataclass(frozen=True)
class _Tuple(Node):
    """``tuple[X, ...]`` when ``variadic``, else fixed ``tuple[X, Y]``; stored as a list."""

    items: tuple[Node, ...]
    variadic: bool

    def describe(self) -> str:
        if self.variadic:
            return f"tuple[{self.items[0].describe()}, ...]"
        return f"tuple[{', '.join(n.describe() for n in self.items) or '()'}]"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, tuple):
            raise self.mismatch(path, value)
        nodes = self._nodes(value, path)
        return [
            node.encode(v, f"{path}[{i}]")
            for i, (node, v) in enumerate(zip(nodes, value, strict=True))
        ]

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, list | tuple):
            raise self.mismatch(path, stored)
        nodes = self._nodes(stored, path)
        return tuple(
            node.decode(v, f"{path}[{i}]")
            for i, (node, v) in enumerate(zip(nodes, stored, strict=True))
        )

    def _nodes(self, values: list[Any] | tuple[Any, ...], path: str) -> list[Node]:
        if self.variadic:
            return [self.items[0]] * len(values)
        if len(values) != len(self.items):
            raise self.mismatch(
                path, values, f"; it has {len(values)} items, not {len(self.items)}"
            )
        return list(self.items)


_SCALARS: dict[object, Node] = {
    str: _Str(),
    int: _Int(),
    float: _Float(),
    bool: _Bool(),
    type(None): _NoneNode(),
    decimal.Decimal: _Decimal(),
    datetime.datetime: _DATETIME,
    datetime.date: _DATE,
    uuid.UUID: _UUID,
}


def describe_annotation(annotation: object) -> str:
    """An annotation as a message writes it: ``int``, ``list[int]``."""
    if isinstance(annotation, type) and get_origin(annotation) is None:
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def compile_annotation(annotation: Any) -> Node:
    """The node for ``annotation``, or ``CannotHandle`` saying what to write instead."""
    while hasattr(annotation, "__supertype__"):  # typing.NewType
        annotation = annotation.__supertype__
    if annotation is None:
        annotation = type(None)
    if annotation is Any or annotation is object:
        raise CannotHandle(
            "the codec cannot tell what type to rebuild on decode; annotate the concrete type"
        )
    try:
        scalar = _SCALARS.get(annotation)
    except TypeError:  # unhashable: not a type at all
        scalar = None
    if scalar is not None:
        return scalar
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return _compile_literal(args)
    if origin is Union or origin is types.UnionType:
        others = [a for a in args if a is not type(None)]
        if len(others) != 1 or len(others) == len(args):
            raise CannotHandle(
                "only `X | None` unions are supported; a union of several types is "
                "ambiguous to decode"
            )
        return _Optional(compile_annotation(others[0]))
    if origin is list or annotation is list:
        if len(args) != 1:
            raise CannotHandle("give the item type, e.g. list[int]")
        return _List(compile_annotation(args[0]))
    if origin is tuple or annotation is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _Tuple((compile_annotation(args[0]),), variadic=True)
        if annotation == tuple[()]:
            return _Tuple((), variadic=False)
        if not args or Ellipsis in args:
            raise CannotHandle("give the item types, e.g. tuple[int, ...] or tuple[str, int]")
        return _Tuple(tuple(compile_annotation(a) for a in args), variadic=False)
    if isinstance(annotation, type) and origin is None:
        return _compile_class(annotation)
    if isinstance(origin, type):  # dict[str, int], set[str] and the like
        return _compile_class(origin)
    raise CannotHandle("the codec has no conversion for it")


def _compile_literal(args: tuple[Any, ...]) -> Node:
    seen: list[object] = []
    for arg in args:
        stored_form = arg.value if isinstance(arg, enum.Enum) else arg
        if type(stored_form) not in JSON_SCALARS or isinstance(stored_form, float):
            raise CannotHandle(
                f"Literal value {arg!r} is not a str, int, bool, None or such an Enum member"
            )
        if any(_literal_match(other, stored_form) for other in seen):
            raise CannotHandle(f"Literal values store {stored_form!r} twice; decode is ambiguous")
        seen.append(stored_form)
    return _Literal(args)


def _compile_class(cls: type) -> Node:
    if issubclass(cls, enum.Enum):
        for member in cls:
            if type(member.value) not in JSON_SCALARS:
                raise CannotHandle(
                    f"member {cls.__qualname__}.{member.name} has a "
                    f"{type(member.value).__qualname__} value; enum values must be str, int, "
                    "float, bool or None"
                )
        return _Enum(cls)
    if dataclasses.is_dataclass(cls):
        raise CannotHandle(
            "nested dataclasses are not supported; flatten its fields into the event "
            "or store its identifier"
        )
    if issubclass(cls, models.Model):
        raise CannotHandle("store the model instance's primary key instead")
    if issubclass(cls, dict):
        raise CannotHandle("dicts are not supported; declare the keys as fields of the event")
    if issubclass(cls, (set, frozenset)):
        raise CannotHandle("sets are not supported; use a sorted tuple[X, ...]")
    if issubclass(cls, (bytes, bytearray)):
        raise CannotHandle("bytes are not supported; store a str (e.g. base64) instead")
    raise CannotHandle("the codec has no conversion for it")


def _bool_detail(value: object) -> str:
    return "; bool is not accepted as a number" if isinstance(value, bool) else ""


def is_supported_value(value: object) -> bool:
    """Whether ``value``'s type is one the codec stores (to say so when it is not)."""
    supported = (*JSON_SCALARS, decimal.Decimal, datetime.date, uuid.UUID, enum.Enum, list, tuple)
    return isinstance(value, supported)
