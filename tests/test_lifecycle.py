"""Message lifecycle: lifetimes, retry policies, dead-letter commands and their lifetime."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    Constant,
    DeliveryFailure,
    DeliveryStatus,
    Linear,
    NotYet,
    dead_letters,
    deliver_pending,
    drain_outbox,
    outbox_health,
    prune_events,
    purge_dead,
    receiver,
    replay_events,
    requeue_dead,
    run_relay,
)
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, Pinged
from tests.support import command, failing, fire_one

pytestmark = pytest.mark.django_db


def row(event_id: int) -> DeliveryRecord:
    return DeliveryRecord.objects.get(event_id=event_id)


# Lifetime ------------------------------------------------------------------------


def test_a_lifetime_is_resolved_at_fire_time_from_the_due_time() -> None:
    receiver(OrderPlaced, key="t.ttl", ttl=timedelta(hours=1))(lambda evt: None)
    receiver(OrderPlaced, key="t.later", ttl=timedelta(hours=1), due=timedelta(days=2))(
        lambda evt: None
    )
    event_id = fire_one(OrderPlaced(order_id=1))
    now_row = DeliveryRecord.objects.get(event_id=event_id, receiver_key="t.ttl")
    later_row = DeliveryRecord.objects.get(event_id=event_id, receiver_key="t.later")
    assert now_row.expires_at == now_row.due_at + timedelta(hours=1)
    assert later_row.expires_at == later_row.due_at + timedelta(hours=1)
    assert later_row.due_at == now_row.due_at + timedelta(days=2)


@override_settings(DJANGO_DOMAIN_EVENTS={"MESSAGE_TTL_SECONDS": 600})
def test_the_setting_gives_a_lifetime_and_a_receivers_ttl_wins() -> None:
    receiver(OrderPlaced, key="t.default")(lambda evt: None)
    receiver(Pinged, key="t.own", ttl=timedelta(hours=2))(lambda evt: None)
    first = row(fire_one(OrderPlaced(order_id=1)))
    second = row(fire_one(Pinged()))
    assert first.expires_at == first.due_at + timedelta(seconds=600)
    assert second.expires_at == second.due_at + timedelta(hours=2)


def test_no_lifetime_by_default() -> None:
    receiver(OrderPlaced, key="t.none")(lambda evt: None)
    assert row(fire_one(OrderPlaced(order_id=1))).expires_at is None


def test_a_row_expiring_while_it_waits_out_its_backoff_dies_unrun() -> None:
    told: list[DeliveryFailure] = []
    calls: list[int] = []

    def flaky(evt: OrderPlaced) -> None:
        calls.append(1)
        raise ConnectionError("unreachable")

    receiver(
        OrderPlaced,
        key="t.expiring",
        ttl=timedelta(minutes=10),
        retry=Constant(60),
        on_failure=told.append,
    )(flaky)
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    assert row(event_id).status == DeliveryStatus.FAILED
    counts = deliver_pending(now=timezone.now() + timedelta(minutes=11))
    assert counts[DeliveryStatus.DEAD] == 1
    dead = row(event_id)
    assert calls == [1]
    assert dead.status == DeliveryStatus.DEAD and dead.attempts == 1
    assert dead.last_error.startswith("expired:") and "ttl=0:10:00" in dead.last_error
    assert [f.status for f in told] == ["failed", "dead"]
    assert [f.attempt for f in told] == [1, 1]  # the expiry made no attempt of its own


def test_a_retry_that_would_come_after_the_lifetime_dead_letters_at_once() -> None:
    receiver(OrderPlaced, key="t.short", ttl=timedelta(seconds=30), retry=Constant(60))(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    assert deliver_pending()[DeliveryStatus.DEAD] == 1
    assert row(event_id).last_error.startswith("expired:")
    assert "Last error: ConnectionError: unreachable" in row(event_id).last_error


def test_not_yet_moves_the_lifetime_with_the_due_time() -> None:
    until = timezone.now() + timedelta(days=3)
    receiver(OrderPlaced, key="t.moved", ttl=timedelta(hours=1))(
        lambda evt: (_ for _ in ()).throw(NotYet(until))
    )
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    moved = row(event_id)
    assert moved.due_at == until and moved.expires_at == until + timedelta(hours=1)


def test_replay_and_requeue_give_a_fresh_lifetime() -> None:
    receiver(OrderPlaced, key="t.life", ttl=timedelta(hours=1), max_attempts=1)(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    first_end = row(event_id).expires_at
    assert requeue_dead() == 1
    requeued = row(event_id)
    assert requeued.expires_at == requeued.due_at + timedelta(hours=1) > first_end  # type: ignore[operator]
    drain_outbox()
    assert replay_events([event_id]) == {"reopened": 1, "added": 0}
    replayed = row(event_id)
    assert replayed.expires_at == replayed.due_at + timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
def test_the_relays_idle_sweep_expires_rows_nobody_claims() -> None:
    told: list[str] = []
    receiver(
        OrderPlaced,
        key="t.unserved",
        lane="nobody",
        ttl=timedelta(seconds=1),
        on_failure=lambda failure: told.append(failure.status),
    )(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    DeliveryRecord.objects.filter(event_id=event_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with override_settings(DJANGO_DOMAIN_EVENTS={"POLL_SECONDS": 0.01}):
        run_relay(passes=2, lane="default")
    assert row(event_id).status == DeliveryStatus.DEAD
    assert row(event_id).last_error.startswith("expired:")
    assert told == ["dead"]


def test_health_counts_expired_rows_as_dead() -> None:
    receiver(OrderPlaced, key="t.ttl", ttl=timedelta(minutes=5))(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    health = outbox_health(now=timezone.now() + timedelta(minutes=6))
    assert (health.owed, health.dead) == (0, 1)


# Retry policies -----------------------------------------------------------------


def test_constant_retries_exactly_its_seconds_apart_without_jitter() -> None:
    receiver(OrderPlaced, key="t.const", retry=Constant(2), max_attempts=4)(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    t0 = timezone.now() + timedelta(hours=1)
    times = []
    for step in range(3):
        deliver_pending(now=t0 + timedelta(seconds=2 * step))
        times.append(row(event_id).available_at)
    assert times == [t0 + timedelta(seconds=2 * (step + 1)) for step in range(3)]


def test_linear_waits_step_times_attempt_capped() -> None:
    receiver(OrderPlaced, key="t.linear", retry=Linear(10, cap=25), max_attempts=5)(failing)
    event_id = fire_one(OrderPlaced(order_id=1))
    t0 = timezone.now() + timedelta(hours=1)
    waits = []
    moment = t0
    for _ in range(3):
        deliver_pending(now=moment)
        next_at = row(event_id).available_at
        waits.append((next_at - moment).total_seconds())
        moment = next_at
    assert waits == [10, 20, 25]


class GiveUpOnValueError:
    """A custom policy: retry connection trouble, never bad data."""

    def delay(self, attempt: int, error: BaseException) -> float | None:
        return None if isinstance(error, ValueError) else 1.0


def test_a_custom_policy_returning_none_dead_letters_on_the_first_failure() -> None:
    receiver(OrderPlaced, key="t.custom", retry=GiveUpOnValueError())(
        lambda evt: (_ for _ in ()).throw(ValueError("bad data"))
    )
    event_id = fire_one(OrderPlaced(order_id=1))
    assert deliver_pending()[DeliveryStatus.DEAD] == 1
    dead = row(event_id)
    assert dead.attempts == 1 and "GiveUpOnValueError gave up" in dead.last_error


def test_permanent_failure_and_not_yet_keep_their_meaning_under_a_policy() -> None:
    from django_domain_events import PermanentFailure

    receiver(OrderPlaced, key="t.perm", retry=Constant(1))(
        lambda evt: (_ for _ in ()).throw(PermanentFailure("no"))
    )
    assert row(fire_one(OrderPlaced(order_id=1))).status == DeliveryStatus.PENDING
    assert deliver_pending()[DeliveryStatus.DEAD] == 1


def test_unbounded_attempts_are_stored_as_null() -> None:
    receiver(OrderPlaced, key="t.forever", max_attempts=None, ttl=timedelta(days=1))(failing)
    assert row(fire_one(OrderPlaced(order_id=1))).max_attempts is None


# Dead letters ---------------------------------------------------------------------


def make_dead(count: int) -> list[int]:
    """``count`` OrderPlaced events whose ``t.dlq`` delivery is dead."""
    from django_domain_events import registry

    if registry.receiver("t.dlq") is None:
        receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(count)]
    drain_outbox()
    return ids


def test_dead_letters_filters_and_purge_refuses_an_unscoped_call() -> None:
    make_dead(2)
    receiver(Pinged, key="t.other", max_attempts=1)(failing)
    fire_one(Pinged())
    drain_outbox()
    assert dead_letters().count() == 3
    assert dead_letters(receiver_key="t.other").count() == 1
    assert dead_letters(event_name="testapp.OrderPlaced").count() == 2
    assert dead_letters(older_than=timedelta(days=1)).count() == 0
    with pytest.raises(ValueError, match="pass all=True"):
        purge_dead()
    assert dead_letters().count() == 3
    assert purge_dead(receiver_key="t.other") == 1
    assert purge_dead(all=True) == 2


def test_dump_prints_one_json_object_per_line() -> None:
    ids = make_dead(2)
    lines = command("dead_letters", "dump").splitlines()
    assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert [r["event_id"] for r in records] == ids
    first = records[0]
    assert set(first) == {
        "delivery_id",
        "event_id",
        "event_name",
        "receiver",
        "target",
        "attempts",
        "last_error",
        "payload",
        "occurred_at",
        "died_at",
    }
    assert first["receiver"] == "t.dlq" and first["payload"] == {
        "order_id": 0,
        "total": "0",
        "tags": [],
    }
    assert first["last_error"] == "ConnectionError: unreachable" and first["attempts"] == 1
    with pytest.raises(CommandError, match="No event named 'nope'"):
        command("dead_letters", "dump", "--event-name", "nope")


def test_retry_goes_through_requeue_dead_and_reports_counts() -> None:
    make_dead(3)
    out = command("dead_letters", "retry", "--limit", "2").splitlines()
    assert out == ["Total dead letters: 3", "Retrying: 2/3"]
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING).count() == 2
    assert command("dead_letters", "retry").splitlines() == [
        "Total dead letters: 1",
        "Retrying: 1/1",
    ]


def test_purge_command_needs_a_scope_and_changes_nothing_without_one() -> None:
    make_dead(2)
    with pytest.raises(CommandError, match="pass --all"):
        command("dead_letters", "purge")
    assert dead_letters().count() == 2
    with pytest.raises(CommandError, match="No receiver 't.nope'"):
        command("dead_letters", "purge", "--receiver", "t.nope")
    assert command("dead_letters", "purge", "--older-than", "1") == "Purged: 0\n"
    assert command("dead_letters", "purge", "--receiver", "t.dlq") == "Purged: 2\n"


def test_dead_letters_expire_after_their_lifetime_then_their_event_goes() -> None:
    receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    receiver(Pinged, key="t.ok")(lambda evt: None)
    dead_event = make_dead(1)[0]
    with override_settings(DJANGO_DOMAIN_EVENTS={"DEAD_LETTER_TTL_SECONDS": 3600}):
        assert prune_events() == 0
        later = timezone.now() + timedelta(hours=2)
        assert prune_events(now=later, older_than=timedelta(hours=1)) == 1
    assert not DeliveryRecord.objects.filter(event_id=dead_event).exists()
    assert not EventRecord.objects.filter(pk=dead_event).exists()


def test_unbounded_attempts_with_give_up_after_end_by_time() -> None:
    receiver(OrderPlaced, key="t.bounded", max_attempts=None, give_up_after=timedelta(hours=1))(
        failing
    )
    event_id = fire_one(OrderPlaced(order_id=1))
    assert deliver_pending()[DeliveryStatus.FAILED] == 1
    assert deliver_pending(now=timezone.now() + timedelta(hours=2))[DeliveryStatus.DEAD] == 1
    dead = row(event_id)
    assert dead.attempts == 2 and "give_up_after=1:00:00" in dead.last_error
