"""Seed 000, "Replay": replay re-resolves the due time; requeue_dead makes a row due at once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    cancel_deliveries,
    deliver_pending,
    drain_outbox,
    event,
    receiver,
    replay_events,
    requeue_dead,
)
from django_domain_events.models import DeliveryRecord
from tests.scheduled.support import (
    DAY,
    MINUTE,
    SECOND,
    OfferMade,
    event_row,
    fire_one,
    row,
    total,
)

pytestmark = pytest.mark.django_db

EXPIRE = "offers.expire_offer"
SEND = "newsletters.send"
HOURS_48 = timedelta(hours=48)


@event(name="scheduled.replay.NewsletterScheduled")
@dataclass(frozen=True)
class NewsletterScheduled:
    newsletter_id: int


# When each newsletter is to go out, as the application knows it now.
SEND_AT: dict[int, object] = {}
CALLS: list[int] = []
EXPIRED: list[int] = []


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    SEND_AT.clear()
    CALLS.clear()
    EXPIRED.clear()


def send_time(evt: NewsletterScheduled) -> object:
    CALLS.append(evt.newsletter_id)
    chosen = SEND_AT[evt.newsletter_id]
    if isinstance(chosen, Exception):
        raise chosen
    return chosen


def declare_expiry(**options: Any) -> None:
    receiver(OfferMade, key=EXPIRE, due=HOURS_48, **options)(
        lambda evt: EXPIRED.append(evt.offer_id)
    )


def declare_newsletter() -> None:
    receiver(NewsletterScheduled, key=SEND, due=send_time)(lambda evt: None)


def test_replay_resolves_the_due_time_again_and_writes_the_later_of_that_and_now() -> None:
    """'replay_events resolves a scheduled receiver's due time again, through the same resolver
    fire() uses, and writes the later of that and now.'"""
    declare_expiry()
    event_id = fire_one(OfferMade(offer_id=1))
    due = event_row(event_id).occurred_at + HOURS_48
    drain_outbox(now=due + MINUTE)
    assert row(event_id).status == DeliveryStatus.SUCCEEDED
    assert replay_events([event_id]) == {"reopened": 1, "added": 0}
    replayed = row(event_id)
    assert replayed.status == DeliveryStatus.PENDING
    assert replayed.due_at == replayed.available_at == due  # later than now: its own time


def test_replay_calls_the_due_callable_again() -> None:
    """'A due callable is called again' (the same resolver fire() uses)."""
    declare_newsletter()
    SEND_AT[1] = timezone.now() + DAY
    event_id = fire_one(NewsletterScheduled(newsletter_id=1))
    drain_outbox(now=timezone.now() + DAY + MINUTE)
    SEND_AT[1] = timezone.now() + 7 * DAY  # the newsletter was moved
    replay_events([event_id])
    assert CALLS == [1, 1]
    assert row(event_id).due_at == SEND_AT[1]


def test_replay_adopts_a_scheduled_receiver_without_expiring_every_open_offer_at_once() -> None:
    """'Replay is how a scheduled receiver is adopted - declare the expiry, replay the offers
    made this week - and writing now would expire every open offer at once. An offer whose time
    has already passed is expired by the replay, owed from it.'"""
    recent = fire_one(OfferMade(offer_id=1), occurred_at=timezone.now() - DAY)
    old = fire_one(OfferMade(offer_id=2), occurred_at=timezone.now() - 3 * DAY)
    declare_expiry()  # deployed after the offers were made
    before = timezone.now()
    assert replay_events([recent, old]) == {"reopened": 0, "added": 2}
    after = timezone.now()
    assert row(recent).due_at == event_row(recent).occurred_at + HOURS_48
    assert row(recent).due_at > after
    assert before <= row(old).due_at <= after  # its time passed: owed from the replay
    assert row(old).available_at == row(old).due_at
    drain_outbox()
    assert EXPIRED == [2]
    assert row(recent).status == DeliveryStatus.PENDING


def test_a_due_callable_raising_during_replay_raises_to_the_operator_and_changes_nothing() -> None:
    """'A due callable is called again, and raises to the operator on the same terms as at fire
    time.'"""
    declare_newsletter()
    SEND_AT[1] = SEND_AT[2] = timezone.now() + DAY
    first = fire_one(NewsletterScheduled(newsletter_id=1))
    second = fire_one(NewsletterScheduled(newsletter_id=2))
    drain_outbox(now=timezone.now() + DAY + MINUTE)
    SEND_AT[2] = LookupError("newsletter 2 was deleted")
    with pytest.raises(LookupError, match="newsletter 2 was deleted"):
        replay_events([first, second])
    # The first event's row was not reopened either: the replay changed nothing.
    assert row(first).status == row(second).status == DeliveryStatus.SUCCEEDED


def test_a_due_callable_returning_something_invalid_on_replay_is_refused_as_at_fire() -> None:
    """'... raises to the operator on the same terms as at fire time.' (a non-datetime, and a
    naive datetime under USE_TZ = True)"""
    declare_newsletter()
    SEND_AT[1] = timezone.now() + DAY
    event_id = fire_one(NewsletterScheduled(newsletter_id=1))
    drain_outbox(now=timezone.now() + DAY + MINUTE)
    SEND_AT[1] = "tomorrow"
    with pytest.raises(TypeError, match=f"due= of {SEND}"):
        replay_events([event_id])
    naive = datetime.now() + DAY
    SEND_AT[1] = naive
    if settings.USE_TZ:
        with pytest.raises(TypeError, match="aware"):
            replay_events([event_id])
        assert row(event_id).status == DeliveryStatus.SUCCEEDED
    else:
        assert replay_events([event_id]) == {"reopened": 1, "added": 0}
        assert row(event_id).due_at == naive


def test_requeue_dead_makes_a_scheduled_row_due_at_once() -> None:
    """'requeue_dead() makes a row due at once, as it does for every receiver: it only touches
    dead rows, which were due when they died.'"""

    def broken(evt: OfferMade) -> None:
        raise ValueError("template missing")

    receiver(OfferMade, key=EXPIRE, due=HOURS_48, max_attempts=1)(broken)
    event_id = fire_one(OfferMade(offer_id=1))
    scheduled_for = row(event_id).due_at
    deliver_pending(now=scheduled_for + SECOND)
    assert row(event_id).status == DeliveryStatus.DEAD
    before = timezone.now()
    assert requeue_dead() == 1
    after = timezone.now()
    requeued = row(event_id)
    assert (requeued.status, requeued.attempts) == (DeliveryStatus.PENDING, 0)
    assert before <= requeued.due_at <= after  # now, though its schedule is still ahead
    assert requeued.available_at == requeued.due_at
    assert deliver_pending()[DeliveryStatus.DEAD] == 1  # claimed on the real clock at once


def test_a_cancelled_row_is_reopened_at_its_due_time_when_that_is_later_than_now() -> None:
    """'A cancelled row is reopened like any other settled one, at the later of its due time and
    now.' (its due time still ahead)"""
    declare_expiry()
    event_id = fire_one(OfferMade(offer_id=1))
    due = row(event_id).due_at
    cancel_deliveries([event_id], receiver_key=EXPIRE)
    assert replay_events([event_id]) == {"reopened": 1, "added": 0}
    reopened = row(event_id)
    assert (reopened.status, reopened.due_at, reopened.available_at) == (
        DeliveryStatus.PENDING,
        due,
        due,
    )
    assert total(drain_outbox()) == 0
    assert drain_outbox(now=due)[DeliveryStatus.SUCCEEDED] == 1


def test_a_cancelled_row_is_reopened_now_when_its_due_time_has_passed() -> None:
    """'A cancelled row is reopened like any other settled one, at the later of its due time and
    now.' (its due time passed)"""
    declare_expiry()
    event_id = fire_one(OfferMade(offer_id=1), occurred_at=timezone.now() - 5 * DAY)
    cancel_deliveries([event_id], receiver_key=EXPIRE)
    before = timezone.now()
    replay_events([event_id])
    after = timezone.now()
    assert before <= row(event_id).due_at <= after
    assert drain_outbox()[DeliveryStatus.SUCCEEDED] == 1


def test_requeue_dead_leaves_a_cancelled_row_alone() -> None:
    """'requeue_dead() leaves it alone.'"""
    declare_expiry()
    event_id = fire_one(OfferMade(offer_id=1))
    cancel_deliveries([event_id], receiver_key=EXPIRE)
    assert requeue_dead() == 0
    assert requeue_dead(delivery_ids=[row(event_id).pk]) == 0
    assert row(event_id).status == DeliveryStatus.CANCELLED
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING).count() == 0
