"""The lapse rule (``delivery/lapse.py``): what claiming a row whose lease lapsed costs it.

The same cases run against each database's claim (PostgreSQL's one statement, the
portable claim on MariaDB and SQLite), so the two implementations are tested as one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import DeliveryStatus, deliver_pending, fire, receiver
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.delivery.run import attempt
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 30


def fire_rows(count: int, key: str = "t.lapse", **options: Any) -> list[int]:
    receiver(OrderPlaced, key=key, lease_seconds=LEASE, **options)(lambda evt: None)
    ids = []
    for n in range(count):
        with transaction.atomic():
            fire(OrderPlaced(order_id=n))
        ids.append(DeliveryRecord.objects.latest("id").pk)
    return ids


def claim(worker: str, seconds: float = 0, **options: Any) -> list[Any]:
    """Claim at ``seconds`` from now (a lapse is ``LEASE`` + 1 away)."""
    options.setdefault("limit", 10)
    now = timezone.now() + timedelta(seconds=seconds)
    return claim_batch(worker_id=worker, now=now, lease=LEASE, **options)


def attempts(ids: list[int]) -> list[int]:
    rows = dict(DeliveryRecord.objects.filter(pk__in=ids).values_list("pk", "attempts"))
    return [rows[pk] for pk in ids]


def test_rows_run_at_once_are_each_charged_and_each_taken_alone() -> None:
    """A relay's pool runs every row of its claim at once: a crash charges each row it
    still held, none of those it finished, and each charged row comes back alone."""
    ids = fire_rows(4)
    held = claim("pool", at_once=True)
    assert attempt(held[0], now=timezone.now())[0] == DeliveryStatus.SUCCEEDED
    taken = [claim("w2", LEASE + 1) for _ in range(3)]
    assert [[c.id for c in batch] for batch in taken] == [[ids[1]], [ids[2]], [ids[3]]]
    assert all(batch[0].alone for batch in taken)
    assert attempts(ids) == [1, 1, 1, 1]


def test_a_lapsed_row_never_hands_back_a_sibling_whose_lease_is_alive() -> None:
    """A hung row of a pool lapses while its sibling runs under a live lease: the takeover
    charges the hung row, and leaves the sibling with the relay that runs it."""
    ids = fire_rows(2)
    claim("pool", at_once=True)
    alive = timezone.now() + timedelta(seconds=LEASE + 60)  # as the heartbeat renews it
    DeliveryRecord.objects.filter(pk=ids[1]).update(lease_expires_at=alive, available_at=alive)
    (taken,) = claim("w2", LEASE + 1)
    assert (taken.id, taken.attempts) == (ids[0], 1)
    sibling = DeliveryRecord.objects.get(pk=ids[1])
    assert (sibling.status, sibling.claimed_by, sibling.attempts) == (
        DeliveryStatus.CLAIMED,
        "pool",
        0,
    )


def test_a_charged_row_is_claimed_alone_and_only_when_the_relay_may_run_it_alone() -> None:
    ids = fire_rows(3)
    claim("dead")  # a batch run in order: it died running the first row
    assert claim("busy-pool", LEASE + 1, alone_ok=False) == []  # the charged row waits
    (alone,) = claim("w2", LEASE + 1)
    assert (alone.id, alone.attempts, alone.alone) == (ids[0], 1, True)
    rest = claim("w3", LEASE + 1)  # handed back uncharged when the first was charged
    assert [(c.id, c.attempts, c.alone) for c in rest] == [(ids[1], 0, False), (ids[2], 0, False)]


def test_rows_before_a_charged_row_are_claimed_without_it() -> None:
    ids = fire_rows(2)
    claim("dead", ids=ids[1:])
    DeliveryRecord.objects.filter(pk=ids[0]).update(available_at=timezone.now())  # owed first
    (first,) = claim("w2", LEASE + 1)
    assert (first.id, first.alone) == (ids[0], False)  # the charged row after it waits
    (charged,) = claim("w3", LEASE + 1)
    assert (charged.id, charged.attempts, charged.alone) == (ids[1], 1, True)


def test_a_row_taken_alone_that_lapses_again_is_charged_again_and_dies_unrun() -> None:
    ids = fire_rows(1, max_attempts=2)
    claim("dead-1")
    claim("dead-2", LEASE + 1)  # charged once, taken alone, and its relay died again
    (spent,) = claim("w3", 2 * LEASE + 3)
    assert spent.attempts == 2
    assert attempt(spent, now=timezone.now())[0] == DeliveryStatus.DEAD
    row = DeliveryRecord.objects.get(pk=ids[0])
    assert (row.attempts, row.status) == (2, DeliveryStatus.DEAD)
    assert "lease lapsed on attempt 2 of 2" in row.last_error


class Queue:
    """A task queue no worker reads: what the relay sends is only counted."""

    sent: list[int] = []

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        Queue.sent.append(delivery_id)


@override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_lapse.Queue"})
def test_a_task_row_no_worker_takes_is_charged_at_each_lapse_and_ends_dead() -> None:
    Queue.sent = []
    receiver(OrderPlaced, key="t.task", site="task", max_attempts=3, lease_seconds=LEASE)(
        lambda evt: None
    )
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
    row = DeliveryRecord.objects.get()
    start = timezone.now()
    seen = []
    for lapse in range(8):
        deliver_pending(now=start + timedelta(seconds=lapse * (LEASE * 1.1 + 1)))
        row.refresh_from_db()
        seen.append((row.status, row.attempts))
    assert seen[:3] == [(DeliveryStatus.CLAIMED, n) for n in range(3)]
    assert seen[3:] == [(DeliveryStatus.DEAD, 3)] * 5
    assert "lease lapsed on attempt 3 of 3" in row.last_error
    assert len(Queue.sent) == 3  # one message per attempt, none after the last
