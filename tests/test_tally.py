"""The scheduled tally: outbox_health() counts work due in later hours without reading it.

Every change to a row due in a later hour is checked against a count of the rows
themselves, at several moments, on every database.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import (
    DeliveryContext,
    DeliveryStatus,
    NotYet,
    cancel_deliveries,
    drain_outbox,
    fire,
    outbox_health,
    receiver,
    replay_events,
    run_relay,
)
from django_domain_events.declare import registry
from django_domain_events.delivery.run import expire_overdue
from django_domain_events.models import DeliveryRecord, ScheduledTally
from django_domain_events.tally import compact, hour_of, recount
from tests.app.events import OrderPlaced
from tests.conftest import needs_several_relays, start_child
from tests.procs.receivers import SCHEDULED_KEY, declare_scheduled
from tests.support import fire_one

pytestmark = pytest.mark.django_db

# order_id -> what the 48-hour receiver does when it finally runs
BEHAVIOUR: dict[int, str] = {}


def offer(evt: OrderPlaced, ctx: DeliveryContext) -> None:
    action = BEHAVIOUR.get(evt.order_id, "ok")
    if action == "later":
        raise NotYet(timezone.now() + timedelta(days=10), "the customer asked to wait")
    if action == "fail":
        raise RuntimeError("the offer service refused it")


def declare() -> None:
    receiver(
        OrderPlaced, key="t.offer", due=timedelta(hours=48), takes_context=True, max_attempts=1
    )(offer)
    receiver(OrderPlaced, key="t.week", due=timedelta(days=7))(lambda evt: None)
    receiver(OrderPlaced, key="t.brief", due=timedelta(days=1), ttl=timedelta(hours=1))(
        lambda evt: None
    )
    receiver(OrderPlaced, key="t.now")(lambda evt: None)


def rows_scheduled(moment: datetime) -> dict[str, int]:
    """The definition, counted row by row: pending rows whose due time is after ``moment``."""
    rows = (
        DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING, due_at__gt=moment)
        .values("receiver_key")
        .annotate(n=Count("pk"))
    )
    return {row["receiver_key"]: row["n"] for row in rows}


def assert_health_matches_rows(*offsets: timedelta) -> None:
    for offset in (timedelta(0), *offsets):
        moment = timezone.now() + offset
        health = outbox_health(now=moment)
        want = rows_scheduled(moment)
        assert {r.key: r.scheduled for r in health.receivers if r.scheduled} == want, offset
        assert health.scheduled == sum(want.values())


OFFSETS = (timedelta(hours=1), timedelta(hours=47), timedelta(days=3), timedelta(days=9))


def test_every_change_to_a_row_due_later_keeps_health_exact() -> None:
    declare()
    BEHAVIOUR.clear()
    BEHAVIOUR.update({2: "later", 3: "fail"})
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(6)]
    assert ScheduledTally.objects.exists()  # the rows due later are tallied, not counted
    assert_health_matches_rows(*OFFSETS)

    assert cancel_deliveries([ids[0]]) == {"cancelled": 4, "in_flight": 0}
    assert_health_matches_rows(*OFFSETS)
    assert replay_events([ids[0]]) == {"reopened": 4, "added": 0}
    assert_health_matches_rows(*OFFSETS)

    # The brief rows outlive their hour-long lifetime unclaimed: swept dead, unrun.
    assert expire_overdue(now=timezone.now() + timedelta(days=1, hours=2)) == 6
    assert_health_matches_rows(*OFFSETS)

    # A test clock eight days ahead: offers succeed, fail (dead) or move ten days on;
    # the weekly rows run; a forgotten receiver's rows are orphaned.
    registry.forget("t.week")
    drain_outbox(now=timezone.now() + timedelta(days=8))
    statuses = Counter(DeliveryRecord.objects.values_list("receiver_key", "status"))
    assert statuses["t.offer", "succeeded"] == 4
    assert statuses["t.offer", "dead"] == 1
    assert statuses["t.offer", "pending"] == 1  # NotYet: due in ten days
    assert statuses["t.week", "orphaned"] == 6
    assert_health_matches_rows(*OFFSETS)
    assert outbox_health().scheduled == 1


def test_compact_and_recount_keep_the_counts_and_fold_the_rows() -> None:
    declare()
    for n in range(5):
        fire_one(OrderPlaced(order_id=n))
    cancel_deliveries([DeliveryRecord.objects.order_by("event_id").first().event_id])
    before = outbox_health()
    hours = set(ScheduledTally.objects.values_list("receiver_key", "due_hour"))
    assert ScheduledTally.objects.count() > len(hours)
    assert compact() > 0
    assert ScheduledTally.objects.count() == len(hours)  # one row per receiver and hour
    assert compact() == 0  # nothing left to fold
    assert outbox_health() == before
    ScheduledTally.objects.all().delete()  # as if the rows had been written by hand
    assert outbox_health().scheduled == 0
    assert recount() == before.scheduled
    assert outbox_health() == before


def test_rows_due_within_the_hour_are_read_from_the_rows() -> None:
    receiver(OrderPlaced, key="t.soon", due=timedelta(minutes=1))(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    due = DeliveryRecord.objects.get().due_at
    if hour_of(due) > hour_of(timezone.now()):
        assert ScheduledTally.objects.count() == 1  # the hour turned over just now
    else:
        assert not ScheduledTally.objects.exists()
    assert outbox_health().scheduled == 1
    assert outbox_health(now=due).scheduled == 0


def test_health_queries_do_not_grow_with_scheduled_rows() -> None:
    declare()
    fire_one(OrderPlaced(order_id=1))
    with CaptureQueriesContext(connection) as few:
        small = outbox_health()
    count = 20_000 if connection.vendor == "postgresql" else 2_000
    due = timezone.now() + timedelta(days=30)
    event_id = DeliveryRecord.objects.first().event_id
    DeliveryRecord.objects.bulk_create(
        (
            DeliveryRecord(
                event_id=event_id,
                receiver_key="t.week",
                target=f"bulk-{i}",
                available_at=due,
                due_at=due,
            )
            for i in range(count)
        ),
        batch_size=2000,
    )
    recount()  # rows written behind the package's back: counted once, as a migration does
    with CaptureQueriesContext(connection) as many:
        large = outbox_health()
    assert len(few) == len(many) == 4
    assert large.scheduled == small.scheduled + count


@pytest.mark.django_db(transaction=True)
def test_the_relay_folds_the_tally() -> None:
    declare()
    for n in range(4):
        fire_one(OrderPlaced(order_id=n))
    hours = set(ScheduledTally.objects.values_list("receiver_key", "due_hour"))
    before = outbox_health().scheduled
    run_relay(once=True, prune=None)
    assert ScheduledTally.objects.count() == len(hours)
    assert outbox_health().scheduled == before


@needs_several_relays
@pytest.mark.django_db(transaction=True)
def test_compacting_beside_two_firing_processes_loses_no_count() -> None:
    declare_scheduled()
    children = [start_child("fire_scheduled", "300") for _ in range(2)]
    folded = 0
    while any(child.poll() is None for child in children):
        folded += compact()
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    folded += compact()
    assert folded > 0
    assert outbox_health().scheduled == 600
    assert rows_scheduled(timezone.now()) == {SCHEDULED_KEY: 600}
    hours = DeliveryRecord.objects.values_list("due_at", flat=True)
    assert ScheduledTally.objects.count() == len({hour_of(due) for due in hours})


def test_a_failed_fire_leaves_no_tally() -> None:
    declare()
    with pytest.raises(RuntimeError), transaction.atomic():
        fire(OrderPlaced(order_id=1))
        raise RuntimeError("the change failed")
    assert not ScheduledTally.objects.exists()
    assert outbox_health().scheduled == 0


def test_events_status_recount_rebuilds_the_tally_after_hand_edits() -> None:
    declare()
    fire_one(OrderPlaced(order_id=1))
    DeliveryRecord.objects.filter(receiver_key="t.week").delete()  # behind the package's back
    assert outbox_health().scheduled == 3  # the tally still counts the deleted row
    out, err = StringIO(), StringIO()
    call_command("events_status", "--recount", "--format", "json", stdout=out, stderr=err)
    assert err.getvalue().strip() == "recounted the scheduled tally: 2 rows due in later hours"
    assert json.loads(out.getvalue())["scheduled"] == 2
    assert outbox_health().scheduled == 2 == sum(rows_scheduled(timezone.now()).values())
