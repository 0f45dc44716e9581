"""Command-line arguments the operations commands share, each checked with a sentence."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ..declare import registry
from ..models import DeliveryRecord, EventRecord


def known_receiver(key: str) -> str:
    """``key`` if it is declared or named by a row; otherwise a ``CommandError``."""
    if (
        registry.receiver(key) is None
        and not DeliveryRecord.objects.filter(receiver_key=key).exists()
    ):
        known = ", ".join(r.key for r in registry.receivers if r.durable) or "none"
        raise CommandError(
            f"No receiver {key!r} is declared and no delivery names it. Durable receivers: {known}."
        )
    return key


def existing_events(ids: list[int]) -> list[int]:
    """``ids`` if every one is in the event log; otherwise a ``CommandError`` naming the rest."""
    found = set(EventRecord.objects.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [i for i in ids if i not in found]
    if missing:
        raise CommandError(
            f"No event {', '.join(map(str, missing))} in the log (pruned, or never fired); "
            "nothing was changed."
        )
    return ids


def non_negative(value: Any, flag: str) -> Any:
    if value is not None and value < 0:
        raise CommandError(f"{flag} must be 0 or more, not {value}.")
    return value


def positive(value: Any, flag: str) -> Any:
    if value is not None and value < 1:
        raise CommandError(f"{flag} must be at least 1, not {value}.")
    return value
