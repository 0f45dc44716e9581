"""Operations that read rows and then write them: the write re-checks what was read.

Each race is forced rather than hoped for. In one process, the other side's write is
run just before the operation's own write statement (``just_before``), on every
database. On PostgreSQL, a real child process runs the operation while this test holds
the lock the other side would hold, and the test lets go only once the child waits
on it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    drain_outbox,
    prune_events,
    purge_dead,
    receiver,
    replay_events,
    requeue_dead,
)
from django_domain_events.models import DeliveryRecord, EventRecord, ReceiverMark
from tests.app.events import OrderPlaced
from tests.conftest import needs_postgresql, start_child, wait_until_blocked
from tests.support import failing, fire_one, just_before

pytestmark = pytest.mark.django_db

RACERS: dict[str, Callable[[list[int]], object]] = {
    "replay": lambda ids: replay_events(ids),
    "requeue": lambda ids: requeue_dead(),
}


def dead_events(count: int) -> list[int]:
    receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(count)]
    drain_outbox()
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.DEAD).count() == count
    return ids


def settled_with_a_mark(newer_by: timedelta) -> tuple[ReceiverMark, object]:
    """A prunable event whose receiver succeeded, and an older mark for that receiver;
    returns the mark and the success time the prune will want to record."""
    receiver(OrderPlaced, key="t.marked")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    succeeded = DeliveryRecord.objects.get(event_id=event_id).succeeded_at
    then = timezone.now() - timedelta(days=100)
    EventRecord.objects.filter(pk=event_id).update(recorded_at=then, occurred_at=then)
    mark = ReceiverMark.objects.create(
        receiver_key="t.marked", last_succeeded_at=succeeded - newer_by
    )
    return mark, succeeded


# In one process, on every database ---------------------------------------------------


@pytest.mark.parametrize("racer", sorted(RACERS))
def test_purge_leaves_rows_reopened_between_its_read_and_its_delete(racer: str) -> None:
    ids = dead_events(3)
    with just_before("DELETE", DeliveryRecord, lambda: RACERS[racer](ids)):
        assert purge_dead(all=True) == 0
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING).count() == 3


def test_purge_deletes_the_rows_still_dead_at_its_delete() -> None:
    ids = dead_events(3)
    with just_before("DELETE", DeliveryRecord, lambda: requeue_dead(limit=1)):
        assert purge_dead(all=True) == 2
    assert DeliveryRecord.objects.get().event_id == ids[0]


def test_a_prune_never_moves_a_mark_back_that_moved_on_after_its_read() -> None:
    mark, succeeded = settled_with_a_mark(newer_by=timedelta(days=1))
    later = succeeded + timedelta(hours=1)
    move_on = lambda: ReceiverMark.objects.filter(pk=mark.pk).update(last_succeeded_at=later)  # noqa: E731
    with just_before("UPDATE", ReceiverMark, move_on):
        assert prune_events() == 1
    assert ReceiverMark.objects.get(pk=mark.pk).last_succeeded_at == later


def test_a_prune_moves_an_older_mark_forward() -> None:
    mark, succeeded = settled_with_a_mark(newer_by=timedelta(days=1))
    assert prune_events() == 1
    assert ReceiverMark.objects.get(pk=mark.pk).last_succeeded_at == succeeded


# Real processes on PostgreSQL ----------------------------------------------------------


@needs_postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("racer", sorted(RACERS))
def test_a_purge_racing_a_reopening_keeps_the_reopened_rows(racer: str) -> None:
    ids = dead_events(100)
    with transaction.atomic():
        RACERS[racer](ids)  # holds the events and the rows until this block commits
        purge = start_child("command", "dead_letters", "purge", "--all")
        wait_until_blocked(purge)  # it read the rows dead, and waits to delete them
    out, err = purge.communicate(timeout=60)
    assert purge.returncode == 0, err
    assert out.strip() == "Purged: 0"
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING).count() == 100


@needs_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_prune_racing_a_newer_mark_never_moves_it_back() -> None:
    mark, succeeded = settled_with_a_mark(newer_by=timedelta(days=1))
    later = succeeded + timedelta(hours=1)
    with transaction.atomic():
        ReceiverMark.objects.select_for_update().get(pk=mark.pk)
        prune = start_child("prune")
        wait_until_blocked(prune)  # it read the old mark, and waits to write its own
        ReceiverMark.objects.filter(pk=mark.pk).update(last_succeeded_at=later)
    out, err = prune.communicate(timeout=60)
    assert prune.returncode == 0, err
    assert out.strip() == "1"
    assert ReceiverMark.objects.get(pk=mark.pk).last_succeeded_at == later
