"""Seed 000, "The due time is frozen at fire time"."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from django_domain_events import (
    DeliveryContext,
    DeliveryStatus,
    deliver_pending,
    receiver,
    registry,
    replay_events,
)
from tests.scheduled.support import (
    DAY,
    HOUR,
    MINUTE,
    OfferMade,
    event_row,
    fire_one,
    now,
    row,
)

pytestmark = pytest.mark.django_db

KEY = "scheduled.expire_offer"


def declare(due: timedelta, seen: list[DeliveryContext] | None = None) -> None:
    """Declare (or, as a deploy would, redeclare) the expiry with ``due``."""
    registry.forget(KEY)

    def expire_offer(evt: OfferMade, ctx: DeliveryContext) -> None:
        if seen is not None:
            seen.append(ctx)

    receiver(OfferMade, key=KEY, due=due, takes_context=True)(expire_offer)


def test_a_deploy_changing_the_delay_reaches_the_next_event_not_the_rows_waiting() -> None:
    """'Like max_attempts, it is resolved once, when the event fires, and written onto the row.
    A deploy that changes the delay reaches the next event, not the rows already waiting.'"""
    seen: list[DeliveryContext] = []
    declare(timedelta(hours=48), seen)
    waiting = fire_one(OfferMade(offer_id=1))
    declare(timedelta(hours=72), seen)  # the deploy
    following = fire_one(OfferMade(offer_id=2))
    first_due = event_row(waiting).occurred_at + timedelta(hours=48)
    assert row(waiting).due_at == first_due
    assert row(following).due_at == event_row(following).occurred_at + timedelta(hours=72)
    # The waiting row still runs at its own time, and is told that time.
    assert deliver_pending(now=first_due + MINUTE)[DeliveryStatus.SUCCEEDED] == 1
    assert [(ctx.event_id, ctx.due_at) for ctx in seen] == [(waiting, first_due)]
    assert row(following).status == DeliveryStatus.PENDING


def test_a_due_callable_is_called_once_at_fire_and_never_again_by_the_relay() -> None:
    """'it is resolved once, when the event fires, and written onto the row.'"""
    calls: list[int] = []
    plan = {"when": now() + 2 * DAY}

    def when(evt: OfferMade) -> datetime:
        calls.append(evt.offer_id)
        return plan["when"]

    receiver(OfferMade, key=KEY, due=when)(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1))
    assert calls == [1]
    written = row(event_id).due_at
    plan["when"] = now() + 9 * DAY  # what the callable would say now makes no difference
    assert deliver_pending(now=written + MINUTE)[DeliveryStatus.SUCCEEDED] == 1
    assert calls == [1]
    assert row(event_id).due_at == written


def test_a_replay_resolves_the_due_time_afresh() -> None:
    """'A replay resolves it afresh.'"""
    declare(timedelta(hours=48))
    event_id = fire_one(OfferMade(offer_id=1))
    occurred = event_row(event_id).occurred_at
    assert deliver_pending(now=occurred + timedelta(hours=49))[DeliveryStatus.SUCCEEDED] == 1
    declare(timedelta(days=10))
    assert replay_events([event_id]) == {"reopened": 1, "added": 0}
    replayed = row(event_id)
    assert replayed.status == DeliveryStatus.PENDING
    assert replayed.due_at == occurred + timedelta(days=10)
    assert replayed.available_at == replayed.due_at


def test_a_replay_calls_the_due_callable_again() -> None:
    """'A replay resolves it afresh.' (the callable spelling)"""
    calls: list[int] = []
    plan = {"when": now() + HOUR}

    def when(evt: OfferMade) -> datetime:
        calls.append(evt.offer_id)
        return plan["when"]

    receiver(OfferMade, key=KEY, due=when)(lambda evt: None)
    event_id = fire_one(OfferMade(offer_id=1))
    deliver_pending(now=plan["when"] + MINUTE)
    plan["when"] = now() + 5 * DAY
    replay_events([event_id])
    assert calls == [1, 1]
    assert row(event_id).due_at == plan["when"]
