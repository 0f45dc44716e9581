"""Small helpers shared by the scheduled-reactions tests (seed 000)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from django_domain_events import event
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.support import command as run_command
from tests.support import fire_one as fire_one  # re-exported for the scheduled tests


@event(name="scheduled.OfferMade")
@dataclass(frozen=True)
class OfferMade:
    """The seed's event: an offer was made (its receivers are declared per test)."""

    offer_id: int


@dataclass
class Offer:
    """Stands in for the seed's Offer model: the tests keep offers in a dict."""

    expires_at: datetime
    accepted: bool = False
    expired: bool = False

    def expire(self) -> None:
        self.expired = True


def now() -> datetime:
    """The real clock, aware or naive local time as ``USE_TZ`` says."""
    return timezone.now()


def event_row(event_id: int) -> EventRecord:
    return EventRecord.objects.get(pk=event_id)


def row(event_id: int, key: str | None = None) -> DeliveryRecord:
    """The single delivery row of ``event_id`` (for ``key`` when given)."""
    rows = DeliveryRecord.objects.filter(event_id=event_id)
    if key is not None:
        rows = rows.filter(receiver_key=key)
    return rows.get()


def due_of(event_id: int, key: str | None = None) -> datetime:
    return row(event_id, key).due_at


def project_time(value: datetime) -> datetime:
    """``value`` in the project's convention: unchanged under USE_TZ, naive local otherwise."""
    if not settings.USE_TZ and timezone.is_aware(value):
        return timezone.make_naive(value)
    return value


def command(*args: str) -> str:
    """What a management command printed, without the trailing newline."""
    return run_command(*args).strip()


def total(counts: dict[Any, int]) -> int:
    return sum(counts.values())


HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
