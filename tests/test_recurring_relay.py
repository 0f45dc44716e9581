"""Recurring schedules inside the relay (issue 15): what a look for due ticks costs, and
a due tick fired and delivered by the same run."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import DeliveryStatus, clock, fire_due_ticks, recurring, run_relay
from django_domain_events.models import ScheduleRecord, TickRecord, TickStatus
from django_domain_events.recurrence import aware
from tests.app.events import ReportDue
from tests.app.models import Delivered
from tests.conftest import needs_postgresql, wait_for
from tests.procs.recurring import (
    MINUTELY_KEY,
    REPORT_KEY,
    declare_minutely,
    declare_report_receiver,
)
from tests.support import command

pytestmark = pytest.mark.django_db(transaction=True)

T = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
FAST = {"POLL_SECONDS": 0.05, "WARN_OUTSIDE_ATOMIC": True}


def schedule_queries(queries: CaptureQueriesContext) -> list[str]:
    """The statements on the schedules' tables, among those captured."""
    tables = (ScheduleRecord._meta.db_table, TickRecord._meta.db_table)
    return [q["sql"] for q in queries if any(table in q["sql"] for table in tables)]


def declare_daily(count: int) -> list[str]:
    keys = [f"tests.daily_{n:03}" for n in range(count)]
    for key in keys:

        @recurring(every=timedelta(days=1), key=key)
        def build(tick: datetime) -> ReportDue:
            return ReportDue(tick=tick.isoformat())

    return keys


# 3. One indexed query a look --------------------------------------------------------


@needs_postgresql
def test_the_look_for_due_ticks_is_one_index_scan_among_many_schedules_and_ticks() -> None:
    """300 schedules declared, 20,000 cursors of schedules no longer declared (their next
    tick long past, so first in next_tick_at order), 200,000 tick rows: each of three
    passes a second apart looks with one query, which reads the cursors through an index
    and never the ticks."""
    keys = declare_daily(300)
    fire_due_ticks()  # their cursors, from now: none is due for a day
    schedules = connection.ops.quote_name(ScheduleRecord._meta.db_table)
    ticks = connection.ops.quote_name(TickRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {schedules} (key, spec, next_tick_at, last_tick_at, created_at) "
            "SELECT 'gone.' || n, 'every 0:01:00', now() - n * interval '1 minute', "
            "now() - (n + 1) * interval '1 minute', now() - interval '1 year' "
            "FROM generate_series(1, 20000) AS n"
        )
        cursor.execute(
            f"INSERT INTO {ticks} (schedule_key, tick, status, reason, recorded_at) "
            "SELECT %s || lpad((n %% 300)::text, 3, '0'), now() - n * interval '1 minute', "
            "'fired', '', now() FROM generate_series(1, 200000) AS n",
            ["tests.daily_"],
        )
        cursor.execute(f"ANALYZE {schedules}")
        cursor.execute(f"ANALYZE {ticks}")
    with CaptureQueriesContext(connection) as queries:
        run_relay(passes=3, prune=None)
    # The first pass also reads the declared cursors once (sync_schedules); then one each.
    sync, *looks = schedule_queries(queries)
    assert "ORDER BY" not in sync and len(looks) == 3 and len(set(looks)) == 1
    look = looks[0]
    assert "ORDER BY" in look and "LIMIT 20" in look
    assert all(key in look for key in keys)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + look)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan" not in plan, plan
    assert any(scan in plan for scan in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"))
    assert ScheduleRecord._meta.db_table in plan and TickRecord._meta.db_table not in plan, plan


def test_a_relay_looks_once_a_second_at_most_and_never_without_schedules() -> None:
    """Passes 50 ms apart: the first looks (after reading the declared cursors once), the
    others within the second do not; without schedules no pass reads their tables."""
    with override_settings(DJANGO_DOMAIN_EVENTS=FAST):
        with CaptureQueriesContext(connection) as queries:
            run_relay(passes=3, prune=None)
        assert schedule_queries(queries) == []
        declare_daily(3)
        fire_due_ticks()
        with CaptureQueriesContext(connection) as queries:
            started = time.monotonic()
            run_relay(passes=5, prune=None)
            took = time.monotonic() - started
    sync, *looks = schedule_queries(queries)
    assert "ORDER BY" not in sync  # sync_schedules(), on the first look
    assert 1 <= len(looks) <= 1 + int(took), (took, looks)  # 5 passes, ~0.25 s
    assert all("ORDER BY" in look for look in looks)


# 4. The relay fires and delivers ------------------------------------------------


def test_a_relay_run_fires_the_due_ticks_and_delivers_their_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declare_minutely()
    declare_report_receiver()
    fire_due_ticks(now=T - timedelta(minutes=3))  # 11:57:30: 11:58, 11:59 and 12:00 are due
    monkeypatch.setattr(clock, "now", lambda: clock.normalize(T))
    counts = run_relay(once=True, prune=None)
    assert counts[DeliveryStatus.SUCCEEDED] == 3
    ticks = [datetime(2026, 6, 1, 11, 58, tzinfo=UTC) + timedelta(minutes=m) for m in range(3)]
    rows = TickRecord.objects.filter(schedule_key=MINUTELY_KEY, status=TickStatus.FIRED)
    assert sorted(aware(t) for t in rows.values_list("tick", flat=True)) == ticks
    assert Delivered.objects.filter(receiver_key=REPORT_KEY).count() == 3


def test_deliver_events_once_fires_the_due_ticks_and_delivers_their_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declare_minutely()
    declare_report_receiver()
    fire_due_ticks(now=T - timedelta(minutes=2))  # 11:58:30: 11:59 and 12:00 are due
    monkeypatch.setattr(clock, "now", lambda: clock.normalize(T))
    out = command("deliver_events", "--once")
    assert "Delivered: 2 succeeded." in out, out
    assert TickRecord.objects.filter(status=TickStatus.FIRED).count() == 2
    assert Delivered.objects.filter(receiver_key=REPORT_KEY).count() == 2


def test_an_idle_relay_polling_every_30s_fires_an_every_second_schedule_on_time() -> None:
    """The idle wait is shortened to the next look: ticks fire about once a second."""

    @recurring(every=timedelta(seconds=1), key="tests.every_second")
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    declare_report_receiver()
    stop = threading.Event()
    settings = {"POLL_SECONDS": 30, "WARN_OUTSIDE_ATOMIC": True}
    with override_settings(DJANGO_DOMAIN_EVENTS=settings):
        relay = threading.Thread(target=run_relay, kwargs={"stop": stop, "prune": None})
        started = time.monotonic()
        relay.start()
        try:
            fired = TickRecord.objects.filter(status=TickStatus.FIRED)
            wait_for(fired.exists, 30, "the first tick")
            wait_for(lambda: fired.count() >= 3, 30, "three ticks")
            three = time.monotonic() - started
            wait_for(lambda: Delivered.objects.count() >= 3, 10, "their deliveries")
        finally:
            stop.set()
            relay.join(35)
    assert not relay.is_alive()
    # A relay that slept its 30 s poll could not have fired three one-second ticks yet;
    # how much sooner than that is for bench/, not for a loaded test host.
    assert three < 30, three


def test_an_every_tick_follows_use_tz_so_the_function_can_store_it() -> None:
    """Under ``USE_TZ = False`` the tick is naive local time, as every datetime the
    package hands out; an aware one cannot be stored there (SQLite refuses it)."""
    got: list[datetime] = []

    @recurring(every=timedelta(minutes=1), key="tests.stores_tick")
    def build(tick: datetime) -> ReportDue:
        connection.ops.adapt_datetimefield_value(tick)  # what storing it does first
        got.append(tick)
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=T - timedelta(minutes=2))
    fire_due_ticks(now=T)
    assert [aware(t) for t in got] == [datetime(2026, 6, 1, 12, 0, tzinfo=UTC)]
    assert all(clock.normalize(t) == t for t in got)
    assert all(timezone.is_aware(t) == settings.USE_TZ for t in got)
