"""The payload ``fire()`` writes and the event a relay rebuilds from it, across versions
of the event's class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import PayloadDecodeError, PayloadUpgradeFailed, short_repr, type_name
from .setting import PayloadCodec, get_codec
from .storable import check_storable


def encode_event(evt: object) -> dict[str, Any]:
    """The payload ``fire()`` writes: the codec's encoding, checked by ``check_storable``."""
    payload = get_codec().encode(evt)
    check_storable(payload, type(evt).__qualname__, fields=True)
    return payload


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
    hook, then decode it: old rows must keep delivering after the class changes. A payload
    written by newer code than this is refused: this code cannot know what it means."""
    name = event_class.__qualname__
    if stored_version > current_version:
        raise PayloadDecodeError(
            f"Cannot decode {name}: the stored payload is version {stored_version}, newer "
            f"than the version {current_version} this code declares (it was fired by a newer "
            "release). Deploy the code that declares the newer version before running its "
            "receivers, then requeue the dead letter."
        )
    if upgrade is not None and stored_version < current_version:
        payload = _upgraded(name, payload, stored_version, current_version, upgrade)
    return codec.decode(event_class, payload)


def _upgraded(
    name: str,
    payload: dict[str, Any],
    stored_version: int,
    current_version: int,
    upgrade: Callable[[dict[str, Any], int], dict[str, Any]],
) -> dict[str, Any]:
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
            f"{short_repr(upgraded)} ({type_name(upgraded)}), not a dict; it must return "
            "the upgraded payload."
        )
    return upgraded
