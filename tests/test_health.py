"""outbox_health() and events_status: is delivery keeping up, read from indexes only."""

from __future__ import annotations

import json
from datetime import timedelta
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
    drain_outbox,
    outbox_health,
    receiver,
    run_relay,
)
from django_domain_events.introspect import OutboxHealth
from django_domain_events.models import DeliveryRecord, EventRecord, LanePauseRecord
from tests.app.events import OrderPlaced, Pinged
from tests.support import failing, fire_one

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
