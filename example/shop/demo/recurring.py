"""A recurring schedule: the nightly sales report, fired by ``@recurring`` ticks.

In production every relay looks for due ticks (one query, at most once a second) and
the first to look fires each tick once. Here ``fire_due_ticks(now=T)`` does what the
relays do, as if it were ``T``: a few nights of June 2026 pass in a second, on dates
fixed so that every run prints the same. ``deliver_pending()`` then delivers the events
the ticks fired, like any others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django_domain_events import DeliveryStatus, deliver_pending, fire_due_ticks
from django_domain_events.models import EventRecord, ScheduleRecord, TickRecord
from shop.events import SHOP_ZONE
from shop.models import DailySalesReport
from shop.services import cancel_order, pay_order, place_order

from .story import Story

KEY = "shop.nightly_sales_report"


def paris(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """A moment of June 2026 on the shop's clock."""
    return datetime(2026, 6, day, hour, minute, second, tzinfo=SHOP_ZONE)


def when(moment: datetime) -> str:
    """``Tue 2 Jun 03:00``, in Paris (seconds left out)."""
    local = moment.astimezone(SHOP_ZONE)
    return f"{local:%a} {local.day} {local:%b %H:%M}"


def a_nightly_sales_report(story: Story) -> None:
    """A recurring schedule: the nightly sales report"""
    story.say('shop.nightly_sales_report is declared @recurring(cron="0 3 * * *",')
    story.say('timezone="Europe/Paris", catch_up="all"): each night at 03:00 Paris time it fires')
    story.say(
        "SalesReportDue(day=the day before), and the durable receiver shop.write_sales_report"
    )
    story.say("writes that day's DailySalesReport. No beat, no crontab: the relays fire each tick")
    story.say("once. Here fire_due_ticks(now=...) plays the relays through a week of June 2026,")
    story.say("and deliver_pending() delivers the events the ticks fired.")
    story.say()
    ada, grace, alan = (story.customers[name] for name in ("Ada", "Grace", "Alan"))
    with _quiet_shop():
        pay_order(place_order(ada, "12.00", placed_at=paris(1, 10)))
        place_order(grace, "30.50", placed_at=paris(1, 15, 30))
        cancel_order(place_order(alan, "8.25", placed_at=paris(1, 23, 40)), "ordered twice")
    story.say("Mon 1 Jun: Ada 12.00 (paid), Grace 30.50, Alan 8.25 at 23:40 (cancelled).")

    first = _fire(story, paris(1, 23, 0))
    story.say("  The schedule starts where a relay first sees it: earlier ticks never fire.")
    story.expect(first == 0, f"a new schedule fired {first} ticks before it was first seen")

    night_1 = _fire(story, paris(2, 3, 0, 5))
    _deliver(story)
    with _quiet_shop():
        place_order(grace, "19.90", placed_at=paris(2, 11))
    story.say("Tue 2 Jun: Grace 19.90.")
    night_2 = _fire(story, paris(3, 3, 0, 5))
    _deliver(story)
    again = _fire(story, paris(3, 3, 10))
    story.say("  Each tick fires once, however many relays look.")
    story.expect(
        (night_1, night_2, again) == (1, 1, 0),
        f"two nights should fire one tick each, and a second look none: {night_1, night_2, again}",
    )

    story.say()
    story.say("Every relay stops on Wednesday evening and is back on Friday at 09:00. With")
    story.say('catch_up="all" each missed night fires, oldest first:')
    missed = _fire(story, paris(5, 9, 0))
    _deliver(story)
    story.expect(missed == 2, f"catch_up='all' should fire the two missed nights, not {missed}")

    story.say()
    story.say("The reports (DailySalesReport):")
    reports = list(DailySalesReport.objects.order_by("day"))
    for report in reports:
        story.say(
            f"  {report.day:%a} {report.day.day} {report.day:%b}: {report.orders} "
            f"order{'s' if report.orders != 1 else ''} "
            f"({report.paid} paid, {report.cancelled} cancelled), sales {report.sales}"
        )
    summary = [(str(r.day), r.orders, r.cancelled, str(r.sales)) for r in reports]
    story.expect(
        summary
        == [
            ("2026-06-01", 3, 1, "42.50"),
            ("2026-06-02", 1, 0, "19.90"),
            ("2026-06-03", 0, 0, "0.00"),
            ("2026-06-04", 0, 0, "0.00"),
        ],
        f"the reports are not what the orders say: {summary}",
    )

    story.say()
    row = ScheduleRecord.objects.get(key=KEY)
    story.say(f"Its rows: ScheduleRecord {row.key} ({row.spec}),")
    last, upcoming = row.last_tick_at, row.next_tick_at
    story.expect(last is not None and upcoming is not None, f"the cursor is empty: {row.__dict__}")
    assert last is not None and upcoming is not None
    story.say(f"  last tick {when(last)}, next {when(upcoming)}; and one TickRecord per tick:")
    for tick in TickRecord.objects.filter(schedule_key=KEY).order_by("tick"):
        story.say(f"  {when(tick.tick)}  {tick.status}  event #{tick.event_id}")
    story.expect(
        TickRecord.objects.filter(schedule_key=KEY, status="fired").count() == 4,
        "four ticks should be recorded fired",
    )


def _fire(story: Story, now: datetime) -> int:
    """fire_due_ticks(now=...), and what it fired."""
    fired_before = set(TickRecord.objects.filter(schedule_key=KEY).values_list("id", flat=True))
    count = fire_due_ticks(now=now)
    story.say(f"{when(now)}: fire_due_ticks() fired {count}")
    new = TickRecord.objects.filter(schedule_key=KEY).exclude(id__in=fired_before)
    for tick in new.order_by("tick"):
        if tick.event_id is None:
            story.say(f"  the tick of {when(tick.tick)}: {tick.status}, {tick.reason}")
            continue
        event = EventRecord.objects.get(pk=tick.event_id)
        story.say(f"  the tick of {when(tick.tick)} → SalesReportDue(day={event.payload['day']})")
    return count


def _deliver(story: Story) -> None:
    with _quiet_shop():
        counts = deliver_pending()
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] >= 1
        and sum(counts.values()) == counts[DeliveryStatus.SUCCEEDED],
        f"every delivery should succeed: {counts}",
    )


@contextmanager
def _quiet_shop() -> Iterator[None]:
    """The shop's own log lines (orders committed, the CRM told) were shown in earlier
    chapters; here they would only hide the report."""
    logger = logging.getLogger("shop")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
