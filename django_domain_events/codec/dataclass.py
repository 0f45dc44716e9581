"""The dataclass codec: a flat frozen dataclass stored as a JSON object of its fields,
every value checked against its annotation's node on the way in and on the way out."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, get_type_hints

from .errors import PayloadDecodeError, UnsupportedPayloadType, short_repr, type_name
from .nodes import (
    SUPPORTED_TYPES,
    CannotHandle,
    Mismatch,
    Node,
    compile_annotation,
    describe_annotation,
    is_supported_value,
)


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    annotation: str
    node: Node | None
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
                f"{type(self).__name__} encodes dataclass instances, not {short_repr(evt)} "
                f"({type_name(evt)}); fire an instance of a frozen dataclass event."
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
                    f"{type_name(value)}. Supported types: {SUPPORTED_TYPES}."
                )
            try:
                payload[f.name] = f.node.encode(value, f.name)
            except Mismatch as exc:
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
                f"Cannot decode {name}: the stored payload is {short_repr(payload)} "
                f"({type_name(payload)}), not a dict of field values."
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
            except Mismatch as exc:
                raise PayloadDecodeError(
                    f"Cannot decode {name}.{exc.path}: expected {exc.expected}, but the stored "
                    f"value is {short_repr(exc.value)} ({type_name(exc.value)}){exc.detail}. "
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
                node: Node | None = compile_annotation(annotation)
                hint = ""
            except CannotHandle as exc:
                node, hint = None, exc.hint
            found.append(_Field(f.name, describe_annotation(annotation), node, hint, required))
        return _Plan(tuple(found))

    def _encode_mismatch(self, cls: type, f: _Field, exc: Mismatch) -> str:
        value = exc.value
        message = (
            f"Cannot encode {cls.__qualname__}.{exc.path}: expected {exc.expected}, got "
            f"{short_repr(value)} ({type_name(value)}){exc.detail}."
        )
        if not is_supported_value(value):
            message += (
                f" {type_name(value)} is not a supported payload type; "
                f"supported types: {SUPPORTED_TYPES}."
            )
        if exc.path != f.name:
            return message + f" The field is declared {f.annotation}."
        if exc.detail:
            return message
        return message + f" Pass a value of the declared type {f.annotation}."
