"""Operations on rows: cancel, replay, requeue, prune, and their commands."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    cancel_deliveries,
    claim_batch,
    deliver_pending,
    drain_outbox,
    fire,
    prune_events,
    purge_dead,
    quiet_receivers,
    receiver,
    registry,
    replay_events,
    requeue_dead,
)
from django_domain_events.delivery.run import attempt
from django_domain_events.models import DeliveryRecord, EventRecord, ReceiverMark
from django_domain_events.operations import EventsNotFound
from tests.app.events import Brief, OrderPlaced, Pinged, UntilConsumed, UntilSettled
from tests.support import command, failing, fire_one

pytestmark = pytest.mark.django_db


def rows(event_id: int) -> dict[str, DeliveryRecord]:
    return {
        f"{r.receiver_key}{':' + r.target if r.target else ''}": r
        for r in DeliveryRecord.objects.filter(event_id=event_id)
    }


# cancel ------------------------------------------------------------------------


def test_cancel_settles_pending_and_failed_rows_and_counts_claimed_ones() -> None:
    receiver(OrderPlaced, key="t.pending")(lambda evt: None)
    receiver(OrderPlaced, key="t.failed", max_attempts=3)(failing)
    receiver(OrderPlaced, key="t.claimed")(lambda evt: None)
    receiver(OrderPlaced, key="t.done")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    now = timezone.now()
    for claim in claim_batch(worker_id="w", now=now, lease=60, limit=10):
        if claim.receiver_key in ("t.failed", "t.done"):
            attempt(claim, now=now)
        elif claim.receiver_key == "t.pending":
            DeliveryRecord.objects.filter(pk=claim.id).update(status="pending", claimed_by="")
    result = cancel_deliveries([event_id])
    assert result == {"cancelled": 2, "in_flight": 1}
    found = rows(event_id)
    for key in ("t.pending", "t.failed"):
        assert found[key].status == DeliveryStatus.CANCELLED
        assert found[key].completed_at is not None and found[key].succeeded_at is None
    assert found["t.claimed"].status == DeliveryStatus.CLAIMED
    assert found["t.done"].status == DeliveryStatus.SUCCEEDED
    # Only the claimed row runs again, once its lease has lapsed; cancelled rows never do.
    assert deliver_pending(now=timezone.now() + timedelta(days=365))[DeliveryStatus.SUCCEEDED] == 1
    assert rows(event_id)["t.pending"].status == DeliveryStatus.CANCELLED


def test_cancel_narrows_by_receiver_and_delivery_ids() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    receiver(OrderPlaced, key="t.b")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    assert cancel_deliveries([event_id], receiver_key="t.a") == {"cancelled": 1, "in_flight": 0}
    b = rows(event_id)["t.b"]
    assert cancel_deliveries([event_id], delivery_ids=[10**9]) == {"cancelled": 0, "in_flight": 0}
    assert cancel_deliveries([event_id], delivery_ids=[b.pk]) == {"cancelled": 1, "in_flight": 0}


def test_cancel_joins_the_callers_transaction() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    with pytest.raises(RuntimeError), transaction.atomic():
        cancel_deliveries([event_id])
        raise RuntimeError("the change that made it moot failed")
    assert rows(event_id)["t.a"].status == DeliveryStatus.PENDING


def test_a_cancel_racing_a_claim_leaves_the_row_to_run() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    now = timezone.now()
    (claim,) = claim_batch(worker_id="relay", now=now, lease=60, limit=1)
    assert cancel_deliveries([event_id]) == {"cancelled": 0, "in_flight": 1}
    assert attempt(claim, now=now)[0] == DeliveryStatus.SUCCEEDED


def test_cancel_command_prints_counts_and_refuses_bad_input() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    with pytest.raises(CommandError, match="No event 999999"):
        command("cancel_deliveries", str(event_id), "999999")
    with pytest.raises(CommandError, match="Receiver 't.nope' is owed none of the events"):
        command("cancel_deliveries", str(event_id), "--receiver", "t.nope")
    with pytest.raises(CommandError, match="is given once"):
        command("cancel_deliveries", str(event_id), "--receiver", "t.a", "--receiver", "t.a")
    with pytest.raises(CommandError, match="required"):
        command("cancel_deliveries")
    assert rows(event_id)["t.a"].status == DeliveryStatus.PENDING
    out = command("cancel_deliveries", str(event_id), "--receiver", "t.a")
    assert out == "cancelled: 1, in_flight: 0\n"


# replay ------------------------------------------------------------------------


def test_replay_reopens_settled_rows_with_a_fresh_budget_and_adds_missing_ones() -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    receiver(OrderPlaced, key="t.dead", max_attempts=2)(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    receiver(OrderPlaced, key="t.new")(lambda evt: None)  # deployed after the event
    before = timezone.now()
    assert replay_events([event_id]) == {"reopened": 2, "added": 1}
    found = rows(event_id)
    for key in ("t.ok", "t.dead", "t.new"):
        row = found[key]
        assert (row.status, row.attempts, row.last_error) == (DeliveryStatus.PENDING, 0, "")
        assert row.due_at >= before and row.available_at == row.due_at
        assert row.completed_at is None
    assert found["t.ok"].succeeded_at is not None  # never cleared


def test_replay_leaves_claimed_and_owed_rows_alone_and_narrows_by_receiver() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    receiver(OrderPlaced, key="t.b")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    claim_batch(worker_id="relay", now=timezone.now(), lease=60, limit=1)
    assert replay_events([event_id]) == {"reopened": 0, "added": 0}
    drain_outbox(now=timezone.now() + timedelta(hours=1))
    assert replay_events([event_id], receiver_keys=["t.b"]) == {"reopened": 1, "added": 0}
    assert rows(event_id)["t.a"].status == DeliveryStatus.SUCCEEDED


def test_replay_resolves_targets_again() -> None:
    recipients = ["a", "b"]
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: list(recipients))(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    recipients[:] = ["b", "c"]
    assert replay_events([event_id]) == {"reopened": 1, "added": 1}
    found = rows(event_id)
    assert found["t.fan:a"].status == DeliveryStatus.SUCCEEDED  # no longer returned: untouched
    assert found["t.fan:b"].status == DeliveryStatus.PENDING
    assert found["t.fan:c"].status == DeliveryStatus.PENDING


def test_replay_of_a_missing_event_or_receiver_says_so_and_changes_nothing() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    with pytest.raises(EventsNotFound, match="pruned, or never fired"):
        replay_events([event_id, 10**9])
    with pytest.raises(ValueError, match="not a durable receiver"):
        replay_events([event_id], receiver_keys=["t.unknown"])
    assert rows(event_id)["t.a"].status == DeliveryStatus.SUCCEEDED
    with pytest.raises(CommandError, match="No event 1000000000"):
        command("replay_events", str(event_id), str(10**9))
    with pytest.raises(CommandError, match="invalid int value"):
        command("replay_events", "abc")
    assert command("replay_events", str(event_id), "--receiver", "t.a") == "reopened: 1, added: 0\n"


def test_replay_reopens_a_cancelled_row() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    cancel_deliveries([event_id])
    assert replay_events([event_id]) == {"reopened": 1, "added": 0}
    assert drain_outbox()[DeliveryStatus.SUCCEEDED] == 1


# requeue -----------------------------------------------------------------------


def test_requeue_dead_makes_dead_rows_owed_now_with_attempts_reset() -> None:
    receiver(OrderPlaced, key="t.dead", max_attempts=1)(failing)
    receiver(OrderPlaced, key="t.other", max_attempts=1)(failing)
    first = fire_one(OrderPlaced(order_id=1))
    second = fire_one(OrderPlaced(order_id=2))
    drain_outbox()
    assert requeue_dead(limit=0) == 0
    assert requeue_dead(receiver_key="t.dead", limit=1) == 1
    row = rows(first)["t.dead"]
    assert (row.status, row.attempts, row.last_error, row.completed_at) == (
        DeliveryStatus.PENDING,
        0,
        "",
        None,
    )
    assert rows(second)["t.dead"].status == DeliveryStatus.DEAD
    assert requeue_dead(delivery_ids=[rows(second)["t.other"].pk]) == 1
    assert requeue_dead() == 2
    assert requeue_dead() == 0


def test_requeue_dead_leaves_cancelled_rows_alone() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    cancel_deliveries([event_id])
    assert requeue_dead() == 0
    assert rows(event_id)["t.a"].status == DeliveryStatus.CANCELLED


def test_requeue_command() -> None:
    receiver(OrderPlaced, key="t.dead", max_attempts=1)(failing)
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    with pytest.raises(CommandError, match="--limit must be a whole number from 0"):
        command("requeue_dead", "--limit", "-1")
    with pytest.raises(CommandError, match="No receiver 't.nope'"):
        command("requeue_dead", "--receiver", "t.nope")
    assert command("requeue_dead", "--limit", "0") == "requeued: 0\n"
    assert command("requeue_dead", "--receiver", "t.dead") == "requeued: 1\n"


# prune -------------------------------------------------------------------------


def age(event_id: int, days: float) -> None:
    then = timezone.now() - timedelta(days=days)
    EventRecord.objects.filter(pk=event_id).update(recorded_at=then, occurred_at=then)


def test_prune_deletes_settled_events_past_the_window_and_keeps_owed_ones() -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    settled = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    owed = fire_one(OrderPlaced(order_id=2))
    recent = fire_one(Pinged())
    for event_id in (settled, owed):
        age(event_id, 100)
    assert prune_events() == 1
    assert set(EventRecord.objects.values_list("pk", flat=True)) == {owed, recent}
    assert not DeliveryRecord.objects.filter(event_id=settled).exists()
    assert prune_events(older_than=timedelta(0)) == 1  # recent has no rows: settled
    assert command("prune_events", "--days", "0") == "pruned: 0 events\n"


@pytest.fixture
def policies() -> dict[str, type]:
    return {"brief": Brief, "consumed": UntilConsumed, "settled": UntilSettled}


def test_retention_policies(policies: dict[str, type]) -> None:
    brief, consumed, settled = policies["brief"], policies["consumed"], policies["settled"]
    receiver(brief, key="t.brief")(lambda evt: None)
    receiver(consumed, key="t.c_ok")(lambda evt: None)
    receiver(consumed, key="t.c_cancel")(lambda evt: None)
    receiver(settled, key="t.s_dead", max_attempts=1)(failing)
    b = fire_one(brief())
    c = fire_one(consumed())
    s = fire_one(settled())
    dead_consumed = fire_one(consumed(n=1))
    row = EventRecord.objects.get(pk=b)
    assert row.retention_seconds == 3600 and row.delete_when == ""
    assert EventRecord.objects.get(pk=c).delete_when == "succeeded"
    assert EventRecord.objects.get(pk=s).delete_when == "settled"
    cancel_deliveries([c], receiver_key="t.c_cancel")
    registry.forget("t.c_cancel")
    receiver(consumed, key="t.c_cancel", max_attempts=1)(failing)
    drain_outbox()
    assert prune_events() == 2  # consumed (a success and a cancel) and settled (dead)
    assert set(EventRecord.objects.values_list("pk", flat=True)) == {b, dead_consumed}
    assert prune_events(now=timezone.now() + timedelta(hours=2)) == 1
    assert set(EventRecord.objects.values_list("pk", flat=True)) == {dead_consumed}


def test_dedupe_key_is_refused_for_retention_policies(policies: dict[str, type]) -> None:
    with pytest.raises(ValueError, match="would guard nothing"), transaction.atomic():
        fire(policies["consumed"](), dedupe_key="k")


def test_prune_works_in_batches_and_honours_limit() -> None:
    receiver(Pinged, key="t.a")(lambda evt: None)
    receiver(Pinged, key="t.b")(lambda evt: None)
    ids = [fire_one(Pinged(n=n)) for n in range(7)]
    drain_outbox()
    for event_id in ids:
        age(event_id, 100)
    assert prune_events(limit=2, batch_size=3) == 2  # 3 rows per event: one event a batch
    assert prune_events(batch_size=6) == 5
    assert not EventRecord.objects.exists()


def test_quiet_receivers_survives_the_prune() -> None:
    receiver(OrderPlaced, key="t.busy")(lambda evt: None)
    receiver(OrderPlaced, key="t.never", max_attempts=1)(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    quiet = quiet_receivers(within=timedelta(days=1))
    assert [(q.key, q.event_name, q.last_succeeded_at) for q in quiet] == [
        ("t.never", "testapp.OrderPlaced", None)
    ]
    age(event_id, 100)
    assert prune_events() == 1
    assert ReceiverMark.objects.get(receiver_key="t.busy").last_succeeded_at is not None
    assert [q.key for q in quiet_receivers(within=timedelta(days=1))] == ["t.never"]
    later = timezone.now() + timedelta(days=2)
    assert [q.key for q in quiet_receivers(within=timedelta(days=1), now=later)] == [
        "t.busy",
        "t.never",
    ]
    assert "t.never (testapp.OrderPlaced): last succeeded never" in command("quiet_receivers")
    with pytest.raises(CommandError, match="--days must be a number of days above 0, .* not -2"):
        command("quiet_receivers", "--days", "-2")


def test_prune_command_refuses_bad_input() -> None:
    with pytest.raises(CommandError, match="--days must be a number of days from 0 to .* not -1"):
        command("prune_events", "--days", "-1")
    with pytest.raises(CommandError, match="--batch-size must be a whole number from 1"):
        command("prune_events", "--batch-size", "0")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL locking")
@pytest.mark.django_db(transaction=True)
def test_a_replay_racing_a_prune_keeps_the_reopened_work() -> None:
    from tests.conftest import start_child, wait_until_blocked

    receiver(OrderPlaced, key="tests.record_order")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    age(event_id, 100)
    with transaction.atomic():
        assert replay_events([event_id]) == {"reopened": 1, "added": 0}
        pruner = start_child("prune")
        wait_until_blocked(pruner)  # the pruner chose the event and now waits on our lock
    out, err = pruner.communicate(timeout=60)
    assert pruner.returncode == 0, err
    assert out.strip() == "0"
    assert rows(event_id)["tests.record_order"].status == DeliveryStatus.PENDING


def test_a_replayed_success_still_counts_for_quiet_receivers() -> None:
    receiver(OrderPlaced, key="t.again")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    replay_events([event_id])
    assert rows(event_id)["t.again"].status == DeliveryStatus.PENDING
    assert quiet_receivers(within=timedelta(days=1)) == []


@pytest.mark.parametrize("deleted_by", ["purge_dead", "DEAD_LETTER_TTL_SECONDS"])
def test_a_success_survives_when_its_row_dies_after_a_replay_and_is_deleted(
    deleted_by: str,
) -> None:
    """Found by tests/test_lifecycle_machine.py: a row that succeeded, was replayed and then
    died still carries its success; deleting it as a dead letter (purge_dead, or the prune's
    dead-letter lifetime) lost that success, and quiet_receivers() then said the receiver
    never succeeded."""
    outcomes = iter(["ok", "fail"])

    def once_then_never(evt: OrderPlaced) -> None:
        if next(outcomes) == "fail":
            raise ConnectionError("unreachable")

    receiver(OrderPlaced, key="t.once", max_attempts=1)(once_then_never)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    succeeded_at = rows(event_id)["t.once"].succeeded_at
    assert succeeded_at is not None
    replay_events([event_id])
    drain_outbox()
    assert rows(event_id)["t.once"].status == DeliveryStatus.DEAD
    if deleted_by == "purge_dead":
        assert purge_dead(receiver_key="t.once") == 1
    else:
        with override_settings(DJANGO_DOMAIN_EVENTS={"DEAD_LETTER_TTL_SECONDS": 60}):
            prune_events(now=timezone.now() + timedelta(hours=1))
    assert not DeliveryRecord.objects.filter(receiver_key="t.once").exists()
    (quiet,) = quiet_receivers(within=timedelta(microseconds=1), now=timezone.now())
    assert (quiet.key, quiet.last_succeeded_at) == ("t.once", succeeded_at)
