"""Group acknowledgement (issue 12): ``@receiver(..., ack="batch")``.

A run of such rows shares one transaction: each receiver in a savepoint, the successes
acknowledged by one statement, one commit.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core import checks
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import (
    INLINE,
    DeliveryContext,
    DeliveryStatus,
    claim_batch,
    deliver_pending,
    receiver,
)
from django_domain_events.models import DeliveryRecord
from django_domain_events.retry import Constant
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)


def record(evt: OrderPlaced, ctx: DeliveryContext) -> None:
    Delivered.objects.create(
        delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, event_id=ctx.event_id
    )
    if evt.order_id == 13:
        raise ValueError("unlucky")


def acknowledgements(queries: CaptureQueriesContext) -> int:
    return sum(
        1
        for q in queries.captured_queries
        if q["sql"].startswith("UPDATE") and "'succeeded'" in q["sql"]
    )


def test_a_run_of_batch_rows_is_acknowledged_by_one_statement() -> None:
    receiver(OrderPlaced, key="t.group", takes_context=True, ack="batch")(record)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(10)]
    with CaptureQueriesContext(connection) as queries:
        counts = deliver_pending(batch_size=10)
    assert counts[DeliveryStatus.SUCCEEDED] == 10
    assert acknowledgements(queries) == 1
    assert set(DeliveryRecord.objects.values_list("status", "attempts")) == {
        (DeliveryStatus.SUCCEEDED, 1)
    }
    assert sorted(Delivered.objects.values_list("event_id", flat=True)) == sorted(ids)


def test_a_failing_row_rolls_back_its_own_writes_only_and_fails_in_the_same_commit() -> None:
    told: list[int] = []
    receiver(
        OrderPlaced,
        key="t.group",
        takes_context=True,
        ack="batch",
        retry=Constant(60),  # the failed row stays out of this call's later claims
        on_failure=lambda failure: told.append(failure.event_id),
    )(record)
    ids = {n: fire_one(OrderPlaced(order_id=n)) for n in (11, 12, 13, 14)}
    counts = deliver_pending(batch_size=10)
    assert counts[DeliveryStatus.SUCCEEDED] == 3 and counts[DeliveryStatus.FAILED] == 1
    failed = DeliveryRecord.objects.get(event_id=ids[13])
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, 1)
    assert failed.last_error == "ValueError: unlucky"
    assert sorted(Delivered.objects.values_list("event_id", flat=True)) == sorted(
        ids[n] for n in (11, 12, 14)
    )
    assert told == [ids[13]]


def test_rows_of_each_receiver_run_one_commit_each_and_mixed_runs_split() -> None:
    receiver(OrderPlaced, key="t.group", takes_context=True, ack="batch")(record)
    receiver(Pinged, key="t.each")(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    fire_one(OrderPlaced(order_id=2))
    fire_one(Pinged(n=1))
    fire_one(OrderPlaced(order_id=3))
    with CaptureQueriesContext(connection) as queries:
        counts = deliver_pending(batch_size=10)
    assert counts[DeliveryStatus.SUCCEEDED] == 4
    # The run of two, then the Pinged row alone, then a run of one (acknowledged alone).
    assert acknowledgements(queries) == 3


def _take_over(ids: list[int]) -> None:
    try:
        later = timezone.now() + timedelta(hours=1)
        claim_batch(worker_id="B", now=later, lease=60, limit=10, ids=ids)
    finally:
        connections.close_all()


def test_a_row_taken_over_mid_group_rolls_the_group_back_and_the_rest_run_once() -> None:
    taken: list[int] = []

    def take_then_record(evt: OrderPlaced, ctx: DeliveryContext) -> None:
        if evt.order_id == 0 and not taken:
            taken.append(last)
            other = threading.Thread(target=_take_over, args=([last],))
            other.start()
            other.join()
        record(evt, ctx)

    receiver(OrderPlaced, key="t.group", takes_context=True, ack="batch")(take_then_record)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(4)]
    last = DeliveryRecord.objects.get(event_id=ids[-1]).id
    counts = deliver_pending(batch_size=4)
    assert counts[DeliveryStatus.SUCCEEDED] == 3
    assert DeliveryRecord.objects.get(id=last).claimed_by == "B"
    # The group's first writes were rolled back with it: each other row wrote once.
    assert sorted(Delivered.objects.values_list("event_id", flat=True)) == sorted(ids[:-1])


def test_ack_is_refused_unless_each_or_batch_on_a_durable_receiver() -> None:
    with pytest.raises(ValueError, match="must be 'each'.*or 'batch'"):
        receiver(OrderPlaced, key="t.bad", ack="sometimes")(lambda evt: None)
    with pytest.raises(ValueError, match="ack=.*describes a delivery row"):
        receiver(OrderPlaced, key="t.inline", mode=INLINE, ack="batch")(lambda evt: None)


@pytest.mark.django_db(databases="__all__")  # Django 6.1's JSONField check asks SQLite
def test_check_warns_of_batch_ack_on_a_task_receiver() -> None:
    from django.test import override_settings

    receiver(OrderPlaced, key="t.task", site="task", ack="batch")(lambda evt: None)
    with override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_tasks.ThreadBackend"}):
        found = [m.id for m in checks.run_checks(databases=[])]
    assert "django_domain_events.W005" in found
