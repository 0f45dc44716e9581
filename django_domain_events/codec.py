"""Turning an event into a JSON payload and back, across versions of its class.

An event row outlives the code that wrote it: the class may gain, lose or retype fields
before the row is delivered. The codec therefore checks values on the way in (so a bad
payload fails the ``fire``, not the receiver weeks later) and says on the way out which
field of which stored payload no longer fits, and how to bridge it.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import types
import uuid
import weakref
from collections.abc import Callable
from typing import (
    Any,
    Literal,
    Protocol,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    runtime_checkable,
)

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import models
from django.utils.module_loading import import_string

from . import conf

__all__ = [
    "DataclassCodec",
    "PayloadCodec",
    "PayloadDecodeError",
    "PayloadUpgradeFailed",
    "UnsupportedPayloadType",
    "decode_event",
    "get_codec",
]

SUPPORTED_TYPES = (
    "str, int, float, bool, None, Decimal, datetime, date, UUID, Enum subclasses, "
    "Literal[...], and X | None, list[X], tuple[X, ...] or tuple[X, Y] of these"
)
_JSON_SCALARS = (str, int, float, bool, type(None))
_MAX_REPR = 120


class UnsupportedPayloadType(TypeError):
    """A field's value cannot be encoded; the message names event class, field, value type
    and the supported types."""


class PayloadDecodeError(ValueError):
    """A stored payload cannot be rebuilt into the current class: names the field, the
    expected type and the stored value."""


class PayloadUpgradeFailed(Exception):
    """An event's upgrade() hook raised or returned a non-dict; the original exception is
    the ``__cause__``."""


@runtime_checkable
class PayloadCodec(Protocol):
    """What ``DJANGO_DOMAIN_EVENTS['CODEC']`` must name: a class built with no arguments."""

    def encode(self, evt: object) -> dict[str, Any]:
        """The event as a JSON-safe dict; raise ``UnsupportedPayloadType`` if it cannot be."""
        ...

    def decode(self, event_class: type, payload: dict[str, Any]) -> Any:
        """An instance of ``event_class`` rebuilt from a stored payload."""
        ...

    def problems(self, event_class: type) -> list[str]:
        """Why ``event_class`` cannot round-trip (empty if it can), without running user code
        beyond resolving type hints: the system check calls this for every event."""
        ...


# ---------------------------------------------------------------- conversion nodes


class _Mismatch(Exception):
    """A value does not fit the node at ``path``; turned into a public error by the caller."""

    def __init__(self, path: str, expected: str, value: object, detail: str = "") -> None:
        super().__init__(path)
        self.path = path
        self.expected = expected
        self.value = value
        self.detail = detail


class _CannotHandle(Exception):
    """An annotation the codec has no conversion for; ``hint`` says what to write instead."""

    def __init__(self, hint: str) -> None:
        super().__init__(hint)
        self.hint = hint


class _Node:
    """The conversion for one annotation, compiled once per event class."""

    def describe(self) -> str:
        raise NotImplementedError

    def encode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def decode(self, stored: Any, path: str) -> Any:
        raise NotImplementedError

    def mismatch(self, path: str, value: object, detail: str = "") -> _Mismatch:
        return _Mismatch(path, self.describe(), value, detail)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class _Str(_Node):
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
class _Int(_Node):
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
class _Float(_Node):
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
class _Bool(_Node):
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
class _NoneNode(_Node):
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
class _Decimal(_Node):
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
class _DateTime(_Node):
    def describe(self) -> str:
        return "datetime"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, datetime.datetime):
            raise self.mismatch(path, value)
        return value.isoformat()

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        try:
            return datetime.datetime.fromisoformat(stored)
        except ValueError:
            raise self.mismatch(path, stored, "; it is not an ISO 8601 datetime") from None


@dataclasses.dataclass(frozen=True)
class _Date(_Node):
    def describe(self) -> str:
        return "date"

    def encode(self, value: Any, path: str) -> Any:
        # A datetime is a date too, but would not come back as one: refuse it.
        if not isinstance(value, datetime.date) or isinstance(value, datetime.datetime):
            raise self.mismatch(path, value)
        return value.isoformat()

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        try:
            return datetime.date.fromisoformat(stored)
        except ValueError:
            raise self.mismatch(path, stored, "; it is not an ISO 8601 date") from None


@dataclasses.dataclass(frozen=True)
class _UUID(_Node):
    def describe(self) -> str:
        return "UUID"

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, uuid.UUID):
            raise self.mismatch(path, value)
        return str(value)

    def decode(self, stored: Any, path: str) -> Any:
        if not isinstance(stored, str):
            raise self.mismatch(path, stored)
        try:
            return uuid.UUID(stored)
        except ValueError:
            raise self.mismatch(path, stored, "; it is not a UUID") from None


@dataclasses.dataclass(frozen=True)
class _Enum(_Node):
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
class _Literal(_Node):
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
class _Optional(_Node):
    inner: _Node

    def describe(self) -> str:
        return f"{self.inner.describe()} | None"

    def encode(self, value: Any, path: str) -> Any:
        if value is None:
            return None
        try:
            return self.inner.encode(value, path)
        except _Mismatch as exc:
            if exc.path != path:
                raise
            raise self.mismatch(path, value, exc.detail) from None

    def decode(self, stored: Any, path: str) -> Any:
        if stored is None:
            return None
        try:
            return self.inner.decode(stored, path)
        except _Mismatch as exc:
            if exc.path != path:
                raise
            raise self.mismatch(path, stored, exc.detail) from None


@dataclasses.dataclass(frozen=True)
class _List(_Node):
    item: _Node

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
class _Tuple(_Node):
    """``tuple[X, ...]`` when ``variadic``, else fixed ``tuple[X, Y]``; stored as a list."""

    items: tuple[_Node, ...]
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

    def _nodes(self, values: list[Any] | tuple[Any, ...], path: str) -> list[_Node]:
        if self.variadic:
            return [self.items[0]] * len(values)
        if len(values) != len(self.items):
            raise self.mismatch(
                path, values, f"; it has {len(values)} items, not {len(self.items)}"
            )
        return list(self.items)


_SCALARS: dict[object, _Node] = {
    str: _Str(),
    int: _Int(),
    float: _Float(),
    bool: _Bool(),
    type(None): _NoneNode(),
    decimal.Decimal: _Decimal(),
    datetime.datetime: _DateTime(),
    datetime.date: _Date(),
    uuid.UUID: _UUID(),
}


def _describe_annotation(annotation: object) -> str:
    if isinstance(annotation, type) and get_origin(annotation) is None:
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _compile(annotation: Any) -> _Node:
    """The node for ``annotation``, or ``_CannotHandle`` saying what to write instead."""
    while hasattr(annotation, "__supertype__"):  # typing.NewType
        annotation = annotation.__supertype__
    if annotation is None:
        annotation = type(None)
    if annotation is Any or annotation is object:
        raise _CannotHandle(
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
            raise _CannotHandle(
                "only `X | None` unions are supported; a union of several types is "
                "ambiguous to decode"
            )
        return _Optional(_compile(others[0]))
    if origin is list or annotation is list:
        if len(args) != 1:
            raise _CannotHandle("give the item type, e.g. list[int]")
        return _List(_compile(args[0]))
    if origin is tuple or annotation is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _Tuple((_compile(args[0]),), variadic=True)
        if annotation == tuple[()]:
            return _Tuple((), variadic=False)
        if not args or Ellipsis in args:
            raise _CannotHandle("give the item types, e.g. tuple[int, ...] or tuple[str, int]")
        return _Tuple(tuple(_compile(a) for a in args), variadic=False)
    if isinstance(annotation, type) and origin is None:
        return _compile_class(annotation)
    if isinstance(origin, type):  # dict[str, int], set[str] and the like
        return _compile_class(origin)
    raise _CannotHandle("the codec has no conversion for it")


def _compile_literal(args: tuple[Any, ...]) -> _Node:
    seen: list[object] = []
    for arg in args:
        stored_form = arg.value if isinstance(arg, enum.Enum) else arg
        if type(stored_form) not in _JSON_SCALARS or isinstance(stored_form, float):
            raise _CannotHandle(
                f"Literal value {arg!r} is not a str, int, bool, None or such an Enum member"
            )
        if any(_literal_match(other, stored_form) for other in seen):
            raise _CannotHandle(f"Literal values store {stored_form!r} twice; decode is ambiguous")
        seen.append(stored_form)
    return _Literal(args)


def _compile_class(cls: type) -> _Node:
    if issubclass(cls, enum.Enum):
        for member in cls:
            if type(member.value) not in _JSON_SCALARS:
                raise _CannotHandle(
                    f"member {cls.__qualname__}.{member.name} has a "
                    f"{type(member.value).__qualname__} value; enum values must be str, int, "
                    "float, bool or None"
                )
        return _Enum(cls)
    if dataclasses.is_dataclass(cls):
        raise _CannotHandle(
            "nested dataclasses are not supported; flatten its fields into the event "
            "or store its identifier"
        )
    if issubclass(cls, models.Model):
        raise _CannotHandle("store the model instance's primary key instead")
    if issubclass(cls, dict):
        raise _CannotHandle("dicts are not supported; declare the keys as fields of the event")
    if issubclass(cls, (set, frozenset)):
        raise _CannotHandle("sets are not supported; use a sorted tuple[X, ...]")
    if issubclass(cls, (bytes, bytearray)):
        raise _CannotHandle("bytes are not supported; store a str (e.g. base64) instead")
    raise _CannotHandle("the codec has no conversion for it")


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _bool_detail(value: object) -> str:
    return "; bool is not accepted as a number" if isinstance(value, bool) else ""


def _type_name(value: object) -> str:
    return type(value).__qualname__


# ---------------------------------------------------------------- the codec


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    annotation: str
    node: _Node | None
    hint: str  # why ``node`` is None
    required: bool


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one event class is encoded; ``problem`` is set when the class as a whole is not."""

    fields: tuple[_Field, ...]
    problem: str = ""


class DataclassCodec:
    """Stores a flat frozen dataclass as a JSON object of its fields, checking every value."""

    def __init__(self) -> None:
        self._plans: weakref.WeakKeyDictionary[type, _Plan] = weakref.WeakKeyDictionary()

    def encode(self, evt: object) -> dict[str, Any]:
        """The event's ``init`` fields as JSON-safe values; raises ``UnsupportedPayloadType``."""
        if isinstance(evt, type) or not dataclasses.is_dataclass(evt):
            raise UnsupportedPayloadType(
                f"{type(self).__name__} encodes dataclass instances, not {_short_repr(evt)} "
                f"({_type_name(evt)}); fire an instance of a frozen dataclass event."
            )
        cls = type(evt)
        plan = self._plan(cls)
        if plan.problem:
            raise UnsupportedPayloadType(plan.problem)
        payload: dict[str, Any] = {}
        for f in plan.fields:
            value = getattr(evt, f.name)
            if f.node is None:
                raise UnsupportedPayloadType(
                    f"Cannot encode {cls.__qualname__}.{f.name}: its annotation {f.annotation} "
                    f"is not supported by {type(self).__name__} ({f.hint}), and the value is a "
                    f"{_type_name(value)}. Supported types: {SUPPORTED_TYPES}."
                )
            try:
                payload[f.name] = f.node.encode(value, f.name)
            except _Mismatch as exc:
                raise UnsupportedPayloadType(self._encode_mismatch(cls, f, exc)) from None
        return payload

    def decode(self, event_class: type, payload: dict[str, Any]) -> Any:
        """An ``event_class`` rebuilt from ``payload``: missing fields take their defaults,
        unknown keys are ignored, anything else that does not fit is a PayloadDecodeError."""
        plan = self._plan(event_class)
        name = event_class.__qualname__
        if plan.problem:
            raise UnsupportedPayloadType(plan.problem)
        if not isinstance(payload, dict):
            raise PayloadDecodeError(
                f"Cannot decode {name}: the stored payload is {_short_repr(payload)} "
                f"({_type_name(payload)}), not a dict of field values."
            )
        kwargs: dict[str, Any] = {}
        for f in plan.fields:
            if f.node is None:
                raise UnsupportedPayloadType(
                    f"Cannot decode {name}.{f.name}: its annotation {f.annotation} is not "
                    f"supported by {type(self).__name__} ({f.hint}). "
                    f"Supported types: {SUPPORTED_TYPES}."
                )
            if f.name not in payload:
                if f.required:
                    raise PayloadDecodeError(
                        f"Cannot decode {name}.{f.name}: the stored payload has no {f.name!r} "
                        "key and the field has no default (an added field without a default). "
                        "Give the field a default, or bump the event's version and fill the "
                        "key in its upgrade() hook."
                    )
                continue
            stored = payload[f.name]
            try:
                kwargs[f.name] = f.node.decode(stored, f.name)
            except _Mismatch as exc:
                raise PayloadDecodeError(
                    f"Cannot decode {name}.{exc.path}: expected {exc.expected}, but the stored "
                    f"value is {_short_repr(exc.value)} ({_type_name(exc.value)}){exc.detail}. "
                    "If the field's type changed, bump the event's version and convert old "
                    "payloads in its upgrade() hook."
                ) from None
        return event_class(**kwargs)

    def problems(self, event_class: type) -> list[str]:
        """One sentence per field this codec cannot round-trip; empty when all is well."""
        plan = self._plan(event_class)
        if plan.problem:
            return [plan.problem]
        return [
            f"{event_class.__qualname__}.{f.name} is annotated {f.annotation}, which "
            f"{type(self).__name__} cannot store: {f.hint}. Supported types: {SUPPORTED_TYPES}."
            for f in plan.fields
            if f.node is None
        ]

    def _plan(self, event_class: type) -> _Plan:
        plan = self._plans.get(event_class)
        if plan is None:
            plan = self._plans[event_class] = self._build_plan(event_class)
        return plan

    def _build_plan(self, event_class: type) -> _Plan:
        name = getattr(event_class, "__qualname__", repr(event_class))
        if not isinstance(event_class, type) or not dataclasses.is_dataclass(event_class):
            return _Plan(
                (),
                f"{name} is not a dataclass; {type(self).__name__} stores an event's "
                "dataclass fields. Make it a frozen dataclass (@event does this).",
            )
        try:
            hints = get_type_hints(event_class)
        except Exception as exc:
            return _Plan(
                (),
                f"The type hints of {name} cannot be resolved ({type(exc).__name__}: {exc}). "
                "Import every name used in its annotations at module level.",
            )
        found: list[_Field] = []
        for f in dataclasses.fields(event_class):
            if not f.init:  # derived in __post_init__: neither stored nor passed back
                continue
            annotation = hints.get(f.name, f.type)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            try:
                node: _Node | None = _compile(annotation)
                hint = ""
            except _CannotHandle as exc:
                node, hint = None, exc.hint
            found.append(_Field(f.name, _describe_annotation(annotation), node, hint, required))
        return _Plan(tuple(found))

    def _encode_mismatch(self, cls: type, f: _Field, exc: _Mismatch) -> str:
        value = exc.value
        message = (
            f"Cannot encode {cls.__qualname__}.{exc.path}: expected {exc.expected}, got "
            f"{_short_repr(value)} ({_type_name(value)}){exc.detail}."
        )
        if not _is_supported_value(value):
            message += (
                f" {_type_name(value)} is not a supported payload type; "
                f"supported types: {SUPPORTED_TYPES}."
            )
        if exc.path != f.name:
            return message + f" The field is declared {f.annotation}."
        if exc.detail:
            return message
        return message + f" Pass a value of the declared type {f.annotation}."


def _is_supported_value(value: object) -> bool:
    supported = (*_JSON_SCALARS, decimal.Decimal, datetime.date, uuid.UUID, enum.Enum, list, tuple)
    return isinstance(value, supported)


# ---------------------------------------------------------------- what the databases store

#: Deepest nesting of lists and dicts stored in a payload or a scope. Deeper structures
#: are refused: decoding them would exhaust the consumer's recursion limit.
MAX_DEPTH = 64

_Found = tuple[list[str | int], str]  # the path to the bad value (innermost first), why


def text_problem(text: str) -> str:
    """Why no supported database stores ``text`` as given ("" when one would): PostgreSQL
    refuses NUL in text and JSON, and a lone surrogate is no UTF-8 at all."""
    if "\x00" in text:
        return (
            "contains a NUL character (\\x00), which PostgreSQL cannot store; remove it, "
            "or store binary data base64-encoded"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start]
            return (
                f"contains a lone surrogate ({bad!r}), which is not Unicode text and no "
                "database stores; decode the source with errors='replace', or fix its encoding"
            )
    return ""


def _unstorable(value: Any, depth: int) -> _Found | None:
    """The first value (a walk in order) that the databases would not store alike."""
    if isinstance(value, str):
        problem = text_problem(value)
        return ([], problem) if problem else None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return [], f"is {value!r}, which JSON cannot store; store None or a string instead"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    if depth >= MAX_DEPTH:
        return [], f"nests lists and dicts deeper than {MAX_DEPTH} levels; flatten it"
    for key, item in items:
        if isinstance(key, str):
            problem = text_problem(key)
            if problem:
                return [], f"has a key {_short_repr(key)} that {problem}"
        if item is None or isinstance(item, int):
            continue
        if isinstance(item, str) and item.isascii() and "\x00" not in item:
            continue  # the usual value, checked without a call
        found = _unstorable(item, depth + 1)
        if found is not None:
            found[0].append(key)
            return found
    return None


def check_storable(value: Any, root: str, *, fields: bool = False) -> None:
    """Refuse what PostgreSQL, MariaDB/MySQL and SQLite would not all store and give back
    as it is: NUL or a lone surrogate in any string (keys too), NaN or infinity, nesting
    deeper than ``MAX_DEPTH``. One walk over the JSON-ready value, before any write.

    ``root`` names the value in the error (``OrderPlaced``, ``scope``); with ``fields``
    its own keys are written as attributes (``OrderPlaced.note``).
    """
    found = _unstorable(value, 1)
    if found is None:
        return
    steps, problem = found
    path = root
    for depth, step in enumerate(reversed(steps)):
        path += f".{step}" if fields and depth == 0 else f"[{step!r}]"
    raise UnsupportedPayloadType(f"Cannot store {path}: it {problem}.")


def encode_event(evt: object) -> dict[str, Any]:
    """The payload ``fire()`` writes: the codec's encoding, checked by ``check_storable``."""
    payload = get_codec().encode(evt)
    check_storable(payload, type(evt).__qualname__, fields=True)
    return payload


# ---------------------------------------------------------------- versions and settings


def decode_event(
    codec: PayloadCodec,
    event_class: type,
    payload: dict[str, Any],
    *,
    stored_version: int,
    current_version: int,
    upgrade: Callable[[dict[str, Any], int], dict[str, Any]] | None,
) -> Any:
    """Bring a payload written under an older version up to date with the class's upgrade()
    hook, then decode it: old rows must keep delivering after the class changes."""
    if upgrade is not None and stored_version < current_version:
        name = event_class.__qualname__
        try:
            upgraded: object = upgrade(dict(payload), stored_version)
        except Exception as exc:
            raise PayloadUpgradeFailed(
                f"{name}.upgrade(payload, from_version={stored_version}) raised "
                f"{type(exc).__name__}: {exc} while upgrading a version {stored_version} "
                f"payload to version {current_version}. Fix the hook so that it accepts this "
                "payload."
            ) from exc
        if not isinstance(upgraded, dict):
            raise PayloadUpgradeFailed(
                f"{name}.upgrade(payload, from_version={stored_version}) returned "
                f"{_short_repr(upgraded)} ({_type_name(upgraded)}), not a dict; it must return "
                "the upgraded payload."
            )
        payload = upgraded
    return codec.decode(event_class, payload)


_codec: PayloadCodec | None = None


def get_codec() -> PayloadCodec:
    """The codec named by the CODEC setting, instantiated once (cache reset when settings
    change)."""
    global _codec
    if _codec is None:
        path = conf.get().CODEC
        setting = f"{conf.SETTINGS_NAME}['CODEC'] = {path!r}"
        try:
            codec_class = import_string(path)
        except Exception as exc:
            raise ImproperlyConfigured(
                f"{setting} cannot be imported ({type(exc).__name__}: {exc}). Point it at a "
                "codec class, e.g. 'django_domain_events.codec.DataclassCodec'."
            ) from exc
        try:
            instance = codec_class()
        except Exception as exc:
            raise ImproperlyConfigured(
                f"{setting} could not be instantiated with no arguments "
                f"({type(exc).__name__}: {exc}); CODEC must name a class, not an instance."
            ) from exc
        missing = [m for m in ("encode", "decode") if not callable(getattr(instance, m, None))]
        if missing:
            raise ImproperlyConfigured(
                f"{setting} has no {' or '.join(m + '()' for m in missing)} method; a codec "
                "needs encode(evt) -> dict and decode(event_class, payload) -> event."
            )
        _codec = instance
    return _codec


def _reset_codec(*, setting: str, **kwargs: object) -> None:
    global _codec
    if setting == conf.SETTINGS_NAME:
        _codec = None


setting_changed.connect(_reset_codec)
