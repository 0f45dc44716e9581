"""Section 15: priorities under a saturating stream, on one relay.

A producer keeps a backlog of priority-10 rows owed (topping it up whenever it falls
below ``BACKLOG``) while a priority-0 row is fired every ``TRICKLE_SECONDS``; one relay
claims batch after batch (``deliver_pending(limit=BATCH)``, in the same thread, between
top-ups). The wait of each row is ``succeeded_at - due_at``. With aging, a priority-0 row
goes before every row due more than ``PRIORITY_AGING_SECONDS`` after it, so its wait is
bounded by the aging plus the time to run what was already owed ahead of it (the
priority-10 rows' own wait); strict priority would starve it for the whole run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.test import override_settings

from django_domain_events import clock, deliver_pending, fire, receiver, registry
from django_domain_events.models import DeliveryRecord, DeliveryStatus

from .events import Tick, Trickle

URGENT_KEY, TRICKLE_KEY = "bench.urgent", "bench.trickle"
AGING_SECONDS = 3.0
BACKLOG = 400  # priority-10 rows kept owed: the relay never runs out of them
BATCH = 50
TRICKLE_SECONDS = 0.25


@dataclass(frozen=True)
class Waits:
    """Seconds from due to success, per priority."""

    urgent: list[float]
    trickle: list[float]
    unrun_age: float  # seconds the oldest priority-0 row still owed at the end had waited


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summary(values: list[float]) -> str:
    """p50 / p99 / max, in seconds."""
    if not values:
        return "none ran"
    return (
        f"p50 {statistics.median(values):.2f} s, p99 {_percentile(values, 0.99):.2f} s, "
        f"max {max(values):.2f} s"
    )


def starvation(seconds: float) -> Waits:
    """Run the stream for ``seconds``; the waits of every row that ran."""
    receiver(Tick, key=URGENT_KEY, priority=10)(lambda evt: None)
    receiver(Trickle, key=TRICKLE_KEY)(lambda evt: None)
    try:
        with override_settings(DJANGO_DOMAIN_EVENTS={"PRIORITY_AGING_SECONDS": AGING_SECONDS}):
            _stream(seconds)
        return _waits()
    finally:
        registry.forget(URGENT_KEY)
        registry.forget(TRICKLE_KEY)


def _stream(seconds: float) -> None:
    end = time.monotonic() + seconds
    next_trickle, n = time.monotonic(), 0
    while time.monotonic() < end:
        owed = DeliveryRecord.objects.filter(
            receiver_key=URGENT_KEY, status=DeliveryStatus.PENDING
        ).count()
        with transaction.atomic():
            for _ in range(max(0, BACKLOG - owed)):
                n += 1
                fire(Tick(n=n))
            if time.monotonic() >= next_trickle:
                fire(Trickle(n=n))
                next_trickle += TRICKLE_SECONDS
        deliver_pending(limit=BATCH, batch_size=BATCH)


def _waits() -> Waits:
    done = DeliveryRecord.objects.filter(status=DeliveryStatus.SUCCEEDED).annotate(
        wait=F("succeeded_at") - F("due_at")
    )

    def of(key: str) -> list[float]:
        return [
            w.total_seconds() for w in done.filter(receiver_key=key).values_list("wait", flat=True)
        ]

    oldest = (
        DeliveryRecord.objects.filter(receiver_key=TRICKLE_KEY)
        .exclude(status=DeliveryStatus.SUCCEEDED)
        .order_by("due_at")
        .values_list("due_at", flat=True)
        .first()
    )
    age = (clock.now() - oldest).total_seconds() if oldest is not None else 0.0
    return Waits(of(URGENT_KEY), of(TRICKLE_KEY), age)
