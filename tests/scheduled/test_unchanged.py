"""Seed 000, "Unchanged by a due time": task hand-off, attempts, give_up_after, lanes, leases."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from django_domain_events import (
    DeliveryContext,
    DeliveryFailure,
    DeliveryStatus,
    RetryAfter,
    deliver_one,
    deliver_pending,
    drain_outbox,
    event,
    outbox_health,
    receiver,
)
from django_domain_events.models import DeliveryRecord
from tests.scheduled.support import HOUR, MINUTE, SECOND, event_row, fire_one, row, total

pytestmark = pytest.mark.django_db


@event(name="scheduled.unchanged.InvoiceIssued")
@dataclass(frozen=True)
class InvoiceIssued:
    invoice_id: int


KEY = "invoices.remind"


class RecordingBackend:
    """A task queue that only records what it is given (it may as well lose it)."""

    calls: list[dict[str, Any]] = []

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        RecordingBackend.calls.append(
            {"delivery_id": delivery_id, "claimed_by": claimed_by, "claimed_at": claimed_at}
        )


@pytest.fixture(autouse=True)
def fresh_backend() -> None:
    RecordingBackend.calls = []


TASKS = override_settings(
    DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.scheduled.test_unchanged.RecordingBackend"}
)


@TASKS
def test_a_task_receiver_is_handed_to_the_backend_only_once_due() -> None:
    """'site="task" works as it does for every receiver. The relay claims the row at its due
    time and then hands it to the task backend. Nothing relies on a queue's own delayed
    delivery ... and is visible where every other delivery is.'"""
    seen: list[DeliveryContext] = []
    receiver(InvoiceIssued, key=KEY, due=timedelta(days=14), site="task", takes_context=True)(
        lambda evt, ctx: seen.append(ctx)
    )
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = event_row(event_id).occurred_at + timedelta(days=14)
    assert total(deliver_pending()) == 0
    assert total(deliver_pending(now=due - SECOND)) == 0
    assert RecordingBackend.calls == []  # nothing was queued to wait in the queue
    waiting = row(event_id)
    assert (waiting.status, waiting.claimed_at) == (DeliveryStatus.PENDING, None)
    by_key = {r.key: r for r in outbox_health().receivers}
    assert (by_key[KEY].scheduled, by_key[KEY].owed) == (1, 0)

    assert total(deliver_pending(now=due + SECOND)) == 0  # a hand-off is not counted
    (call,) = RecordingBackend.calls
    claimed = row(event_id)
    assert claimed.status == DeliveryStatus.CLAIMED
    assert call["delivery_id"] == claimed.pk and call["claimed_by"] == claimed.claimed_by
    assert claimed.claimed_at is not None and call["claimed_at"] == claimed.claimed_at.isoformat()
    assert set(call) == {"delivery_id", "claimed_by", "claimed_at"}  # no delay, eta or countdown
    # The worker delivers it under that claim.
    assert (
        deliver_one(
            call["delivery_id"], claimed_by=call["claimed_by"], claimed_at=call["claimed_at"]
        )
        == DeliveryStatus.SUCCEEDED
    )
    assert [ctx.due_at for ctx in seen] == [due]


@TASKS
def test_the_schedule_survives_a_queue_that_loses_the_message() -> None:
    """'... so the schedule survives a queue that loses messages': the row stays claimed in the
    table, and is claimed and handed off again once the lost claim's lease has lapsed."""
    receiver(InvoiceIssued, key=KEY, due=timedelta(days=14), site="task")(lambda evt: None)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    deliver_pending(now=due + SECOND)
    lost = row(event_id)  # RecordingBackend never runs anything: the message is lost
    assert lost.lease_expires_at is not None
    deliver_pending(now=lost.lease_expires_at + SECOND)
    assert [c["delivery_id"] for c in RecordingBackend.calls] == [lost.pk, lost.pk]
    assert RecordingBackend.calls[0]["claimed_at"] != RecordingBackend.calls[1]["claimed_at"]


def test_attempts_backoff_and_dead_letters_start_at_the_due_time() -> None:
    """'Attempts, backoff and dead letters start at the due time. A receiver failing after it
    came due retries on its curve and dead-letters on its budget, as any other does.'"""
    told: list[DeliveryFailure] = []

    def remind(evt: InvoiceIssued) -> None:
        raise ConnectionError("smtp refused")

    receiver(
        InvoiceIssued,
        key=KEY,
        due=timedelta(days=14),
        max_attempts=3,
        backoff_base_seconds=10,
        backoff_cap_seconds=10,
        on_failure=told.append,
    )(remind)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    assert total(drain_outbox()) == 0  # not due: no attempt spent, nothing failed
    assert row(event_id).attempts == 0 and told == []

    came_due = due + SECOND
    assert deliver_pending(now=came_due)[DeliveryStatus.FAILED] == 1
    failed = row(event_id)
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, 1)
    # On its curve from the moment it ran: first ceiling min(10 * 2**0, 10) = 10s.
    assert came_due <= failed.available_at <= came_due + timedelta(seconds=10)
    assert failed.last_error == "ConnectionError: smtp refused"

    counts = drain_outbox(now=came_due)  # skips the backoff: the budget runs out
    assert (counts[DeliveryStatus.FAILED], counts[DeliveryStatus.DEAD]) == (1, 1)
    dead = row(event_id)
    assert (dead.status, dead.attempts) == (DeliveryStatus.DEAD, 3)
    assert [(f.attempt, f.status) for f in told] == [(1, "failed"), (2, "failed"), (3, "dead")]


def test_give_up_after_measures_from_the_due_time() -> None:
    """'give_up_after measures from the due time, which is when the row became owed.'"""

    def busy(evt: InvoiceIssued) -> None:
        raise RetryAfter(60, reason="mail server busy", counts=False)

    receiver(InvoiceIssued, key=KEY, due=timedelta(days=14), give_up_after=HOUR)(busy)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    # Fourteen days after the event, but owed only half an hour: a deferral, not a dead letter.
    assert deliver_pending(now=due + 30 * MINUTE)[DeliveryStatus.FAILED] == 1
    deferred = row(event_id)
    assert (deferred.status, deferred.attempts) == (DeliveryStatus.FAILED, 0)
    # Owed two hours: past give_up_after.
    assert deliver_pending(now=due + 2 * HOUR)[DeliveryStatus.DEAD] == 1
    dead = row(event_id)
    assert dead.status == DeliveryStatus.DEAD and "give_up_after" in dead.last_error


def test_the_lane_is_what_the_declaration_says() -> None:
    """'Lanes, leases and on_failure are what the declaration says.' (lane)"""
    ran: list[int] = []
    receiver(InvoiceIssued, key=KEY, due=timedelta(days=14), lane="reminders")(
        lambda evt: ran.append(evt.invoice_id)
    )
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    lanes = {lane.lane: lane for lane in outbox_health().lanes}
    assert (lanes["reminders"].scheduled, lanes["default"].scheduled) == (1, 0)
    assert total(deliver_pending(lane="default", now=due + SECOND)) == 0
    assert ran == []
    assert deliver_pending(lane="reminders", now=due + SECOND)[DeliveryStatus.SUCCEEDED] == 1
    assert ran == [1]


def test_the_lease_is_what_the_declaration_says() -> None:
    """'Lanes, leases and on_failure are what the declaration says.' (lease_seconds)"""
    leases: list[timedelta] = []

    def remind(evt: InvoiceIssued, ctx: DeliveryContext) -> None:
        assert ctx.delivery_id is not None
        held = DeliveryRecord.objects.get(pk=ctx.delivery_id)
        assert held.lease_expires_at is not None and held.claimed_at is not None
        leases.append(held.lease_expires_at - held.claimed_at)

    receiver(
        InvoiceIssued,
        key=KEY,
        due=timedelta(days=14),
        lease_seconds=30,
        lane="leased",
        takes_context=True,
    )(remind)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    deliver_pending(now=row(event_id).due_at + SECOND)
    # lease_seconds with the package's 10% headroom, not LEASE_SECONDS (300).
    assert leases == [timedelta(seconds=33)]


def test_on_failure_is_what_the_declaration_says() -> None:
    """'Lanes, leases and on_failure are what the declaration says.' (on_failure)"""
    told: list[DeliveryFailure] = []

    def remind(evt: InvoiceIssued) -> None:
        raise ValueError("template missing")

    receiver(InvoiceIssued, key=KEY, due=timedelta(days=14), on_failure=told.append)(remind)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    drain_outbox()
    assert told == []
    deliver_pending(now=row(event_id).due_at + SECOND)
    (failure,) = told
    assert (failure.receiver_key, failure.event_id, failure.status, failure.attempt) == (
        KEY,
        event_id,
        "failed",
        1,
    )
    assert isinstance(failure.error, ValueError)
