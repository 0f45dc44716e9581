"""site="task": the relay claims, a task worker (a real second thread) delivers."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_domain_events import DeliveryStatus, deliver_one, deliver_pending, fire, receiver
from django_domain_events.delivery.tasks import TaskBackendMissing
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered

pytestmark = pytest.mark.django_db(transaction=True)


class ThreadBackend:
    """A task queue whose worker is a real thread calling deliver_one."""

    messages: queue.Queue[tuple[int, str, str] | None] = queue.Queue()
    results: list[Any] = []
    enqueued: list[int] = []

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        ThreadBackend.enqueued.append(delivery_id)
        ThreadBackend.messages.put((delivery_id, claimed_by, claimed_at))


def work_off(messages: int) -> list[Any]:
    """Run a worker thread until it has handled ``messages`` messages."""
    results: list[Any] = []

    def worker() -> None:
        try:
            for _ in range(messages):
                item = ThreadBackend.messages.get(timeout=10)
                assert item is not None
                delivery_id, claimed_by, claimed_at = item
                results.append(
                    deliver_one(
                        delivery_id,
                        worker_id="task-worker",
                        claimed_by=claimed_by,
                        claimed_at=claimed_at,
                    )
                )
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    return results


def record(evt: OrderPlaced, ctx: Any) -> None:
    Delivered.objects.create(
        delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, event_id=ctx.event_id
    )


@pytest.fixture(autouse=True)
def fresh_backend() -> None:
    ThreadBackend.messages = queue.Queue()
    ThreadBackend.enqueued = []


@override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_tasks.ThreadBackend"})
def test_the_relay_hands_claimed_rows_to_the_task_worker() -> None:
    receiver(OrderPlaced, key="t.task", site="task", takes_context=True)(record)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    counts = deliver_pending()
    assert sum(counts.values()) == 0  # a hand-off is not counted
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status == DeliveryStatus.CLAIMED
    assert work_off(1) == [DeliveryStatus.SUCCEEDED]
    row.refresh_from_db()
    assert (row.status, row.claimed_by, row.attempts) == (
        DeliveryStatus.SUCCEEDED,
        "task-worker",
        1,
    )
    assert Delivered.objects.count() == 1


@override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_tasks.ThreadBackend"})
def test_a_duplicate_message_runs_nothing_and_logs_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver(OrderPlaced, key="t.task", site="task", takes_context=True)(record)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
    deliver_pending()
    (message,) = list(ThreadBackend.messages.queue)
    ThreadBackend.messages.put(message)  # the queue delivers it twice
    with caplog.at_level(logging.INFO, logger="django_domain_events"):
        assert work_off(2) == [DeliveryStatus.SUCCEEDED, None]
    assert Delivered.objects.count() == 1
    info = [r for r in caplog.records if "duplicate, late or stale" in r.getMessage()]
    assert len(info) == 1 and info[0].levelno == logging.INFO


@override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_tasks.ThreadBackend"})
def test_a_row_owed_again_after_a_lapse_is_not_run_by_the_stale_message() -> None:
    receiver(OrderPlaced, key="t.task", site="task", takes_context=True)(record)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    deliver_pending()
    stale = ThreadBackend.messages.get()
    DeliveryRecord.objects.filter(event_id=event_id).update(claimed_by="relay-2")
    assert deliver_one(stale[0], claimed_by=stale[1], claimed_at=stale[2]) is None
    assert not Delivered.objects.exists()


def test_without_a_backend_a_task_row_is_handed_back_uncharged_and_the_call_fails() -> None:
    """A missing backend is the deployment's error: no row pays for it."""
    ran: list[str] = []
    receiver(OrderPlaced, key="t.task", site="task")(lambda evt: ran.append("task"))
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    with pytest.raises(TaskBackendMissing, match="TASK_BACKEND.*site='relay'"):
        deliver_pending()
    assert ran == []
    task_row = DeliveryRecord.objects.get(event_id=event_id, receiver_key="t.task")
    assert (task_row.status, task_row.attempts, task_row.last_error) == (
        DeliveryStatus.PENDING,
        0,
        "",
    )


@override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": "tests.test_tasks.ThreadBackend"})
def test_with_a_given_now_a_row_is_handed_off_at_most_once_per_call() -> None:
    from datetime import timedelta

    from django.utils import timezone

    receiver(OrderPlaced, key="t.task", site="task")(lambda evt: None)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
    deliver_pending(now=timezone.now() + timedelta(days=30))
    assert len(ThreadBackend.enqueued) == 1
