"""priority=: within a lane, higher first among due rows, with aging so none starves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import DeliveryStatus, deliver_pending, fire, receiver
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import needs_postgresql

pytestmark = pytest.mark.django_db(transaction=True)

AGING = {"PRIORITY_AGING_SECONDS": 10}


def fire_each(*events: object) -> None:
    with transaction.atomic():
        for evt in events:
            fire(evt)


def claimed_keys(now: object, limit: int) -> list[str]:
    claims = claim_batch(worker_id="w", now=now, lease=60, limit=limit)
    return [c.receiver_key for c in claims]


def test_higher_priority_rows_are_claimed_first_among_due_rows() -> None:
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    receiver(Pinged, key="t.urgent", priority=10)(lambda evt: None)
    fire_each(*(OrderPlaced(order_id=n) for n in range(5)))
    fire_each(Pinged(n=1), Pinged(n=2))
    now = timezone.now() + timedelta(seconds=1)
    assert claimed_keys(now, 3) == ["t.urgent", "t.urgent", "t.bulk"]


def test_a_negative_priority_goes_after_the_default() -> None:
    receiver(OrderPlaced, key="t.later", priority=-1)(lambda evt: None)
    receiver(Pinged, key="t.normal")(lambda evt: None)
    fire_each(OrderPlaced(order_id=1))
    fire_each(Pinged(n=1))
    assert claimed_keys(timezone.now() + timedelta(seconds=1), 2) == ["t.normal", "t.later"]


@override_settings(DJANGO_DOMAIN_EVENTS=AGING)
def test_a_row_goes_before_every_row_due_more_than_the_aging_after_it() -> None:
    receiver(OrderPlaced, key="t.low")(lambda evt: None)
    receiver(Pinged, key="t.high", priority=1000, due=timedelta(seconds=11))(lambda evt: None)
    fire_each(OrderPlaced(order_id=1))
    fire_each(Pinged(n=1), Pinged(n=2))
    later = timezone.now() + timedelta(seconds=30)  # all three due, the high ones 11 s later
    assert claimed_keys(later, 3) == ["t.low", "t.high", "t.high"]


@override_settings(DJANGO_DOMAIN_EVENTS=AGING)
def test_within_the_aging_a_higher_priority_row_due_later_still_goes_first() -> None:
    receiver(OrderPlaced, key="t.low")(lambda evt: None)
    receiver(Pinged, key="t.high", priority=1000, due=timedelta(seconds=5))(lambda evt: None)
    fire_each(OrderPlaced(order_id=1))
    fire_each(Pinged(n=1))
    later = timezone.now() + timedelta(seconds=30)
    assert claimed_keys(later, 2) == ["t.high", "t.low"]


def test_a_row_not_yet_due_is_not_claimed_whatever_its_priority() -> None:
    receiver(Pinged, key="t.high", priority=50, due=timedelta(seconds=5))(lambda evt: None)
    fire_each(Pinged(n=1))
    assert claimed_keys(timezone.now(), 5) == []


def failing_once(evt: object) -> None:
    if not DeliveryRecord.objects.filter(status=DeliveryStatus.FAILED).exists():
        raise RuntimeError("first attempt fails")


def test_a_retried_row_keeps_its_priority() -> None:
    receiver(Pinged, key="t.flaky", priority=5, backoff_base_seconds=30)(
        lambda evt: (_ for _ in ()).throw(RuntimeError("down"))
    )
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    fire_each(Pinged(n=1))
    deliver_pending()
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    row = DeliveryRecord.objects.get(receiver_key="t.flaky")
    assert row.status == DeliveryStatus.FAILED
    # Once its backoff has passed, it goes before the default-priority rows due meanwhile.
    after_backoff = row.available_at + timedelta(seconds=1)
    assert claimed_keys(after_backoff, 2) == ["t.flaky", "t.bulk"]


def test_priority_must_be_an_int() -> None:
    with pytest.raises(TypeError, match=r"priority=\) must be an int"):
        receiver(Pinged, key="t.bad", priority="high")(lambda evt: None)  # type: ignore[arg-type]


def test_priority_is_refused_on_a_receiver_without_rows() -> None:
    from django_domain_events import INLINE

    with pytest.raises(ValueError, match="priority="):
        receiver(Pinged, key="t.inline", mode=INLINE, priority=3)(lambda evt: None)


@override_settings(DJANGO_DOMAIN_EVENTS={"PRIORITY_AGING_SECONDS": 0})
def test_a_non_positive_aging_is_refused_naming_the_setting() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_domain_events import conf

    with pytest.raises(ImproperlyConfigured, match="PRIORITY_AGING_SECONDS"):
        conf.get()


@needs_postgresql
def test_the_claim_reads_the_rank_index_on_postgresql() -> None:
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    fire_each(*(OrderPlaced(order_id=n) for n in range(20)))
    statements: list[tuple[str, object]] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(record):
            claim_batch(worker_id="w", now=timezone.now(), lease=60, limit=5)
        claim_sql, params = next(s for s in statements if "SKIP LOCKED" in s[0])
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + claim_sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    print(plan)
    assert "dde_delivery_claim_rank" in plan, plan


# priority= on fire(): one event's rows, ahead of (or behind) their receivers' own ----


def test_a_fire_priority_puts_that_events_rows_ahead_of_the_receivers_own() -> None:
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    with transaction.atomic():
        urgent = fire(OrderPlaced(order_id=99), priority=5)
    soon = timezone.now() + timedelta(seconds=1)
    claims = claim_batch(worker_id="w", now=soon, lease=60, limit=2)
    assert [c.event_id for c in claims][0] == urgent
    assert claims[1].event_id != urgent


def test_a_fire_priority_overrides_a_declared_one_downwards_too() -> None:
    receiver(Pinged, key="t.urgent", priority=10)(lambda evt: None)
    receiver(OrderPlaced, key="t.normal")(lambda evt: None)
    fire_each(OrderPlaced(order_id=1))
    with transaction.atomic():
        fire(Pinged(n=1), priority=-1)
    assert claimed_keys(timezone.now() + timedelta(seconds=1), 2) == ["t.normal", "t.urgent"]


def test_a_fire_priority_covers_every_receiver_and_target_of_the_event() -> None:
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: ["a", "b"])(lambda evt: None)
    receiver(OrderPlaced, key="t.plain", priority=3)(lambda evt: None)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1), priority=7)
        fire(OrderPlaced(order_id=2))
    first = DeliveryRecord.objects.order_by("event_id").values_list("event_id", flat=True)[0]
    ranked = {
        (row.event_id == first, row.receiver_key, row.target): row.priority_credit
        for row in DeliveryRecord.objects.all()
    }
    seven, three = priority_credit(7), priority_credit(3)
    assert ranked == {
        (True, "t.fan", "a"): seven,
        (True, "t.fan", "b"): seven,
        (True, "t.plain", ""): seven,
        (False, "t.fan", "a"): 0,
        (False, "t.fan", "b"): 0,
        (False, "t.plain", ""): three,
    }


def priority_credit(value: int) -> int:
    from django_domain_events import priority

    return priority.credit(value)


@pytest.mark.parametrize("bad", ["high", "5", 1.5, True])
def test_a_fire_priority_that_is_not_an_int_is_refused_and_nothing_is_written(
    bad: object,
) -> None:
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    with transaction.atomic():
        with pytest.raises(TypeError, match=r"fire\(priority=\) must be an int"):
            fire(OrderPlaced(order_id=1), priority=bad)  # type: ignore[arg-type]
        fire(OrderPlaced(order_id=2))  # the caller's transaction goes on
    assert DeliveryRecord.objects.count() == 1
    from django_domain_events.models import EventRecord

    assert EventRecord.objects.count() == 1


def test_a_retried_row_keeps_its_fire_priority() -> None:
    receiver(Pinged, key="t.flaky", backoff_base_seconds=30)(
        lambda evt: (_ for _ in ()).throw(RuntimeError("down"))
    )
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    with transaction.atomic():
        fire(Pinged(n=1), priority=4)
    deliver_pending()
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    row = DeliveryRecord.objects.get(receiver_key="t.flaky")
    assert row.status == DeliveryStatus.FAILED
    assert claimed_keys(row.available_at + timedelta(seconds=1), 2) == ["t.flaky", "t.bulk"]


def test_a_replay_that_reopens_a_row_keeps_its_fire_priority() -> None:
    from django_domain_events import replay_events

    receiver(Pinged, key="t.once")(lambda evt: None)
    receiver(OrderPlaced, key="t.bulk")(lambda evt: None)
    with transaction.atomic():
        urgent = fire(Pinged(n=1), priority=6)
    deliver_pending()
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    replay_events([urgent])
    assert claimed_keys(timezone.now() + timedelta(seconds=1), 2) == ["t.once", "t.bulk"]
