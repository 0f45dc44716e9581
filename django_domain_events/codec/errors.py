"""What the codec raises, and how it names a value in a message."""

from __future__ import annotations

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


def short_repr(value: object) -> str:
    """``repr(value)``, cut to a length a message can carry."""
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def type_name(value: object) -> str:
    """The name of ``value``'s type, as a message shows it."""
    return type(value).__qualname__
