"""Seed 000: 'A scheduled fan-out is a follow-up event', its example run as written."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from django_domain_events import (
    DeliveryContext,
    DeliveryStatus,
    assert_fired,
    drain_outbox,
    event,
    fire,
    receiver,
)
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.scheduled.support import DAY, MINUTE, fire_one, now, row, total

pytestmark = pytest.mark.django_db


@event(name="scheduled.fanout.ActivityPlanned")
@dataclass(frozen=True)
class ActivityPlanned:
    activity_id: int
    starts_at: datetime


@event(name="scheduled.fanout.ActivityReminderDue")
@dataclass(frozen=True)
class ActivityReminderDue:
    activity_id: int


# Who is signed up, as the application knows it now (a stand-in for an attendees table).
ATTENDEES: dict[int, list[str]] = {}
reminded: list[tuple[int, str]] = []


def attendees_now(evt: ActivityReminderDue, ctx: DeliveryContext) -> list[str]:
    return list(ATTENDEES.get(evt.activity_id, []))


@pytest.fixture(autouse=True)
def declared() -> None:
    """The seed's two receivers, as written (with explicit keys)."""
    ATTENDEES.clear()
    reminded.clear()

    @receiver(
        ActivityPlanned,
        key="activities.remind_attendees",
        due=lambda evt: evt.starts_at - timedelta(days=1),
    )
    def remind_attendees(evt: ActivityPlanned) -> None:
        fire(ActivityReminderDue(activity_id=evt.activity_id))

    @receiver(
        ActivityReminderDue, key="activities.remind", targets=attendees_now, takes_context=True
    )
    def remind(evt: ActivityReminderDue, ctx: DeliveryContext) -> None:
        reminded.append((evt.activity_id, ctx.target))


def test_the_follow_up_receivers_targets_are_resolved_when_the_work_is_due() -> None:
    """'Declare the scheduled receiver without targets=, and have it fire an event of its own
    when it runs; a receiver of that event declares targets=, which are resolved when the work
    is due rather than when it was scheduled.'"""
    ATTENDEES[1] = ["ann", "bob"]
    starts_at = now() + 10 * DAY
    planned = fire_one(ActivityPlanned(activity_id=1, starts_at=starts_at))
    reminder_due = starts_at - DAY
    assert row(planned).due_at == reminder_due
    assert total(drain_outbox()) == 0  # nothing due yet
    assert not EventRecord.objects.filter(name="scheduled.fanout.ActivityReminderDue").exists()
    assert not DeliveryRecord.objects.filter(receiver_key="activities.remind").exists()

    ATTENDEES[1] = ["bob", "cy"]  # ann cancels, cy signs up, in the nine days between
    counts = drain_outbox(now=reminder_due + MINUTE)
    assert counts[DeliveryStatus.SUCCEEDED] == 3  # the scheduled receiver and two reminders
    assert row(planned).status == DeliveryStatus.SUCCEEDED
    (follow_up,) = assert_fired(ActivityReminderDue, times=1)
    assert follow_up == ActivityReminderDue(activity_id=1)
    fanned = DeliveryRecord.objects.filter(receiver_key="activities.remind")
    assert sorted(fanned.values_list("target", flat=True)) == ["bob", "cy"]
    assert sorted(reminded) == [(1, "bob"), (1, "cy")]
    # The follow-up event records why it exists: the scheduled reaction that fired it.
    reminder = EventRecord.objects.get(name="scheduled.fanout.ActivityReminderDue")
    assert reminder.causation_id == planned


def test_nobody_is_reminded_when_nobody_is_left_by_the_due_time() -> None:
    """'... targets=, which are resolved when the work is due' (an empty result writes no row)."""
    ATTENDEES[2] = ["ann"]
    starts_at = now() + 3 * DAY
    fire_one(ActivityPlanned(activity_id=2, starts_at=starts_at))
    ATTENDEES[2] = []
    drain_outbox(now=starts_at - DAY + MINUTE)
    assert_fired(ActivityReminderDue, times=1)
    assert not DeliveryRecord.objects.filter(receiver_key="activities.remind").exists()
    assert reminded == []
