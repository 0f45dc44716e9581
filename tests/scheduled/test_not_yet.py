"""Seed 000, "When the work is not due yet: NotYet".

The seed's example reads an ``Offer`` model, which the suite does not have: here the offers
live in a module-level dict of small ``Offer`` objects with the same three members the example
uses (``accepted``, ``expires_at``, ``expire()``), and ``Offer.objects.get(pk=evt.offer_id)``
becomes ``OFFERS[evt.offer_id]``. Everything else is the example as written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    INLINE,
    ON_COMMIT,
    DeliveryContext,
    DeliveryFailure,
    DeliveryStatus,
    NotYet,
    RetryAfter,
    deliver_one,
    deliver_pending,
    drain_outbox,
    fire,
    outbox_health,
    receiver,
)
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.models import Order
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

EXPIRE = "waitlist.expire_offer"
KEY = "scheduled.not_yet"


OFFERS: dict[int, Offer] = {}
SEEN: list[DeliveryContext] = []


class QueueBackend:
    """A task queue that only keeps its messages, for a test to hand to deliver_one()."""

    messages: list[tuple[int, str, str]] = []

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        QueueBackend.messages.append((delivery_id, claimed_by, claimed_at))


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    OFFERS.clear()
    SEEN.clear()
    QueueBackend.messages = []
    yield


def declare_expire_offer() -> None:
    """The seed's receiver, as written (but for where the offer is read from)."""

    @receiver(OfferMade, key=EXPIRE, due=timedelta(hours=48), takes_context=True)
    def expire_offer(evt: OfferMade, ctx: DeliveryContext) -> None:
        SEEN.append(ctx)
        offer = OFFERS[evt.offer_id]
        if offer.accepted:
            return  # the world moved on: nothing to do, and that is a success
        if offer.expires_at > max(ctx.due_at, timezone.now()):  # type: ignore[operator, type-var]
            raise NotYet(offer.expires_at, reason="the offer was extended")
        offer.expire()


def make_offer(offer_id: int = 1) -> tuple[int, datetime]:
    """Make an offer expiring 48 hours after it was made; its event id and made-at time."""
    event_id = fire_one(OfferMade(offer_id=offer_id))
    made = event_row(event_id).occurred_at
    OFFERS[offer_id] = Offer(expires_at=made + timedelta(hours=48))
    return event_id, made


def declare(behaviour: Callable[[DeliveryContext], None], **options: Any) -> None:
    """A durable receiver of OfferMade (no due=) that records its context, then ``behaviour``."""

    def react(evt: OfferMade, ctx: DeliveryContext) -> None:
        SEEN.append(ctx)
        behaviour(ctx)

    receiver(OfferMade, key=KEY, takes_context=True, **options)(react)


def not_until(until: datetime) -> Callable[[DeliveryContext], None]:
    def behaviour(ctx: DeliveryContext) -> None:
        raise NotYet(until, reason="not yet")

    return behaviour


def test_an_extended_offer_is_rescheduled_not_lost() -> None:
    """'An admin extends an offer from 48 hours to 72; the 48-hour row runs, finds the offer
    still open ...' - with NotYet: 'The relay writes until to the row's available_at and due_at
    together, sets it back to pending, and does nothing else', and 'On the next run ctx.due_at is
    until, so the same comparison now lets the work go ahead.'"""
    declare_expire_offer()
    event_id, made = make_offer()
    OFFERS[1].expires_at = made + timedelta(hours=72)  # the admin extends it
    counts = drain_outbox(now=made + timedelta(hours=48, minutes=1))
    assert counts[DeliveryStatus.PENDING] == 1 and total(counts) == 1
    assert not OFFERS[1].expired
    waiting = row(event_id)
    assert waiting.status == DeliveryStatus.PENDING
    assert waiting.available_at == waiting.due_at == made + timedelta(hours=72)
    assert waiting.attempts == 0
    assert drain_outbox(now=made + timedelta(hours=71))[DeliveryStatus.SUCCEEDED] == 0
    counts = drain_outbox(now=made + timedelta(hours=72, minutes=1))
    assert counts[DeliveryStatus.SUCCEEDED] == 1
    assert OFFERS[1].expired
    assert [ctx.due_at for ctx in SEEN] == [
        made + timedelta(hours=48),
        made + timedelta(hours=72),
    ]


def test_without_not_yet_the_extended_offer_is_silently_never_expired() -> None:
    """The hazard NotYet answers: 'An admin extends an offer from 48 hours to 72; the 48-hour row
    runs, finds the offer still open, and returns - which succeeds, and leaves nothing that will
    ever expire the offer.'"""

    @receiver(OfferMade, key=EXPIRE, due=timedelta(hours=48), takes_context=True)
    def expire_offer(evt: OfferMade, ctx: DeliveryContext) -> None:
        offer = OFFERS[evt.offer_id]
        if offer.accepted or offer.expires_at > timezone.now():
            return  # "not expired yet" - and nothing will come back for it
        offer.expire()

    event_id, made = make_offer()
    OFFERS[1].expires_at = made + timedelta(hours=72)
    assert drain_outbox(now=made + timedelta(hours=48, minutes=1))[DeliveryStatus.SUCCEEDED] == 1
    assert row(event_id).status == DeliveryStatus.SUCCEEDED
    assert total(drain_outbox(now=made + timedelta(days=30))) == 0
    assert not OFFERS[1].expired
    assert outbox_health(now=made + timedelta(days=30)).scheduled == 0


def test_no_attempt_is_spent_and_the_next_run_gets_the_same_attempt_number() -> None:
    """'No attempt is spent, and the next run is handed the same attempt number.'"""
    until = timezone.now() + DAY
    answers = iter([not_until(until), not_until(until + DAY), lambda ctx: None])
    declare(lambda ctx: next(answers)(ctx))
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending()
    assert row(event_id).attempts == 0
    deliver_pending(now=until + SECOND)
    assert row(event_id).attempts == 0
    deliver_pending(now=until + DAY + SECOND)
    assert (row(event_id).status, row(event_id).attempts) == (DeliveryStatus.SUCCEEDED, 1)
    assert [ctx.attempt for ctx in SEEN] == [1, 1, 1]


def test_max_attempts_cannot_end_it() -> None:
    """'max_attempts cannot end it.'"""
    start = timezone.now()
    declare(
        lambda ctx: not_until(max(ctx.due_at or start, timezone.now()) + DAY)(ctx), max_attempts=1
    )
    event_id = fire_one(OfferMade(offer_id=1))
    for _ in range(4):
        deliver_pending(now=row(event_id).due_at + SECOND)
        assert (row(event_id).status, row(event_id).attempts) == (DeliveryStatus.PENDING, 0)
    assert len(SEEN) == 4


@override_settings(DJANGO_DOMAIN_EVENTS={"MAX_RECEIVER_RETRY_DELAY_SECONDS": 60})
def test_it_is_not_capped_by_max_receiver_retry_delay_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """'It is not capped by MAX_RECEIVER_RETRY_DELAY_SECONDS'."""
    until = timezone.now() + 30 * DAY
    declare(not_until(until))
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending()
    assert row(event_id).available_at == until
    assert row(event_id).due_at == until
    assert "MAX_RECEIVER_RETRY_DELAY_SECONDS" not in caplog.text


def test_it_is_not_bounded_by_give_up_after() -> None:
    """'... and not bounded by give_up_after. Those exist because a destination's advice about
    its own readiness cannot be trusted to be sane; this is the application's own declaration of
    when its work is due, as due= is.'"""
    first, second = timezone.now() + 10 * DAY, timezone.now() + 20 * DAY
    answers = iter(
        [
            not_until(first),
            not_until(second),
            lambda ctx: (_ for _ in ()).throw(RetryAfter(60, counts=False)),
        ]
    )
    declare(lambda ctx: next(answers)(ctx), give_up_after=timedelta(minutes=5))
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending()
    deliver_pending(now=first + HOUR)  # owed ten days longer than give_up_after: still NotYet
    assert row(event_id).status == DeliveryStatus.PENDING
    assert row(event_id).due_at == second
    # A deferral after it is measured from the due time NotYet wrote: owed one minute.
    assert deliver_pending(now=second + MINUTE)[DeliveryStatus.FAILED] == 1
    assert row(event_id).status == DeliveryStatus.FAILED


def test_it_is_not_a_failure_no_last_error_no_on_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """'It is not a failure: last_error is not written and on_failure is not called.' (and the
    comparison table: 'Recorded as ... pending, with neither')"""
    told: list[DeliveryFailure] = []
    declare(not_until(timezone.now() + DAY), on_failure=told.append)
    event_id = fire_one(OfferMade(offer_id=1))
    with caplog.at_level(logging.DEBUG, logger="django_domain_events"):
        counts = deliver_pending()
    assert counts[DeliveryStatus.PENDING] == 1 and counts[DeliveryStatus.FAILED] == 0
    waiting = row(event_id)
    assert (waiting.status, waiting.last_error) == (DeliveryStatus.PENDING, "")
    assert waiting.completed_at is None
    assert told == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_it_sets_nothing_else_aside_the_rest_of_the_batch_is_delivered() -> None:
    """'It sets nothing else aside. The rest of the batch is delivered.'"""
    until = timezone.now() + DAY

    def first_waits(ctx: DeliveryContext) -> None:
        if ctx.event_id == waiting_id:
            raise NotYet(until)

    declare(first_waits)
    waiting_id = fire_one(OfferMade(offer_id=1))
    others = [fire_one(OfferMade(offer_id=n)) for n in (2, 3)]
    counts = deliver_pending(batch_size=10)
    assert (counts[DeliveryStatus.PENDING], counts[DeliveryStatus.SUCCEEDED]) == (1, 2)
    assert [ctx.event_id for ctx in SEEN] == [waiting_id, *others]
    assert all(row(e).status == DeliveryStatus.SUCCEEDED for e in others)


def test_deliver_one_reschedules_returns_pending_and_then_refuses_the_row() -> None:
    """'A direct deliver_one() reschedules the same way and returns PENDING, and refuses a
    pending row whose time has not come, as it refuses one waiting out its backoff.'"""
    until = timezone.now() + DAY
    answers = iter([not_until(until)])
    declare(lambda ctx: next(answers)(ctx))
    event_id = fire_one(OfferMade(offer_id=1))
    delivery_id = row(event_id).pk
    assert deliver_one(delivery_id) == DeliveryStatus.PENDING
    assert (row(event_id).status, row(event_id).due_at) == (DeliveryStatus.PENDING, until)
    assert deliver_one(delivery_id) is None  # its time has not come
    assert len(SEEN) == 1


def test_deliver_one_refuses_a_scheduled_row_and_a_row_in_backoff() -> None:
    """'... refuses a pending row whose time has not come, as it refuses one waiting out its
    backoff.'"""
    ran: list[int] = []
    receiver(OfferMade, key="scheduled.later", due=timedelta(hours=1))(
        lambda evt: ran.append(evt.offer_id)
    )

    def broken(evt: OfferMade) -> None:
        raise ValueError("broken")

    receiver(OfferMade, key="scheduled.broken", backoff_base_seconds=600)(broken)
    event_id = fire_one(OfferMade(offer_id=1))
    assert deliver_one(row(event_id, "scheduled.later").pk) is None
    assert deliver_one(row(event_id, "scheduled.broken").pk) == DeliveryStatus.FAILED
    backing_off = row(event_id, "scheduled.broken")
    if backing_off.available_at > timezone.now():  # full jitter may draw (almost) zero
        assert deliver_one(backing_off.pk) is None
    assert ran == []


def test_a_naive_until_is_refused_unless_use_tz_is_false() -> None:
    """'until must be an aware datetime ... A naive one is refused - under USE_TZ = False it is
    local time instead, and accepted'."""
    naive = datetime.now() + HOUR
    if settings.USE_TZ:
        with pytest.raises(TypeError, match="aware"):
            NotYet(naive)
    else:
        assert NotYet(naive).until == naive


@pytest.mark.parametrize(
    "ago", [timedelta(0), SECOND, DAY], ids=["now", "a-second-ago", "a-day-ago"]
)
def test_a_time_already_come_is_refused_when_the_exception_is_built(ago: timedelta) -> None:
    """'until must be ... in the future when the exception is built ... and so is a time already
    come'."""
    with pytest.raises(ValueError, match="not in the future"):
        NotYet(timezone.now() - ago)


def test_a_future_until_is_kept_with_its_reason() -> None:
    """'NotYet(until, reason="")'."""
    until = timezone.now() + DAY
    answer = NotYet(until, reason="the offer was extended")
    assert (answer.until, answer.reason) == (until, "the offer was extended")


@pytest.mark.parametrize("kind", ["past", "naive"])
def test_raising_a_refused_until_is_an_ordinary_counted_failure_with_that_message(
    kind: str,
) -> None:
    """'Both are refused where the exception is constructed, so a receiver raising either has
    raised an ordinary TypeError or ValueError, which the relay records as an ordinary failure,
    counted, with that message.' (A naive until under USE_TZ = False is local time, and
    reschedules instead.)"""
    told: list[DeliveryFailure] = []

    def react(evt: OfferMade) -> None:
        if kind == "past":
            raise NotYet(timezone.now() - HOUR, reason="moved")
        raise NotYet(datetime.now() + HOUR, reason="moved")

    receiver(OfferMade, key=KEY, on_failure=told.append)(react)
    event_id = fire_one(OfferMade(offer_id=1))
    counts = deliver_pending()
    if kind == "naive" and not settings.USE_TZ:
        assert counts[DeliveryStatus.PENDING] == 1 and told == []
        assert row(event_id).status == DeliveryStatus.PENDING
        return
    error, phrase = (
        (ValueError, "is not in the future")
        if kind == "past"
        else (TypeError, "must be an aware datetime")
    )
    assert counts[DeliveryStatus.FAILED] == 1
    failed = row(event_id)
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, 1)
    assert failed.last_error.startswith(f"{error.__name__}: NotYet(until=")
    assert phrase in failed.last_error
    assert [(f.status, type(f.error), f.attempt) for f in told] == [("failed", error, 1)]


def test_the_clock_term_lets_a_late_run_proceed() -> None:
    """'The clock term is there because a late run must proceed rather than fail: a row that
    runs after the moved time has nothing left to wait for, and NotYet refuses a time already
    come, so comparing against ctx.due_at alone would raise that refusal as an ordinary failure
    on every retry.'"""
    declare_expire_offer()

    def naive_compare(evt: OfferMade, ctx: DeliveryContext) -> None:
        offer = OFFERS[evt.offer_id]
        assert ctx.due_at is not None
        if offer.expires_at > ctx.due_at:  # without the clock term
            raise NotYet(offer.expires_at, reason="the offer was extended")

    receiver(OfferMade, key="scheduled.naive_compare", due=timedelta(hours=48), takes_context=True)(
        naive_compare
    )
    event_id, _ = make_offer()
    # The relay was down: the 48-hour row came due three days ago, and the extended expiry
    # passed yesterday. (The row is aged in the table; nothing else is touched.)
    long_ago = timezone.now() - 3 * DAY
    DeliveryRecord.objects.filter(event_id=event_id).update(due_at=long_ago, available_at=long_ago)
    OFFERS[1].expires_at = timezone.now() - DAY
    deliver_pending()
    assert row(event_id, EXPIRE).status == DeliveryStatus.SUCCEEDED
    assert OFFERS[1].expired
    without_clock = row(event_id, "scheduled.naive_compare")
    assert without_clock.status == DeliveryStatus.FAILED
    assert "not in the future" in without_clock.last_error


def test_an_inline_receiver_raising_not_yet_fails_the_callers_transaction() -> None:
    """'Only a durable receiver can be rescheduled: NotYet is read by the relay and by nothing
    else. An INLINE receiver raising it fails the caller's transaction like any other
    exception'."""

    def inline(evt: OfferMade) -> None:
        raise NotYet(timezone.now() + DAY)

    receiver(OfferMade, key=KEY, mode=INLINE)(inline)
    with pytest.raises(NotYet), transaction.atomic():
        Order.objects.create(number="open")
        fire(OfferMade(offer_id=1))
    assert not Order.objects.exists()
    assert not EventRecord.objects.exists()


def test_an_on_commit_receiver_raising_not_yet_has_it_logged(
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """'... and an ON_COMMIT one has it logged.'"""

    def after(evt: OfferMade) -> None:
        raise NotYet(timezone.now() + DAY, reason="later")

    receiver(OfferMade, key=KEY, mode=ON_COMMIT)(after)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        event_id = fire(OfferMade(offer_id=1))
    assert event_id is not None
    assert EventRecord.objects.filter(pk=event_id).exists()  # the change committed
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is NotYet]
    assert len(logged) == 1
    assert KEY in logged[0].getMessage()
    assert logged[0].levelno >= logging.ERROR


def test_any_durable_receiver_may_answer_not_until_then() -> None:
    """'NotYet is not limited to receivers declared with due=, though: any durable receiver can
    answer "not until then", and its row is scheduled from that moment.'"""
    until = timezone.now() + DAY
    answers = iter([not_until(until), lambda ctx: None])
    declare(lambda ctx: next(answers)(ctx))
    event_id = fire_one(OfferMade(offer_id=1))
    assert deliver_pending()[DeliveryStatus.PENDING] == 1
    health = {r.key: r for r in outbox_health().receivers}[KEY]
    assert (health.scheduled, health.owed) == (1, 0)
    assert total(drain_outbox()) == 0
    assert drain_outbox(now=until + SECOND)[DeliveryStatus.SUCCEEDED] == 1
    assert [ctx.due_at for ctx in SEEN][1] == until
    assert row(event_id).status == DeliveryStatus.SUCCEEDED


@pytest.mark.parametrize("until", [3600, 3600.0, timedelta(hours=1)], ids=["int", "float", "td"])
def test_not_yet_takes_an_absolute_time_not_a_delay(until: Any) -> None:
    """The comparison table: 'Takes ... RetryAfter: A delay; NotYet: An absolute time'."""
    with pytest.raises(TypeError, match="must be a datetime"):
        NotYet(until)


def test_not_yet_and_retry_after_side_by_side() -> None:
    """The comparison table, row by row for the two answers: RetryAfter spends an attempt, is
    recorded as failed with last_error and tells on_failure; NotYet spends none, is not
    jittered (available_at is until exactly) and is recorded as pending, with neither."""
    told: list[DeliveryFailure] = []
    until = timezone.now() + HOUR

    def not_yet(evt: OfferMade) -> None:
        raise NotYet(until, reason="the offer was extended")

    def retry_after(evt: OfferMade) -> None:
        raise RetryAfter(3600, reason="come back in an hour")

    receiver(OfferMade, key="scheduled.not_yet", on_failure=told.append)(not_yet)
    receiver(OfferMade, key="scheduled.retry_after", on_failure=told.append)(retry_after)
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending()
    waiting, retrying = row(event_id, "scheduled.not_yet"), row(event_id, "scheduled.retry_after")
    assert (waiting.status, waiting.attempts, waiting.last_error) == ("pending", 0, "")
    assert waiting.available_at == waiting.due_at == until
    assert (retrying.status, retrying.attempts) == ("failed", 1)
    assert retrying.last_error == "RetryAfter: come back in an hour"
    assert [f.receiver_key for f in told] == ["scheduled.retry_after"]


@override_settings(
    DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.scheduled.test_not_yet.QueueBackend"}
)
def test_a_task_workers_deliver_one_reschedules_and_returns_pending() -> None:
    """'A direct deliver_one() reschedules the same way and returns PENDING' - also the one a
    task worker calls for a site="task" receiver."""
    until = timezone.now() + DAY
    declare(not_until(until), site="task")
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending()
    (message,) = QueueBackend.messages
    assert deliver_one(message[0], claimed_by=message[1], claimed_at=message[2]) == "pending"
    waiting = row(event_id)
    assert (waiting.status, waiting.attempts, waiting.due_at) == ("pending", 0, until)


def test_an_async_receiver_may_raise_not_yet() -> None:
    """'any durable receiver can answer "not until then"' - an async def one too."""
    until = timezone.now() + DAY

    async def later(evt: OfferMade) -> None:
        raise NotYet(until)

    receiver(OfferMade, key=KEY)(later)
    event_id = fire_one(OfferMade(offer_id=1))
    assert deliver_pending()[DeliveryStatus.PENDING] == 1
    assert (row(event_id).status, row(event_id).due_at) == (DeliveryStatus.PENDING, until)


def test_an_eager_receivers_attempt_at_commit_may_raise_not_yet(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """'any durable receiver can answer "not until then", and its row is scheduled from that
    moment' - an eager one at its attempt after commit too."""
    until = timezone.now() + DAY
    declare(not_until(until), eager=True)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        event_id = fire(OfferMade(offer_id=1))
    assert event_id is not None
    assert len(SEEN) == 1  # the eager attempt ran
    assert (row(event_id).status, row(event_id).due_at) == (DeliveryStatus.PENDING, until)
    assert row(event_id).attempts == 0
