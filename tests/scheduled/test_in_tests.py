"""Seed 000, "In tests": drain_outbox() and deliver_pending(now=) with scheduled rows.

The seed's ``test_an_unanswered_offer_expires`` needs ``make_offer`` and ``offer_expired``,
which it does not show, and an ``Offer`` model the suite does not have: the offers live in a
module-level dict, and ``make_offer`` fires OfferMade as the application would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    DeliveryContext,
    DeliveryStatus,
    NotYet,
    claim_batch,
    deliver_one,
    deliver_pending,
    drain_outbox,
    receiver,
)
from django_domain_events.delivery import passes
from tests.scheduled.support import (
    DAY,
    HOUR,
    MINUTE,
    SECOND,
    Offer,
    OfferMade,
    event_row,
    fire_one,
    row,
    total,
)

pytestmark = pytest.mark.django_db

KEY = "scheduled.in_tests"


OFFERS: dict[int, Offer] = {}
MAILED: list[int] = []


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    OFFERS.clear()
    MAILED.clear()
    RecordingBackend.calls = []
    yield


def make_offer() -> int:
    offer_id = len(OFFERS) + 1
    OFFERS[offer_id] = Offer(expires_at=timezone.now() + timedelta(hours=48))
    event_id = fire_one(OfferMade(offer_id=offer_id))
    OFFERS[offer_id].expires_at = event_row(event_id).occurred_at + timedelta(hours=48)
    return offer_id


def offer_expired(offer: int) -> bool:
    return OFFERS[offer].expired


@pytest.fixture
def waitlist() -> None:
    """The seed's two receivers of OfferMade, as written."""

    @receiver(OfferMade, key="waitlist.send_offer")
    def send_offer(evt: OfferMade) -> None:
        MAILED.append(evt.offer_id)

    @receiver(OfferMade, key="waitlist.expire_offer", due=timedelta(hours=48), takes_context=True)
    def expire_offer(evt: OfferMade, ctx: DeliveryContext) -> None:
        offer = OFFERS[evt.offer_id]
        if offer.accepted:
            return  # the world moved on: nothing to do, and that is a success
        if offer.expires_at > max(ctx.due_at, timezone.now()):  # type: ignore[operator, type-var]
            raise NotYet(offer.expires_at, reason="the offer was extended")
        offer.expire()


class RecordingBackend:
    calls: list[dict[str, Any]] = []

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        RecordingBackend.calls.append(
            {"delivery_id": delivery_id, "claimed_by": claimed_by, "claimed_at": claimed_at}
        )


class RunAtOnceBackend(RecordingBackend):
    """A queue whose worker runs the delivery there and then, inside enqueue()."""

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        super().enqueue(delivery_id, claimed_by=claimed_by, claimed_at=claimed_at)
        deliver_one(delivery_id, worker_id="worker", claimed_by=claimed_by, claimed_at=claimed_at)


def test_an_unanswered_offer_expires(waitlist: None) -> None:
    """The seed's test, as written: 'a test that makes an offer does not expire it in the same
    breath. Pass now= to move forward instead'."""
    offer = make_offer()
    drain_outbox()
    assert not offer_expired(offer)

    drain_outbox(now=timezone.now() + timedelta(hours=48))
    assert offer_expired(offer)
    assert [offer] == MAILED


def test_drain_outbox_skips_the_backoff_and_never_a_schedule() -> None:
    """'drain_outbox() skips the backoff, and never skips a schedule: a row whose due time has
    not come is left alone'."""

    def broken(evt: OfferMade) -> None:
        raise ValueError("broken")

    ran: list[int] = []
    receiver(OfferMade, key="scheduled.broken", max_attempts=3, backoff_base_seconds=3600)(broken)
    receiver(OfferMade, key="scheduled.later", due=timedelta(hours=1))(
        lambda evt: ran.append(evt.offer_id)
    )
    event_id = fire_one(OfferMade(offer_id=1))
    counts = drain_outbox()
    assert counts[DeliveryStatus.DEAD] == 1  # an hour of backoff, skipped twice
    assert row(event_id, "scheduled.broken").attempts == 3
    assert ran == []
    assert row(event_id, "scheduled.later").status == DeliveryStatus.PENDING
    assert row(event_id, "scheduled.later").claimed_at is None


def test_drain_outbox_never_skips_a_not_yet_reschedule() -> None:
    """'never skips a schedule' - a row rescheduled by NotYet is scheduled too."""
    until = timezone.now() + DAY
    calls: list[int] = []

    def wait(evt: OfferMade) -> None:
        calls.append(evt.offer_id)
        if len(calls) == 1:
            raise NotYet(until)

    receiver(OfferMade, key=KEY)(wait)
    event_id = fire_one(OfferMade(offer_id=1))
    drain_outbox()
    drain_outbox()
    assert calls == [1]
    assert drain_outbox(now=until)[DeliveryStatus.SUCCEEDED] == 1
    assert row(event_id).status == DeliveryStatus.SUCCEEDED


def test_now_is_the_moment_every_claim_is_made_at_what_is_due() -> None:
    """'now= is the moment every claim of the call is made at - what is due ... read against
    it.'"""
    receiver(OfferMade, key=KEY, due=timedelta(hours=2))(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1))
    due = row(event_id).due_at
    assert total(drain_outbox(now=due - SECOND)) == 0
    assert drain_outbox(now=due)[DeliveryStatus.SUCCEEDED] == 1
    assert row(event_id).claimed_at == due


def test_now_is_the_moment_every_claim_is_made_at_which_backoff_has_run_out() -> None:
    """'... which backoff has run out ... read against it.'"""
    calls: list[int] = []

    def flaky(evt: OfferMade) -> None:
        calls.append(evt.offer_id)
        if len(calls) == 1:
            raise ValueError("flaky")

    receiver(OfferMade, key=KEY, backoff_base_seconds=3600, backoff_cap_seconds=3600)(flaky)
    event_id = fire_one(OfferMade(offer_id=1))
    drain_outbox(respect_backoff=True)
    retry_at = row(event_id).available_at
    if retry_at > timezone.now() + SECOND:  # full jitter may draw (almost) zero
        assert total(drain_outbox(respect_backoff=True)) == 0
        assert total(deliver_pending(now=retry_at - SECOND)) == 0
    assert deliver_pending(now=retry_at)[DeliveryStatus.SUCCEEDED] == 1
    assert calls == [1, 1]


def test_now_is_the_moment_every_claim_is_made_at_which_lease_has_lapsed() -> None:
    """'... and which lease has lapsed are all read against it.'"""
    ran: list[int] = []
    receiver(OfferMade, key=KEY)(lambda evt: ran.append(evt.offer_id))
    event_id = fire_one(OfferMade(offer_id=1))
    claim_batch(worker_id="gone", now=timezone.now(), lease=60, limit=1)
    assert total(deliver_pending()) == 0  # the lease still holds on the real clock
    assert total(deliver_pending(now=timezone.now() + timedelta(seconds=30))) == 0
    assert deliver_pending(now=timezone.now() + MINUTE + SECOND)[DeliveryStatus.SUCCEEDED] == 1
    assert ran == [1]
    assert row(event_id).claimed_by == "deliver_pending"


def test_deliver_pending_takes_the_same_now() -> None:
    """'deliver_pending(now=) takes the same.'"""
    receiver(OfferMade, key=KEY, due=timedelta(days=14))(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1))
    due = row(event_id).due_at
    assert total(deliver_pending()) == 0
    assert total(deliver_pending(now=due - SECOND)) == 0
    assert deliver_pending(now=due)[DeliveryStatus.SUCCEEDED] == 1


def test_the_receiver_still_runs_on_the_real_clock() -> None:
    """'The receiver still runs on the real clock, since its acknowledgement is a fact about
    when it ran'."""
    clocks: list[tuple[datetime, datetime | None]] = []
    receiver(OfferMade, key=KEY, due=timedelta(days=14), takes_context=True)(
        lambda evt, ctx: clocks.append((timezone.now(), ctx.due_at))
    )
    event_id = fire_one(OfferMade(offer_id=1))
    moved_to = row(event_id).due_at + HOUR
    before = timezone.now()
    drain_outbox(now=moved_to)
    after = timezone.now()
    ((ran_at, told_due),) = clocks
    assert before <= ran_at <= after  # timezone.now() in the receiver is the real clock
    assert told_due == row(event_id).due_at
    done = row(event_id)
    assert done.claimed_at == moved_to  # the claim is made at now=
    assert done.succeeded_at is not None and before <= done.succeeded_at <= after
    assert done.completed_at == done.succeeded_at


def test_within_one_call_a_not_yet_row_is_attempted_at_most_once() -> None:
    """'Within one call, a row is attempted at most once if its receiver answers NotYet'."""
    calls: list[int] = []

    def always_tomorrow(evt: OfferMade) -> None:
        calls.append(evt.offer_id)
        raise NotYet(timezone.now() + DAY)

    receiver(OfferMade, key=KEY)(always_tomorrow)
    fire_one(OfferMade(offer_id=1))
    far = timezone.now() + 30 * DAY  # every reschedule lands before it
    assert deliver_pending(now=far)[DeliveryStatus.PENDING] == 1
    assert calls == [1]
    assert drain_outbox(now=far)[DeliveryStatus.PENDING] == 1
    assert calls == [1, 1]


@override_settings(
    DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.scheduled.test_in_tests.RecordingBackend"}
)
def test_within_one_call_a_task_row_is_handed_off_at_most_once() -> None:
    """'... and handed to a task backend at most once if it declares site="task" - a
    handed-off row is not counted in the result'."""
    receiver(OfferMade, key=KEY, due=timedelta(hours=1), site="task")(lambda evt: None)
    fire_one(OfferMade(offer_id=1))
    # Thirty days on, every lease the call stamps has lapsed long before its own clock.
    counts = deliver_pending(now=timezone.now() + 30 * DAY)
    assert total(counts) == 0
    assert len(RecordingBackend.calls) == 1


@override_settings(
    DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.scheduled.test_in_tests.RunAtOnceBackend"}
)
def test_a_handed_off_row_is_not_counted_even_when_the_backend_runs_it_there_and_then() -> None:
    """'a handed-off row is not counted in the result, whether the backend runs it there and
    then or later.'"""
    ran: list[int] = []
    receiver(OfferMade, key=KEY, due=timedelta(hours=1), site="task")(
        lambda evt: ran.append(evt.offer_id)
    )
    event_id = fire_one(OfferMade(offer_id=1))
    counts = deliver_pending(now=row(event_id).due_at + SECOND)
    assert total(counts) == 0
    assert ran == [1]
    assert row(event_id).status == DeliveryStatus.SUCCEEDED
    assert len(RecordingBackend.calls) == 1


@override_settings(
    DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.scheduled.test_in_tests.RecordingBackend"}
)
def test_on_the_real_clock_nothing_is_excluded_or_read_back(monkeypatch: Any) -> None:
    """'The pass keeps the row out of its later claims only when it was given a now; on the
    real clock a rescheduled row's time and a handed-off row's lease are ahead of the clock
    when written, so a later claim takes the row again only once that time has really come, and
    nothing is excluded or read back.'"""
    excluded: list[tuple[int, ...]] = []
    real_claim = passes.claim_batch

    def spy(**kwargs: Any) -> Any:
        excluded.append(tuple(kwargs.get("exclude_ids", ())))
        return real_claim(**kwargs)

    monkeypatch.setattr(passes, "claim_batch", spy)
    calls: list[int] = []

    def always_tomorrow(evt: OfferMade) -> None:
        calls.append(evt.offer_id)
        raise NotYet(timezone.now() + DAY)

    receiver(OfferMade, key=KEY)(always_tomorrow)
    receiver(OfferMade, key="scheduled.task", site="task")(lambda evt: None)
    fire_one(OfferMade(offer_id=1))
    counts = deliver_pending()
    assert counts[DeliveryStatus.PENDING] == 1
    assert calls == [1] and len(RecordingBackend.calls) == 1
    assert excluded and all(ids == () for ids in excluded)
    # Given a now, the pass does keep both rows out of its later claims.
    excluded.clear()
    deliver_pending(now=timezone.now() + 30 * DAY)
    assert calls == [1, 1] and len(RecordingBackend.calls) == 2
    assert len(excluded[-1]) == 2


def test_drain_outbox_leaves_a_failed_row_whose_due_time_has_not_come_on_its_clock() -> None:
    """'drain_outbox() skips the backoff, and never skips a schedule: a row whose due time has
    not come is left alone'. A test moved forward to the due time, the receiver failed there;
    a later drain_outbox() on the real clock, where that due time has not come, leaves it."""
    calls: list[int] = []

    def flaky(evt: OfferMade) -> None:
        calls.append(evt.offer_id)
        raise ValueError("flaky")

    receiver(OfferMade, key=KEY, due=timedelta(hours=48), max_attempts=5)(flaky)
    event_id = fire_one(OfferMade(offer_id=1))
    due = row(event_id).due_at
    deliver_pending(now=due + SECOND)
    assert calls == [1] and row(event_id).status == DeliveryStatus.FAILED
    assert row(event_id).due_at > timezone.now()  # on the real clock it is not due
    drain_outbox()
    assert calls == [1]
