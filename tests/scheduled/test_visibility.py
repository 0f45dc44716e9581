"""Seed 000, "Is it keeping up?", "A scheduled row holds its event", "A scheduled receiver can
look quiet", and the catalogue's due_seconds / due_callable."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from django_domain_events import (
    DeliveryStatus,
    catalogue,
    deliver_pending,
    drain_outbox,
    event,
    outbox_health,
    prune_events,
    quiet_receivers,
    receiver,
    render_catalogue,
)
from django_domain_events.introspect import ReceiverBacklog
from django_domain_events.models import EventRecord
from tests.app.events import Brief, UntilConsumed, UntilSettled
from tests.scheduled.support import DAY, HOUR, MINUTE, SECOND, command, fire_one, now, row

pytestmark = pytest.mark.django_db

REMIND = "invoices.remind"
FORTNIGHT = timedelta(days=14)


@event(name="scheduled.visibility.InvoiceIssued")
@dataclass(frozen=True)
class InvoiceIssued:
    invoice_id: int
    pay_by: datetime | None = None


def pay_by(evt: InvoiceIssued) -> datetime:
    assert evt.pay_by is not None
    return evt.pay_by


def backlog(key: str, **kwargs: datetime) -> ReceiverBacklog:
    return {r.key: r for r in outbox_health(**kwargs).receivers}[key]


def test_a_scheduled_row_is_counted_as_scheduled_not_as_owed() -> None:
    """'A scheduled row is work that has not arrived. outbox_health() counts it as scheduled,
    not as owed'."""
    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT)(lambda evt: None)
    fire_one(InvoiceIssued(invoice_id=1))
    health = outbox_health()
    assert (health.owed, health.scheduled, health.claimed, health.dead) == (0, 1, 0, 0)
    mine = backlog(REMIND)
    assert (mine.owed, mine.scheduled) == (0, 1)
    lanes = {lane.lane: lane for lane in health.lanes}
    assert (lanes["default"].owed, lanes["default"].scheduled) == (0, 1)


def test_a_scheduled_row_never_ages_the_backlog() -> None:
    """'... and never reads the backlog age from it: a reminder due in fourteen days would
    otherwise trip a five-minute backlog alert five minutes after it was written, and hold it
    open for the fortnight.'"""
    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT)(lambda evt: None)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    for moment in (now() + 5 * MINUTE, now() + 7 * DAY, due - SECOND):
        health = outbox_health(now=moment)
        assert (health.owed, health.scheduled, health.oldest_owed_at) == (0, 1, None)
        assert health.lanes[0].oldest_owed_at is None
        assert backlog(REMIND, now=moment).oldest_owed_at is None


def test_once_due_a_row_is_owed_and_its_age_is_measured_from_its_due_time() -> None:
    """'Once it comes due, a row is owed like any other, and its age is measured from its due
    time rather than from its event: a reminder failing an hour after it came due is an hour
    behind, not a fortnight.'"""

    def remind(evt: InvoiceIssued) -> None:
        raise ConnectionError("smtp refused")

    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT, backoff_base_seconds=60)(remind)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    due = row(event_id).due_at
    health = outbox_health(now=due)
    assert (health.owed, health.scheduled, health.oldest_owed_at) == (1, 0, due)
    deliver_pending(now=due + SECOND)
    assert row(event_id).status == DeliveryStatus.FAILED
    an_hour_on = due + HOUR
    health = outbox_health(now=an_hour_on)
    assert (health.owed, health.scheduled) == (1, 0)
    assert health.oldest_owed_at == due
    assert an_hour_on - health.oldest_owed_at == HOUR  # an hour behind, not a fortnight
    assert backlog(REMIND, now=an_hour_on).oldest_owed_at == due


def test_events_status_prints_the_scheduled_total_and_a_scheduled_figure_per_receiver() -> None:
    """'events_status prints the scheduled total and a scheduled= figure per receiver beside
    owed=.'"""
    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT)(lambda evt: None)
    receiver(InvoiceIssued, key="invoices.file")(lambda evt: None)
    fire_one(InvoiceIssued(invoice_id=1))
    fire_one(InvoiceIssued(invoice_id=2))
    lines = command("events_status").splitlines()
    assert lines[0].startswith("owed=2 scheduled=2 ")
    assert f"receiver {REMIND}: owed=0 scheduled=2 claimed=0 dead=0 oldest=-" in lines
    assert any(line.startswith("receiver invoices.file: owed=2 scheduled=0 ") for line in lines)
    data = json.loads(command("events_status", "--format", "json"))
    assert (data["owed"], data["scheduled"]) == (2, 2)
    by_key = {r["key"]: r for r in data["receivers"]}
    assert (by_key[REMIND]["owed"], by_key[REMIND]["scheduled"]) == (0, 2)


def test_the_catalogue_publishes_due_seconds_or_due_callable_with_a_line_under_the_table() -> None:
    """'The catalogue publishes a receiver's due time as due_seconds or due_callable, with a line
    under its table, so a reader sees that a reaction runs later.'"""
    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT)(lambda evt: None)
    receiver(InvoiceIssued, key="invoices.chase", due=pay_by)(lambda evt: None)
    receiver(InvoiceIssued, key="invoices.file")(lambda evt: None)
    cat = catalogue()
    (invoice,) = [e for e in cat.events if e.name == "scheduled.visibility.InvoiceIssued"]
    by_key = {r.key: r for r in invoice.receivers}
    assert (by_key[REMIND].due_seconds, by_key[REMIND].due_callable) == (1_209_600, None)
    assert by_key["invoices.chase"].due_seconds is None
    assert by_key["invoices.chase"].due_callable == f"{__name__}.pay_by"
    assert (by_key["invoices.file"].due_seconds, by_key["invoices.file"].due_callable) == (
        None,
        None,
    )
    markdown = render_catalogue(cat)
    section = markdown.split("scheduled.visibility.InvoiceIssued", 1)[1]
    section = section.split("\n## ", 1)[0].split("### Receivers", 1)[1]
    notes = [line for line in section.splitlines() if line.startswith("- ")]
    assert any(REMIND in n and "due=1209600s" in n for n in notes), notes
    assert any("invoices.chase" in n and f"{__name__}.pay_by" in n for n in notes), notes
    assert not any("invoices.file" in n for n in notes)
    data = json.loads(render_catalogue(cat, format="json"))
    (invoice_json,) = [e for e in data["events"] if e["name"] == invoice.name]
    json_by_key = {r["key"]: r for r in invoice_json["receivers"]}
    assert json_by_key[REMIND]["due_seconds"] == 1_209_600
    assert json_by_key["invoices.chase"]["due_callable"] == f"{__name__}.pay_by"


def test_a_scheduled_row_holds_its_event_whatever_its_retention() -> None:
    """'A prune deletes only events with no unsettled delivery, so a row due in six weeks keeps
    its event for six weeks, whatever the event's retention. ... the event goes at the first
    prune after its last delivery settles.'"""
    six_weeks = timedelta(weeks=6)
    for cls in (InvoiceIssued, Brief, UntilSettled, UntilConsumed):
        receiver(cls, key=f"later.{cls.__name__}", due=six_weeks)(lambda evt: None)
    receiver(Brief, key="now.Brief")(lambda evt: None)
    held = [
        fire_one(InvoiceIssued(invoice_id=1)),
        fire_one(Brief()),
        fire_one(UntilSettled()),
        fire_one(UntilConsumed()),
    ]
    drain_outbox()  # the Brief's immediate receiver succeeds; the scheduled rows wait
    due = max(row(event_id, key).due_at for event_id, key in zip(held, later_keys(), strict=True))
    for moment in (now() + 2 * HOUR, now() + 5 * 7 * DAY, due - SECOND):
        assert prune_events(older_than=timedelta(0), now=moment) == 0
    assert EventRecord.objects.filter(pk__in=held).count() == 4
    drain_outbox(now=due)
    assert all(
        row(e, k).status == DeliveryStatus.SUCCEEDED
        for e, k in zip(held, later_keys(), strict=True)
    )
    assert prune_events(older_than=timedelta(0), now=due + SECOND) == 4
    assert not EventRecord.objects.filter(pk__in=held).exists()


def later_keys() -> list[str]:
    return [f"later.{cls.__name__}" for cls in (InvoiceIssued, Brief, UntilSettled, UntilConsumed)]


def test_a_scheduled_receiver_with_nothing_due_looks_quiet() -> None:
    """'quiet_receivers() reports a receiver with no success inside its window, and a scheduled
    receiver has none on days nothing came due. Choose within for it from its schedule.'"""
    receiver(InvoiceIssued, key=REMIND, due=FORTNIGHT)(lambda evt: None)
    event_id = fire_one(InvoiceIssued(invoice_id=1))
    quiet = quiet_receivers(within=DAY)
    assert [(q.key, q.last_succeeded_at) for q in quiet] == [(REMIND, None)]  # work is waiting
    drain_outbox(now=row(event_id).due_at)
    assert quiet_receivers(within=DAY) == []
    three_days_on = now() + 3 * DAY  # nothing came due since
    assert [q.key for q in quiet_receivers(within=DAY, now=three_days_on)] == [REMIND]
    assert quiet_receivers(within=FORTNIGHT + DAY, now=three_days_on) == []
