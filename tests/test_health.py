"""outbox_health() and events_status: is delivery keeping up, read from indexes only."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    RetryAfter,
    claim_batch,
    clock,
    drain_outbox,
    fire_due_ticks,
    outbox_health,
    pause_schedule,
    receiver,
    recurring,
    run_relay,
)
from django_domain_events.introspect import OutboxHealth
from django_domain_events.models import (
    DeliveryRecord,
    EventRecord,
    LanePauseRecord,
    ScheduleRecord,
    TickRecord,
    TickStatus,
)
from django_domain_events.recurrence import aware
from tests.app.events import OrderPlaced, Pinged, ReportDue
from tests.support import command, failing, fire_one

pytestmark = pytest.mark.django_db


def declare_mix() -> None:
    receiver(OrderPlaced, key="t.now")(lambda evt: None)
    receiver(OrderPlaced, key="t.later", due=timedelta(days=14))(lambda evt: None)
    receiver(OrderPlaced, key="t.dead", max_attempts=1, lane="mail")(failing)
    receiver(Pinged, key="t.idle", lane="quiet")(lambda evt: None)


def test_health_counts_owed_scheduled_claimed_and_dead_per_receiver_and_lane() -> None:
    declare_mix()
    first = fire_one(OrderPlaced(order_id=1))
    drain_outbox()  # t.now succeeds, t.dead dies, t.later waits
    fire_one(OrderPlaced(order_id=2))
    now = timezone.now()
    claim_batch(worker_id="w", now=now, lease=60, limit=1, lane="default")
    health = outbox_health()
    assert isinstance(health, OutboxHealth)
    assert (health.owed, health.scheduled, health.claimed, health.dead) == (2, 2, 1, 1)
    assert health.lapsed_leases == 0
    by_key = {r.key: r for r in health.receivers}
    assert set(by_key) == {"t.now", "t.later", "t.dead", "t.idle"}
    assert (by_key["t.now"].owed, by_key["t.now"].claimed) == (1, 1)
    assert (by_key["t.later"].owed, by_key["t.later"].scheduled) == (0, 2)
    assert by_key["t.later"].oldest_owed_at is None  # scheduled work never ages the backlog
    assert (by_key["t.dead"].owed, by_key["t.dead"].dead) == (1, 1)
    assert by_key["t.idle"] == type(by_key["t.idle"])("t.idle", 0, 0, None, 0, 0)
    second_due = DeliveryRecord.objects.get(event_id=first + 1, receiver_key="t.now").due_at
    assert health.oldest_owed_at == second_due
    lanes = {lane.lane: lane for lane in health.lanes}
    assert set(lanes) == {"default", "mail", "quiet"}
    assert (lanes["default"].owed, lanes["default"].scheduled) == (1, 2)
    assert (lanes["mail"].owed, lanes["mail"].dead) == (1, 1)
    assert (lanes["quiet"].owed, lanes["quiet"].dead) == (0, 0)
    assert health.receivers[0].oldest_owed_at is not None  # worst first
    later = outbox_health(now=now + timedelta(days=15, minutes=5))
    assert later.scheduled == 0 and later.owed == 4
    assert later.lapsed_leases == 1
    # Once due, a scheduled row's age runs from its due time, not from its event.
    assert later.oldest_owed_at == second_due


@pytest.mark.django_db(transaction=True)
def test_health_lists_lane_pauses() -> None:
    receiver(Pinged, key="t.api", lane="api", give_up_after=timedelta(hours=1))(
        lambda evt: (_ for _ in ()).throw(RetryAfter(60, counts=False))
    )
    seen: list[tuple[str, ...]] = []

    def look(evt: Pinged) -> None:
        lanes = {lane.lane: lane for lane in outbox_health().lanes}
        seen.extend(p.worker_id for p in lanes["api"].pauses)

    receiver(Pinged, key="t.look", lane="zzz")(look)
    fire_one(Pinged())
    run_relay(worker_id="relay-7", passes=1, lane=["api", "zzz"])
    assert seen == ["relay-7"]
    assert not LanePauseRecord.objects.exists()


def _bulk_settled(count: int) -> None:
    """``count`` succeeded deliveries of one event, written fast."""
    now = timezone.now()
    event = EventRecord.objects.create(
        name="testapp.Pinged", payload={}, occurred_at=now, recorded_at=now
    )
    table = DeliveryRecord._meta.db_table
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (event_id, receiver_key, target, status, attempts, "
                "available_at, due_at, claimed_by, last_error, completed_at, succeeded_at) "
                "SELECT %s, 't.now', g::text, 'succeeded', 1, %s, %s, 'w', '', %s, %s "
                "FROM generate_series(1, %s) AS g",
                [event.pk, now, now, now, now, count],
            )
            cursor.execute(f"ANALYZE {table}")
        return
    DeliveryRecord.objects.bulk_create(
        (
            DeliveryRecord(
                event=event,
                receiver_key="t.now",
                target=str(i),
                status=DeliveryStatus.SUCCEEDED,
                attempts=1,
                available_at=now,
                due_at=now,
                completed_at=now,
                succeeded_at=now,
            )
            for i in range(count)
        ),
        batch_size=2000,
    )


def test_health_costs_the_same_queries_with_a_large_settled_history() -> None:
    declare_mix()
    for n in range(5):
        fire_one(OrderPlaced(order_id=n))
    with CaptureQueriesContext(connection) as small:
        before = outbox_health()
    _bulk_settled(200_000 if connection.vendor == "postgresql" else 20_000)
    with CaptureQueriesContext(connection) as large:
        after = outbox_health()
    assert len(small) == len(large) == 4
    assert (before.owed, before.scheduled, before.dead) == (after.owed, after.scheduled, after.dead)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_health_plans_read_indexes_only_on_postgresql() -> None:
    declare_mix()
    fire_one(OrderPlaced(order_id=1))
    _bulk_settled(200_000)
    with CaptureQueriesContext(connection) as queries:
        outbox_health()
    table = DeliveryRecord._meta.db_table
    for query in queries:
        if table not in query["sql"]:
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {query['sql']}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert f"Seq Scan on {table}" not in plan, plan
        assert "Index" in plan, plan


def test_events_status_prints_totals_lanes_and_receivers() -> None:
    declare_mix()
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    out = StringIO()
    call_command("events_status", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("owed=0 scheduled=1 claimed=0 dead=1")
    assert "lane mail: owed=0 scheduled=0 claimed=0 dead=1 oldest=-" in lines
    assert any(
        line.startswith("receiver t.later: owed=0 scheduled=1 claimed=0 dead=0") for line in lines
    )
    out = StringIO()
    call_command("events_status", "--format", "json", stdout=out)
    data = json.loads(out.getvalue())
    assert (data["owed"], data["scheduled"], data["dead"]) == (0, 1, 1)
    assert {r["key"] for r in data["receivers"]} == {"t.now", "t.later", "t.dead", "t.idle"}
    assert {lane["lane"] for lane in data["lanes"]} == {"default", "mail", "quiet"}


# Schedules -------------------------------------------------------------------------


def declare_schedules() -> datetime:
    """Three schedules ticking every minute: one fired on time, one whose function raised
    on its last tick, one paused; returns the time they were last fired at."""
    base = aware(clock.now()).replace(second=0, microsecond=0)
    raises_at = base - timedelta(minutes=1)

    @recurring(every=timedelta(minutes=1), key="h.report")
    def report(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    @recurring(every=timedelta(minutes=1), key="h.flaky")
    def flaky(tick: datetime) -> ReportDue:
        if aware(tick) == raises_at:  # naive local time under USE_TZ = False
            raise RuntimeError("the report server is down")
        return ReportDue(tick=tick.isoformat())

    @recurring(cron="0 6 * * *", timezone="America/New_York", key="h.paused")
    def paused(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=base - timedelta(minutes=2, seconds=30))
    fire_due_ticks(now=base - timedelta(seconds=50))
    pause_schedule("h.paused")
    return base - timedelta(seconds=50)


def test_health_lists_the_schedules_with_what_needs_an_operator() -> None:
    last = declare_schedules()
    by_key = {s.key: s for s in outbox_health().schedules}
    assert set(by_key) == {"h.report", "h.flaky", "h.paused"}
    assert not any(s.late for s in by_key.values())  # fired 50 s ago: on time
    assert by_key["h.flaky"].failing and not by_key["h.report"].failing
    assert by_key["h.paused"].paused
    later = {s.key: s for s in outbox_health(now=last + timedelta(minutes=5)).schedules}
    assert later["h.report"].late and later["h.flaky"].late  # no relay fired them since
    assert not later["h.paused"].late  # a paused schedule is never late


def test_events_status_prints_a_line_per_schedule_late_and_failing_ones_marked() -> None:
    declare_schedules()
    TickRecord.objects.filter(status=TickStatus.FIRED, schedule_key="h.report").delete()
    # The cursor of h.report as a relay that stopped ten minutes ago left it.
    ScheduleRecord.objects.filter(key="h.report").update(
        next_tick_at=clock.now() - timedelta(minutes=10)
    )
    lines = [line for line in command("events_status").splitlines() if line.startswith("schedule")]
    assert len(lines) == 3
    (report,) = [line for line in lines if line.startswith("schedule h.report:")]
    assert "last_fired=-" in report
    assert "LATE by 10m: no relay is firing it" in report
    (flaky,) = [line for line in lines if line.startswith("schedule h.flaky:")]
    assert "FAILING since the tick of " in flaky
    assert "RuntimeError: the report server is down" in flaky
    (paused,) = [line for line in lines if line.startswith("schedule h.paused:")]
    assert paused.endswith("next=- last_fired=- paused")
    data = json.loads(command("events_status", "--format", "json"))
    schedules = {s["key"]: s for s in data["schedules"]}
    assert schedules["h.report"]["late"] is True
    assert schedules["h.flaky"]["failing"] is True
    assert "the report server is down" in schedules["h.flaky"]["failure"]
    assert schedules["h.paused"]["paused"] is True


def test_health_costs_two_more_queries_with_schedules_whatever_their_tick_rows() -> None:
    declare_mix()
    fire_one(OrderPlaced(order_id=1))
    declare_schedules()
    with CaptureQueriesContext(connection) as few:
        outbox_health()
    TickRecord.objects.bulk_create(
        TickRecord(
            schedule_key=key,
            tick=clock.normalize(clock.now() - timedelta(hours=1, seconds=m)),
            status=TickStatus.SKIPPED,
            recorded_at=clock.now(),
        )
        for key in ("h.report", "h.flaky", "h.paused")
        for m in range(1000)
    )
    with CaptureQueriesContext(connection) as many:
        outbox_health()
    assert len(few) == len(many) == 4 + 2
