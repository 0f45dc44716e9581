"""Helpers for tests of code that fires events: drain the outbox, assert what was fired."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from . import clock
from .declare import registry
from .delivery.passes import Counts, deliver_pending
from .models import EventRecord

T = TypeVar("T")


def drain_outbox(
    limit: int | None = None, *, respect_backoff: bool = False, now: datetime | None = None
) -> Counts:
    """Deliver everything owed through the real delivery path, every lane.

    Backoff is skipped (a failing receiver reaches its dead letter in one call) unless
    ``respect_backoff``; a due time never is. ``now=`` moves the claims' clock forward.
    """
    return deliver_pending(
        limit,
        worker_id="drain_outbox",
        ignore_backoff=not respect_backoff,
        now=clock.normalize(now) if now is not None else None,
    )


def assert_fired(event_cls: type[T], *, times: int | None = None) -> list[T]:
    """The decoded events of ``event_cls`` in the event table, oldest first.

    Fails when none was fired, or when ``times`` is given and the count differs.
    """
    registered = registry.event_for_class(event_cls)
    if registered is None:
        raise TypeError(f"{event_cls.__qualname__} is not an @event class.")
    rows = EventRecord.objects.filter(name=registered.name).order_by("id")
    found: list[Any] = [
        registry.decode(row.name, row.payload, row.version) for row in rows.iterator()
    ]
    if times is None and not found:
        raise AssertionError(f"{registered.name} was never fired.")
    if times is not None and len(found) != times:
        raise AssertionError(f"{registered.name} was fired {len(found)} time(s), expected {times}.")
    return found
