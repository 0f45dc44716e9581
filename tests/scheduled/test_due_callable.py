"""Seed 000, "A callable runs inside the caller's transaction"."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from django_domain_events import event, fire, receiver
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.models import Order
from tests.scheduled.support import DAY, row

pytestmark = pytest.mark.django_db


@event(name="scheduled.callable.InvoiceIssued")
@dataclass(frozen=True)
class InvoiceIssued:
    number: str


KEY = "scheduled.remind_invoice"


def nothing_written() -> bool:
    return (
        not Order.objects.exists()
        and not EventRecord.objects.exists()
        and not DeliveryRecord.objects.exists()
    )


def issue_invoice(number: str = "INV-1") -> int | None:
    """The business change and its event, in one transaction."""
    with transaction.atomic():
        Order.objects.create(number=number, total=14)
        return fire(InvoiceIssued(number=number))


@pytest.mark.django_db(transaction=True)
def test_the_callable_runs_at_fire_time_seeing_the_changes_uncommitted_rows() -> None:
    """'As a targets= callable does: at fire time, beside the event row, seeing the business
    change's own uncommitted rows.'"""
    seen: list[tuple[bool, bool]] = []

    def fortnight_after_invoice(evt: InvoiceIssued) -> datetime:
        order = Order.objects.get(number=evt.number)  # written in the same, open transaction
        seen.append(
            (
                connection.in_atomic_block,
                EventRecord.objects.filter(name="scheduled.callable.InvoiceIssued").exists(),
            )
        )
        issued = EventRecord.objects.get(name="scheduled.callable.InvoiceIssued").occurred_at
        return issued + timedelta(days=order.total)

    receiver(InvoiceIssued, key=KEY, due=fortnight_after_invoice)(lambda evt: None)
    event_id = issue_invoice()
    assert event_id is not None
    # Once, inside the caller's transaction, beside the event row.
    assert seen == [(True, True)]
    occurred = EventRecord.objects.get(pk=event_id).occurred_at
    assert row(event_id).due_at == occurred + timedelta(days=14)


def test_a_callable_that_raises_makes_fire_raise_and_rolls_the_change_back() -> None:
    """'If it raises ... fire() raises and the caller's change rolls back.'"""

    def lookup(evt: InvoiceIssued) -> datetime:
        raise LookupError("no payment terms for this customer")

    receiver(InvoiceIssued, key=KEY, due=lookup)(lambda evt: None)
    with pytest.raises(LookupError, match="no payment terms"):
        issue_invoice()
    assert nothing_written()


@pytest.mark.parametrize(
    "returned",
    [None, "2031-01-01T09:00:00+00:00", date(2031, 1, 1), 1_900_000_000, timedelta(days=14)],
    ids=["none", "iso-string", "date", "epoch-int", "timedelta"],
)
def test_a_callable_returning_anything_but_a_datetime_rolls_the_change_back(
    returned: Any,
) -> None:
    """'If it ... returns anything but an aware datetime, fire() raises and the caller's
    change rolls back.'"""
    receiver(InvoiceIssued, key=KEY, due=lambda evt: returned)(lambda evt: None)
    with pytest.raises(TypeError, match=f"due= of {KEY}"):
        issue_invoice()
    assert nothing_written()


def test_a_naive_datetime_is_refused_unless_use_tz_is_false() -> None:
    """'A naive datetime is refused rather than read as UTC or as local time ... - unless the
    project runs with USE_TZ = False, where naive is local time by the project's own convention
    and is accepted.'"""
    naive = datetime.now() + 14 * DAY
    receiver(InvoiceIssued, key=KEY, due=lambda evt: naive)(lambda evt: None)
    if settings.USE_TZ:
        with pytest.raises(TypeError, match="must be an aware datetime"):
            issue_invoice()
        assert nothing_written()
    else:
        event_id = issue_invoice()
        assert event_id is not None
        assert row(event_id).due_at == naive
        assert Order.objects.count() == 1


def test_a_sync_callable_returning_an_awaitable_is_refused_at_fire() -> None:
    """A sync due= callable that returns an awaitable: refused when fire() calls it ('returns
    anything but an aware datetime'), and the change rolls back."""
    made: list[Any] = []

    async def later() -> datetime:  # never awaited: fire() closes it
        raise AssertionError("must not run")

    def sneaky(evt: InvoiceIssued) -> Any:
        made.append(later())
        return made[-1]

    receiver(InvoiceIssued, key=KEY, due=sneaky)(lambda evt: None)
    with pytest.raises(TypeError, match="returned an awaitable"):
        issue_invoice()
    assert nothing_written()
    assert made[0].cr_frame is None  # closed, so no "never awaited" warning
