"""Command-line arguments the operations commands share, each checked with a sentence.

Every check runs before the command changes anything, and says what to give instead:
a number the database or the clock cannot hold, a receiver or an event name that can
match no row, is refused rather than ending in a traceback or in a silent no-op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

from django.core.management.base import CommandError

from ..declare import registry
from ..models import DeliveryRecord, EventRecord

#: The largest integer a 64-bit signed column (ids, counts, LIMITs) holds.
MAX_INTEGER = 2**63 - 1

#: The longest window in days: a thousand years, well inside what the clock can subtract.
MAX_DAYS = 365_000


def _listing(names: Sequence[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def known_receiver(key: str) -> str:
    """``key`` if it is declared or named by a row; otherwise a ``CommandError``."""
    if (
        registry.receiver(key) is None
        and not DeliveryRecord.objects.filter(receiver_key=key).exists()
    ):
        known = [r.key for r in registry.receivers if r.durable]
        raise CommandError(
            f"No receiver {key!r} is declared and no delivery names it. "
            f"Durable receivers: {_listing(known)}."
        )
    return key


def receiver_of_events(key: str, event_ids: Sequence[int], *, or_rows: bool) -> str:
    """``key`` if it can have work for these events: a durable receiver owed one of them
    or, with ``or_rows``, the key of one of their rows (a receiver since removed)."""
    names = set(EventRecord.objects.filter(pk__in=event_ids).values_list("name", flat=True))
    owed = set()
    for name in names:
        declared = registry.event_named(name)
        if declared is not None:
            owed |= {r.key for r in registry.receivers_for(declared.event_class) if r.durable}
    if or_rows:
        rows = DeliveryRecord.objects.filter(event_id__in=event_ids)
        owed |= set(rows.values_list("receiver_key", flat=True).distinct())
    if key not in owed:
        declared_receiver = registry.receiver(key)
        why = ""
        if declared_receiver is not None and not declared_receiver.durable:
            why = f" (it is {declared_receiver.mode.name}, so it never has deliveries)"
        raise CommandError(
            f"Receiver {key!r} is owed none of the events {', '.join(map(str, event_ids))} "
            f"({_listing(list(names))}){why}; nothing was changed. Their receivers: "
            f"{_listing(list(owed))}."
        )
    return key


def known_event_name(name: str) -> str:
    """``name`` if it is declared or in the log; otherwise a ``CommandError``."""
    if registry.event_named(name) is None and not EventRecord.objects.filter(name=name).exists():
        declared = [e.name for e in registry.events]
        raise CommandError(
            f"No event named {name!r} is declared or in the log; nothing was changed. "
            f"Declared events: {_listing(declared)}."
        )
    return name


def existing_events(ids: list[int]) -> list[int]:
    """``ids`` if every one is in the event log; otherwise a ``CommandError`` naming the rest."""
    for value in ids:
        integer(value, "ID")
    found = set(EventRecord.objects.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [i for i in ids if i not in found]
    if missing:
        raise CommandError(
            f"No event {', '.join(map(str, missing))} in the log (pruned, or never fired); "
            "nothing was changed."
        )
    return ids


def integer(value: int | None, flag: str, *, least: int = 0) -> int | None:
    """``value`` if it is at least ``least`` and fits a 64-bit column; None passes."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_INTEGER:
        raise CommandError(
            f"{flag} must be a whole number from {least} to {MAX_INTEGER}, not {value}."
        )
    return value


def non_negative(value: int | None, flag: str) -> int | None:
    return integer(value, flag, least=0)


def positive(value: int | None, flag: str) -> int | None:
    return integer(value, flag, least=1)


def days(value: float | None, flag: str, *, positive: bool = False) -> timedelta | None:
    """``value`` days as a timedelta: finite, 0 (or above 0 when ``positive``) to
    ``MAX_DAYS``, so that the clock can subtract it; None passes."""
    if value is None:
        return None
    low = "above 0, up to" if positive else "from 0 to"
    if (
        not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or value > MAX_DAYS
    ):
        raise CommandError(f"{flag} must be a number of days {low} {MAX_DAYS}, not {value:g}.")
    return timedelta(days=value)
