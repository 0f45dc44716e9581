"""Seed 000, "When the work turns out to be moot" and "Cancelling work known to be moot".

The seed's ``Offer`` model is not available to the suite; ``tests.app.models.Order`` stands in
for it: ``number`` holds the offer's state ("open", "accepted", "expired") and ``total`` holds
the id fire() returned for OfferMade - "a column on the offer".
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    cancel_deliveries,
    claim_batch,
    dead_letters,
    deliver_pending,
    drain_outbox,
    fire,
    outbox_health,
    prune_events,
    receiver,
    replay_events,
)
from django_domain_events.delivery.run import attempt
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import UntilConsumed, UntilSettled
from tests.app.models import Order
from tests.scheduled.support import DAY, MINUTE, SECOND, OfferMade, command, fire_one, row

pytestmark = pytest.mark.django_db

EXPIRE = "offers.expire_offer"
SEND = "offers.send_offer"
HOURS_48 = timedelta(hours=48)


runs: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def declared() -> None:
    runs.clear()

    @receiver(OfferMade, key=SEND)
    def send_offer(evt: OfferMade) -> None:
        runs.append(("send", evt.offer_id))

    @receiver(OfferMade, key=EXPIRE, due=HOURS_48)
    def expire_offer(evt: OfferMade) -> None:
        runs.append(("expire", evt.offer_id))
        offer = Order.objects.get(pk=evt.offer_id)
        if offer.number == "accepted":
            return  # the world moved on: nothing to do, and that is a success
        offer.number = "expired"
        offer.save()


def make_offer() -> Order:
    with transaction.atomic():
        offer = Order.objects.create(number="open")
        offer.total = fire(OfferMade(offer_id=offer.pk)) or 0
        offer.save()
    return offer


def accept(offer: Order) -> None:
    Order.objects.filter(pk=offer.pk).update(number="accepted")


def state(offer: Order) -> str:
    return Order.objects.get(pk=offer.pk).number


def expiry(offer: Order) -> DeliveryRecord:
    return row(offer.total, EXPIRE)


def test_a_receiver_finding_nothing_to_do_returns_and_that_is_a_success() -> None:
    """'Found moot when it runs. The receiver re-reads current state, finds nothing to do and
    returns, which is an ordinary success. "Nothing to do" is not a different outcome from the
    relay's point of view - the delivery ran and its work is done.'"""
    offer = make_offer()
    accept(offer)  # nobody announced it
    counts = drain_outbox(now=timezone.now() + HOURS_48 + MINUTE)
    assert counts[DeliveryStatus.SUCCEEDED] == 2  # send_offer and the moot expiry
    ran = expiry(offer)
    assert (ran.status, ran.attempts, ran.last_error) == (DeliveryStatus.SUCCEEDED, 1, "")
    assert ran.succeeded_at is not None
    assert ("expire", offer.pk) in runs
    assert state(offer) == "accepted"


def test_cancelling_inside_the_transaction_commits_with_the_change() -> None:
    """'cancel_deliveries settles the event's owed rows for that receiver as cancelled, so the
    relay never claims them, at the due time or after it. Inside the transaction it commits
    with the change that made the work moot'."""
    offer = make_offer()
    with transaction.atomic():
        accept(offer)
        result = cancel_deliveries([offer.total], receiver_key=EXPIRE)
    assert result == {"cancelled": 1, "in_flight": 0}
    assert state(offer) == "accepted"
    assert expiry(offer).status == DeliveryStatus.CANCELLED
    assert row(offer.total, SEND).status == DeliveryStatus.PENDING  # that receiver only
    due = offer_due(offer)
    drain_outbox(now=due)
    drain_outbox(now=due + 365 * DAY)
    assert expiry(offer).status == DeliveryStatus.CANCELLED
    assert expiry(offer).claimed_at is None  # never claimed
    assert runs == [("send", offer.pk)]


def offer_due(offer: Order) -> datetime:
    return EventRecord.objects.get(pk=offer.total).occurred_at + HOURS_48


def test_cancelling_inside_the_transaction_rolls_back_with_the_change() -> None:
    """'Inside the transaction it commits with the change that made the work moot, or not at
    all.'"""
    offer = make_offer()
    with pytest.raises(RuntimeError), transaction.atomic():
        accept(offer)
        assert cancel_deliveries([offer.total], receiver_key=EXPIRE)["cancelled"] == 1
        raise RuntimeError("the acceptance failed to save")
    assert state(offer) == "open"
    assert expiry(offer).status == DeliveryStatus.PENDING
    drain_outbox(now=offer_due(offer) + MINUTE)
    assert state(offer) == "expired"  # the expiry is still owed, and runs


def test_a_pending_row_still_waiting_for_its_due_time_is_cancelled() -> None:
    """'A pending row - still waiting for its due time - is cancelled.'"""
    offer = make_offer()
    assert expiry(offer).status == DeliveryStatus.PENDING
    assert cancel_deliveries([offer.total], receiver_key=EXPIRE) == {
        "cancelled": 1,
        "in_flight": 0,
    }
    assert expiry(offer).status == DeliveryStatus.CANCELLED


def test_a_failed_row_waiting_out_its_backoff_is_cancelled_too() -> None:
    """'A failed row - it came due, failed, and is waiting out its backoff - is cancelled too:
    "never runs" covers its retries.'"""
    offer = make_offer()
    Order.objects.filter(pk=offer.pk).delete()  # the expiry fails: Order.DoesNotExist
    due = offer_due(offer)
    assert deliver_pending(now=due + SECOND)[DeliveryStatus.FAILED] == 1
    assert expiry(offer).status == DeliveryStatus.FAILED
    assert cancel_deliveries([offer.total], receiver_key=EXPIRE) == {
        "cancelled": 1,
        "in_flight": 0,
    }
    tries = runs.count(("expire", offer.pk))
    drain_outbox(now=due + 365 * DAY)  # skips backoff: would retry a failed row at once
    assert runs.count(("expire", offer.pk)) == tries
    assert expiry(offer).status == DeliveryStatus.CANCELLED


def test_a_claimed_row_is_left_alone_counted_in_flight_and_its_re_check_stops_it() -> None:
    """'A claimed row is left alone. A worker holds it and may be running the receiver now. It
    is counted in in_flight, and the receiver's own re-check is what stops it'."""
    offer = make_offer()
    due = offer_due(offer)
    (claim,) = claim_batch(
        worker_id="relay-1", now=due + SECOND, lease=60, limit=1, ids=[expiry(offer).pk]
    )
    with transaction.atomic():
        accept(offer)
        assert cancel_deliveries([offer.total], receiver_key=EXPIRE) == {
            "cancelled": 0,
            "in_flight": 1,
        }
    held = expiry(offer)
    assert (held.status, held.claimed_by) == (DeliveryStatus.CLAIMED, "relay-1")
    status, _ = attempt(claim, now=due + SECOND)
    assert status == DeliveryStatus.SUCCEEDED
    assert state(offer) == "accepted"  # the re-check found it moot


def test_cancel_returns_how_many_it_cancelled_and_how_many_it_could_not() -> None:
    """'It returns how many it cancelled and how many it could not, as {"cancelled": n,
    "in_flight": m}.'"""
    offers = [make_offer() for _ in range(3)]
    claim_batch(
        worker_id="relay-1",
        now=offer_due(offers[2]) + SECOND,
        lease=60,
        limit=1,
        ids=[expiry(offers[2]).pk],
    )
    result = cancel_deliveries([o.total for o in offers], receiver_key=EXPIRE)
    assert result == {"cancelled": 2, "in_flight": 1}
    assert list(result) == ["cancelled", "in_flight"]
    assert cancel_deliveries([o.total for o in offers], receiver_key=EXPIRE) == {
        "cancelled": 0,
        "in_flight": 1,
    }


def test_cancelled_is_distinct_from_a_success_and_from_a_dead_letter() -> None:
    """'cancelled is a settled status of its own, distinct from a success (the receiver never
    ran) and from a dead letter (nothing failed).'"""
    offer = make_offer()
    cancel_deliveries([offer.total], receiver_key=EXPIRE)
    cancelled = expiry(offer)
    assert cancelled.status == DeliveryStatus.CANCELLED
    assert cancelled.status not in (DeliveryStatus.SUCCEEDED, DeliveryStatus.DEAD)
    assert cancelled.succeeded_at is None and cancelled.attempts == 0
    assert cancelled.completed_at is not None  # settled
    assert cancelled.last_error == ""
    assert not dead_letters().exists()
    assert ("expire", offer.pk) not in runs


def test_health_does_not_count_a_cancelled_row() -> None:
    """'Health does not count it'."""
    offer = make_offer()
    before = {r.key: r for r in outbox_health().receivers}[EXPIRE]
    assert before.scheduled == 1
    cancel_deliveries([offer.total], receiver_key=EXPIRE)
    health = outbox_health()
    after = {r.key: r for r in health.receivers}[EXPIRE]
    assert (after.owed, after.scheduled, after.claimed, after.dead) == (0, 0, 0, 0)
    assert (health.scheduled, health.dead) == (0, 0)
    later = outbox_health(now=offer_due(offer) + DAY)  # not even once its time has come
    assert {r.key: r for r in later.receivers}[EXPIRE].owed == 0


@pytest.mark.parametrize("policy", ["succeeded", "settled"])
def test_prune_treats_cancelled_as_consumed_under_either_retention_policy(policy: str) -> None:
    """'prune treats it as consumed under either retention policy'."""
    cls = UntilConsumed if policy == "succeeded" else UntilSettled
    receiver(cls, key="offers.later", due=timedelta(days=14))(lambda evt: None)
    event_id = fire_one(cls())
    assert prune_events() == 0  # owed: kept
    cancel_deliveries([event_id], receiver_key="offers.later")
    assert prune_events() == 1
    assert not EventRecord.objects.filter(pk=event_id).exists()


def test_replay_reopens_a_cancelled_row() -> None:
    """'replay reopens it - the way back for work withdrawn by mistake.'"""
    offer = make_offer()
    cancel_deliveries([offer.total], receiver_key=EXPIRE)
    assert replay_events([offer.total], receiver_keys=[EXPIRE]) == {"reopened": 1, "added": 0}
    reopened = expiry(offer)
    assert (reopened.status, reopened.due_at) == (DeliveryStatus.PENDING, offer_due(offer))
    drain_outbox(now=offer_due(offer) + MINUTE)
    assert state(offer) == "expired"


def test_the_event_id_is_found_through_the_event_log_by_name_and_payload() -> None:
    """'The event id is what fire() returned. Keep it where the work's subject lives - a column
    on the offer - or find it through the event log by name and payload, which is a query on the
    event table'."""
    offer = make_offer()
    found = EventRecord.objects.get(name="scheduled.OfferMade", payload__offer_id=offer.pk)
    assert found.pk == offer.total  # the column kept what fire() returned
    assert cancel_deliveries([found.pk], receiver_key=EXPIRE)["cancelled"] == 1


def test_the_command_cancels_for_one_receiver_and_prints_the_counts() -> None:
    """'python manage.py cancel_deliveries <event_id> --receiver <key>' prints
    'cancelled: n, in_flight: m'."""
    first, second = make_offer(), make_offer()
    claim_batch(
        worker_id="relay-1",
        now=offer_due(second) + SECOND,
        lease=60,
        limit=1,
        ids=[expiry(second).pk],
    )
    out = command("cancel_deliveries", str(first.total), str(second.total), "--receiver", EXPIRE)
    assert out == "cancelled: 1, in_flight: 1"
    assert expiry(first).status == DeliveryStatus.CANCELLED
    assert expiry(second).status == DeliveryStatus.CLAIMED
    assert row(first.total, SEND).status == DeliveryStatus.PENDING
