"""The relay in-process: deliver_events flags, lanes, leases, pauses and the idle prune."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    RetryAfter,
    deliver_pending,
    fire,
    receiver,
    registry,
    run_relay,
)
from django_domain_events.delivery.lease import lane_lease
from django_domain_events.models import DeliveryRecord, EventRecord, LanePauseRecord
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered
from tests.procs.receivers import DEFAULT_PING_KEY, MAIL_KEY, declare_all

pytestmark = pytest.mark.django_db(transaction=True)


def fire_many(evt_factory: Any, count: int) -> None:
    with transaction.atomic():
        for n in range(count):
            fire(evt_factory(n))


def deliver_events(*args: str) -> str:
    out = StringIO()
    call_command("deliver_events", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lane", "nowhere"], "No receiver declares lane 'nowhere'"),
        (["--limit", "5"], "--limit only goes with --once"),
        (["--once", "--limit", "0"], "--limit must be at least 1"),
        (["--passes", "0"], "--passes must be at least 1"),
        (["--once", "--passes", "2"], "give one of them"),
        (["--once", "--batch-size", "0"], "batch size must be a whole number from 1 to 10000"),
        (["--once", "--batch-size", "99999999999999999999"], "batch size must be a whole"),
        (["--once", "--lane-batch-size", "mail"], "takes LANE=N"),
        (["--once", "--lane-batch-size", "default=0"], "batch size of lane 'default' must be"),
        (
            ["--once", "--lane-batch-size", "default=3", "--lane-batch-size", "default=4"],
            "gives lane 'default' twice",
        ),
        (["--once", "--lane-batch-size", "mail=3"], "does not serve it; serve lane 'mail' too"),
    ],
)
def test_refused_flag_combinations_say_what_to_do(args: list[str], message: str) -> None:
    declare_all()
    fire_many(lambda n: OrderPlaced(order_id=n), 1)
    with pytest.raises(CommandError, match=message):
        deliver_events(*args)
    assert DeliveryRecord.objects.get().status == DeliveryStatus.PENDING


def test_once_delivers_everything_owed_and_reports_it() -> None:
    declare_all()
    fire_many(lambda n: OrderPlaced(order_id=n), 3)
    assert deliver_events("--once") == "Delivered: 3 succeeded.\n"
    assert Delivered.objects.count() == 3


def test_limit_is_shared_between_lanes() -> None:
    declare_all()
    fire_many(lambda n: Pinged(n=n), 5)  # one row in each lane per event
    deliver_events("--once", "--limit", "4", "--lane", "default", "--lane", "mail")
    assert Delivered.objects.count() == 4


def test_a_lane_relay_runs_only_its_lanes_receivers() -> None:
    declare_all()
    fire_many(lambda n: Pinged(n=n), 3)
    deliver_events("--once", "--lane", "mail")
    assert set(Delivered.objects.values_list("receiver_key", flat=True)) == {MAIL_KEY}
    deliver_events("--once")
    assert Delivered.objects.filter(receiver_key=DEFAULT_PING_KEY).count() == 3
    assert Delivered.objects.filter(receiver_key=MAIL_KEY).count() == 3


def test_moving_a_receiver_to_another_lane_moves_its_owed_rows() -> None:
    receiver(Pinged, key="t.mover", lane="slow")(lambda evt: None)
    receiver(OrderPlaced, key="t.stay", lane="slow")(lambda evt: None)
    fire_many(lambda n: Pinged(n=n), 2)
    assert deliver_pending(lane="default")[DeliveryStatus.SUCCEEDED] == 0
    registry.forget("t.mover")  # redeployed onto the default lane: a new process
    receiver(Pinged, key="t.mover")(lambda evt: None)
    assert deliver_pending(lane="default")[DeliveryStatus.SUCCEEDED] == 2


@override_settings(DJANGO_DOMAIN_EVENTS={"ORPHAN_AFTER_SECONDS": 0})
def test_the_default_lane_drains_rows_of_receivers_no_longer_declared() -> None:
    receiver(Pinged, key="t.gone", lane="mail")(lambda evt: None)
    receiver(Pinged, key="t.mail", lane="mail")(lambda evt: None)
    fire_many(lambda n: Pinged(n=n), 2)
    registry.forget("t.gone")
    counts = run_relay(passes=1, lane="default")
    assert counts[DeliveryStatus.ORPHANED] == 2


def test_a_lane_flood_delays_another_lane_by_at_most_one_batch() -> None:
    receiver(OrderPlaced, key="t.flood", lane="bulk")(lambda evt: None)
    receiver(Pinged, key="t.urgent", lane="urgent")(lambda evt: None)
    now = timezone.now()
    event = EventRecord.objects.create(
        name="testapp.OrderPlaced", payload={"order_id": 1}, occurred_at=now, recorded_at=now
    )
    DeliveryRecord.objects.bulk_create(
        DeliveryRecord(
            event=event, receiver_key="t.flood", target=str(i), available_at=now, due_at=now
        )
        for i in range(10_000)
    )
    with transaction.atomic():
        urgent_event = fire(Pinged(n=1))
    run_relay(passes=1, lane=["bulk", "urgent"], batch_size=50)
    urgent = DeliveryRecord.objects.get(event_id=urgent_event)
    assert urgent.status == DeliveryStatus.SUCCEEDED
    before = DeliveryRecord.objects.filter(
        receiver_key="t.flood", succeeded_at__lte=urgent.succeeded_at
    ).count()
    assert before <= 50


def test_the_lane_lease_is_the_receivers_common_lease_with_headroom() -> None:
    receiver(OrderPlaced, key="t.a", lane="reports", lease_seconds=100)(lambda evt: None)
    receiver(Pinged, key="t.b", lane="reports", lease_seconds=100)(lambda evt: None)
    receiver(Pinged, key="t.c", lane="mixed", lease_seconds=100)(lambda evt: None)
    receiver(OrderPlaced, key="t.d", lane="mixed", lease_seconds=20)(lambda evt: None)
    receiver(OrderPlaced, key="t.e", lane="huge", lease_seconds=10_000)(lambda evt: None)
    assert lane_lease("reports") == timedelta(seconds=110)
    assert lane_lease("mixed") == timedelta(seconds=330)  # no common lease: LEASE_SECONDS
    assert lane_lease("huge") == timedelta(seconds=330)  # never more than LEASE_SECONDS x 1.1


def test_a_receiver_needing_a_longer_lease_has_its_row_extended_before_running() -> None:
    seen: list[Any] = []

    def long_job(evt: Pinged, ctx: Any) -> None:
        row = DeliveryRecord.objects.get(pk=ctx.delivery_id)
        seen.append(row.lease_expires_at - row.claimed_at)

    receiver(Pinged, key="t.long", takes_context=True, lease_seconds=1000)(long_job)
    receiver(OrderPlaced, key="t.short", lease_seconds=10)(lambda evt: None)
    fire_many(lambda n: Pinged(n=n), 1)
    deliver_pending()
    assert len(seen) == 1 and seen[0] >= timedelta(seconds=1100)  # renewed from the run's start


def test_a_relay_pause_is_recorded_for_operators_and_cleared() -> None:
    seen: list[tuple[str, str, timedelta]] = []

    def busy(evt: Pinged) -> None:
        raise RetryAfter(0.3, counts=False)

    def look(evt: Pinged) -> None:  # runs after the api lane in the same pass
        seen.extend(
            (p.lane, p.worker_id, p.until - p.paused_at) for p in LanePauseRecord.objects.all()
        )

    receiver(Pinged, key="t.busy", lane="api", give_up_after=timedelta(hours=1))(busy)
    receiver(Pinged, key="t.look", lane="zzz")(look)
    fire_many(lambda n: Pinged(n=n), 2)
    run_relay(worker_id="relay-x", passes=1, lane=["api", "zzz"], batch_size=1)
    assert seen and seen[0][:2] == ("api", "relay-x")
    assert timedelta(0) < seen[0][2] <= timedelta(seconds=1)
    rows = DeliveryRecord.objects.filter(receiver_key="t.busy").order_by("id")
    assert [r.attempts for r in rows] == [0, 0]
    assert rows[1].status == DeliveryStatus.PENDING  # never claimed while the lane paused
    assert not LanePauseRecord.objects.exists()  # the relay clears its pauses when it stops


def test_the_idle_prune_runs_at_most_every_relay_prune_seconds() -> None:
    calls: list[int] = []
    with override_settings(
        DJANGO_DOMAIN_EVENTS={"RELAY_PRUNE_SECONDS": 3600, "POLL_SECONDS": 0.01}
    ):
        run_relay(passes=3, prune=lambda: calls.append(1))
    assert calls == [1]
    with override_settings(DJANGO_DOMAIN_EVENTS={"RELAY_PRUNE": False, "POLL_SECONDS": 0.01}):
        run_relay(passes=3, prune=lambda: calls.append(1))
    assert calls == [1]


def test_the_command_wires_the_idle_prune_to_prune_events() -> None:
    old = timezone.now() - timedelta(days=400)
    EventRecord.objects.create(name="testapp.Pinged", payload={}, occurred_at=old, recorded_at=old)
    with override_settings(DJANGO_DOMAIN_EVENTS={"POLL_SECONDS": 0.01}):
        deliver_events("--passes", "2")
    assert not EventRecord.objects.exists()


def test_a_relay_off_the_main_thread_runs_its_passes(caplog: pytest.LogCaptureFixture) -> None:
    declare_all()
    fire_many(lambda n: OrderPlaced(order_id=n), 2)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run_relay(passes=1)))
    thread.start()
    thread.join(30)
    assert results[0][DeliveryStatus.SUCCEEDED] == 2


def test_a_stop_callable_ends_the_relay() -> None:
    declare_all()
    stop = threading.Event()
    stop.set()
    fire_many(lambda n: OrderPlaced(order_id=n), 2)
    counts = run_relay(stop=stop)
    assert counts[DeliveryStatus.SUCCEEDED] == 0


def test_stale_pause_records_are_cleaned_up_and_never_reported() -> None:
    from django_domain_events import outbox_health

    long_ago = timezone.now() - timedelta(hours=1)
    LanePauseRecord.objects.create(
        lane="api", worker_id="dead-relay", paused_at=long_ago, until=long_ago
    )
    receiver(Pinged, key="t.busy", lane="api", give_up_after=timedelta(hours=1))(
        lambda evt: (_ for _ in ()).throw(RetryAfter(30, counts=False))
    )
    lanes = {lane.lane: lane for lane in outbox_health().lanes}
    assert lanes["api"].pauses == ()
    seen: list[str] = []
    receiver(Pinged, key="t.look", lane="zzz")(
        lambda evt: seen.extend(LanePauseRecord.objects.values_list("worker_id", flat=True))
    )
    fire_many(lambda n: Pinged(n=n), 1)
    run_relay(worker_id="relay-live", passes=1, lane=["api", "zzz"])
    assert seen == ["relay-live"]


def test_run_relay_prunes_by_default_and_not_with_prune_none() -> None:
    old = timezone.now() - timedelta(days=400)
    EventRecord.objects.create(name="testapp.Pinged", payload={}, occurred_at=old, recorded_at=old)
    with override_settings(DJANGO_DOMAIN_EVENTS={"POLL_SECONDS": 0.01}):
        run_relay(passes=2, prune=None)
        assert EventRecord.objects.count() == 1
        run_relay(passes=2)
    assert not EventRecord.objects.exists()
