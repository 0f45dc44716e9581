"""Seed 000, "Declaring a due time": the two spellings of due=, and the clamp to the row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import transaction

from django_domain_events import (
    DeliveryStatus,
    RetryAfter,
    deliver_pending,
    drain_outbox,
    event,
    fire,
    outbox_health,
    receiver,
)
from django_domain_events.models import DeliveryRecord
from tests.scheduled.support import (
    DAY,
    HOUR,
    SECOND,
    OfferMade,
    event_row,
    fire_one,
    now,
    project_time,
    row,
    total,
)

pytestmark = pytest.mark.django_db


@event(name="scheduled.declaring.NewsletterScheduled")
@dataclass(frozen=True)
class NewsletterScheduled:
    newsletter_id: int
    send_at: datetime


def test_the_row_is_written_when_the_event_fires_inside_the_callers_transaction() -> None:
    """'due= on the declaration writes the delivery row when the event fires, inside the
    caller's transaction, and the relay claims it when it comes due.'"""
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OfferMade(offer_id=1))
        assert event_id is not None
        assert row(event_id).status == DeliveryStatus.PENDING  # already there, uncommitted
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = fire(OfferMade(offer_id=2))
        raise RuntimeError("the change failed")
    assert not DeliveryRecord.objects.filter(event_id=rolled_back).exists()
    assert total(drain_outbox()) == 0
    assert drain_outbox(now=row(event_id).due_at)[DeliveryStatus.SUCCEEDED] == 1


def test_one_event_drives_reactions_at_different_times() -> None:
    """'The time belongs to the receiver rather than to fire() because one event drives
    reactions at different times: the same OfferMade sends the offer now and expires it in 48
    hours.'"""
    done: list[str] = []
    receiver(OfferMade, key="waitlist.send_offer")(lambda evt: done.append("sent"))
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(
        lambda evt: done.append("expired")
    )
    event_id = fire_one(OfferMade(offer_id=1))
    recorded = event_row(event_id).recorded_at
    assert row(event_id, "waitlist.send_offer").due_at == recorded
    assert row(event_id, "waitlist.expire_offer").due_at == recorded + timedelta(hours=48)
    drain_outbox()
    assert done == ["sent"]
    drain_outbox(now=recorded + timedelta(hours=48))
    assert done == ["sent", "expired"]
    with pytest.raises(TypeError), transaction.atomic():
        fire(OfferMade(offer_id=2), due=timedelta(hours=48))  # type: ignore[call-arg]


def test_a_timedelta_is_that_long_after_the_events_occurred_at() -> None:
    """'A timedelta: That long after the event's occurred_at, the domain's own time.'"""
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(lambda evt: None)
    occurred = now() - HOUR  # the domain's time differs from the write time
    event_id = fire_one(OfferMade(offer_id=1), occurred_at=occurred)
    record = event_row(event_id)
    assert record.occurred_at == occurred
    assert row(event_id).due_at == occurred + timedelta(hours=48)
    assert row(event_id).due_at != record.recorded_at + timedelta(hours=48)


def test_a_callable_is_the_aware_datetime_it_returns_for_a_time_the_event_names() -> None:
    """'A callable of the event: The aware datetime it returns, for a time the event itself
    names' (@receiver(NewsletterScheduled, due=lambda evt: evt.send_at))."""
    seen: list[object] = []

    def send_at(evt: NewsletterScheduled) -> datetime:
        seen.append(evt)
        return evt.send_at

    receiver(NewsletterScheduled, key="scheduled.send_newsletter", due=send_at)(lambda evt: None)
    # An aware time in a zone that is neither UTC nor the project's: the instant counts
    # (under USE_TZ = False it is stored as the project's naive local time).
    when = datetime.now(dt_timezone(timedelta(hours=9))) + 3 * DAY
    evt = NewsletterScheduled(newsletter_id=7, send_at=when)
    event_id = fire_one(evt)
    assert seen == [evt]  # called with the event itself
    assert row(event_id).due_at == project_time(when)


def test_the_row_is_written_with_available_at_and_due_at_at_the_due_time() -> None:
    """'The row is written with its available_at and its due_at at the due time, so the relay
    claims it then and not before.'"""
    ran: list[int] = []
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(
        lambda evt: ran.append(evt.offer_id)
    )
    event_id = fire_one(OfferMade(offer_id=1))
    due = event_row(event_id).occurred_at + timedelta(hours=48)
    delivery = row(event_id)
    assert (delivery.status, delivery.available_at, delivery.due_at) == (
        DeliveryStatus.PENDING,
        due,
        due,
    )
    assert sum(deliver_pending().values()) == 0
    assert sum(deliver_pending(now=due - SECOND).values()) == 0
    assert ran == []
    assert row(event_id).claimed_at is None  # not even claimed before its time
    assert deliver_pending(now=due)[DeliveryStatus.SUCCEEDED] == 1
    assert ran == [1]


def test_a_due_time_already_past_is_clamped_to_the_events_recorded_at() -> None:
    """'One already past - an event fired with an old occurred_at, say, in a backfill - is
    clamped to the moment the row is written, the event's recorded_at, and is owed from then.'"""
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1), occurred_at=now() - 30 * DAY)
    record = event_row(event_id)
    delivery = row(event_id)
    assert delivery.due_at == record.recorded_at
    assert delivery.available_at == record.recorded_at
    assert delivery.due_at > record.occurred_at + timedelta(hours=48)
    # Owed from then: counted owed at once, and delivered on the real clock.
    health = outbox_health()
    assert (health.owed, health.scheduled) == (1, 0)
    assert drain_outbox()[DeliveryStatus.SUCCEEDED] == 1


def test_a_due_callable_returning_a_past_time_is_clamped_too() -> None:
    """'A due time is never earlier than the row.' (the callable spelling)"""
    receiver(NewsletterScheduled, key="scheduled.send_newsletter", due=lambda evt: evt.send_at)(
        lambda evt: None
    )
    event_id = fire_one(NewsletterScheduled(newsletter_id=1, send_at=now() - 10 * DAY))
    assert row(event_id).due_at == event_row(event_id).recorded_at
    assert row(event_id).available_at == event_row(event_id).recorded_at


def test_a_clamped_row_does_not_read_as_a_backlog_as_old_as_its_occurred_at() -> None:
    """'due_at is when a row became owed, which cannot be before it existed: without the clamp a
    backfilled event would read as a backlog that old the instant its row was written.'"""
    receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48))(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1), occurred_at=now() - 30 * DAY)
    oldest = outbox_health().oldest_owed_at
    assert oldest == event_row(event_id).recorded_at
    assert oldest is not None and now() - oldest < HOUR


def test_give_up_after_from_a_clamped_due_time_does_not_dead_letter_the_first_deferral() -> None:
    """'... and a give_up_after measured from it would dead-letter its first deferral.'"""
    tries: list[int] = []

    def busy(evt: OfferMade) -> None:
        tries.append(evt.offer_id)
        raise RetryAfter(30, reason="mail server busy", counts=False)

    receiver(
        OfferMade,
        key="waitlist.expire_offer",
        due=timedelta(hours=48),
        give_up_after=timedelta(hours=1),
    )(busy)
    event_id = fire_one(OfferMade(offer_id=1), occurred_at=now() - 30 * DAY)
    counts = deliver_pending()
    assert tries == [1]
    assert counts[DeliveryStatus.FAILED] == 1 and counts[DeliveryStatus.DEAD] == 0
    delivery = row(event_id)
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, 0)
