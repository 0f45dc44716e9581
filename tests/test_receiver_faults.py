"""What a receiver raises, and what reading its row raises, is judged in one place
(issue 19, items 5 and 6): a real decode failure is permanent, a database error while
reading is an outage or one failed attempt, and whatever a receiver raises,
``BaseException`` included, is one recorded attempt. Runs on every database; the
process tests are in test_receiver_fault_processes.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, ProgrammingError, connection

from django_domain_events import Constant, DeliveryStatus, deliver_pending, receiver, run_relay
from django_domain_events.delivery.claim_rows import INLINE_PAYLOAD_BYTES
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered
from tests.procs.receivers import kill_own_connection
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def payload_read_fails(error: Exception) -> Iterator[None]:
    """The query that reads one large payload from the event table raises ``error``
    once, as a locked or failing database would."""
    raised: list[bool] = []

    def fail(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        reads_payload = EventRecord._meta.db_table in sql and "payload" in sql
        if reads_payload and DeliveryRecord._meta.db_table not in sql and not raised:
            raised.append(True)
            raise error
        return execute(sql, *args)

    with connection.execute_wrapper(fail):
        yield
    assert raised, "the payload was never read on its own"


def large_order() -> int:
    ran: list[int] = []
    # A backoff of an hour: the default one is jittered, and can be due within the same
    # deliver_pending() call, which would then run the row again at once.
    large = receiver(OrderPlaced, key="t.large", max_attempts=3, retry=Constant(3600))
    large(lambda evt: ran.append(evt.order_id))
    return fire_one(OrderPlaced(order_id=1, tags=("x" * (INLINE_PAYLOAD_BYTES + 10),)))


def test_a_locked_database_while_reading_a_payload_does_not_dead_letter_the_row() -> None:
    event_id = large_order()
    locked = OperationalError("database is locked")
    with payload_read_fails(locked), contextlib.suppress(OperationalError):
        deliver_pending()  # an outage, raised for the caller to ride out; or one attempt
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status != DeliveryStatus.DEAD and "could not be decoded" not in row.last_error
    assert row.attempts <= 1
    deliver_pending(ignore_backoff=True)
    row.refresh_from_db()
    assert row.status == DeliveryStatus.SUCCEEDED


def test_a_database_error_while_reading_that_is_no_outage_is_one_failed_attempt() -> None:
    event_id = large_order()
    with payload_read_fails(ProgrammingError("the read failed")):
        assert deliver_pending()[DeliveryStatus.FAILED] == 1
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    assert row.last_error == "ProgrammingError: the read failed"


def raises(error: BaseException) -> Callable[[object], None]:
    def receive(evt: object) -> None:
        raise error

    return receive


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
def test_a_receiver_raising_outside_exception_is_one_attempt_and_the_relay_goes_on(
    error: BaseException,
) -> None:
    receiver(OrderPlaced, key="t.raises", max_attempts=1)(raises(error))
    ran: list[int] = []
    receiver(OrderPlaced, key="t.fine")(lambda evt: ran.append(evt.order_id))
    for n in range(3):
        fire_one(OrderPlaced(order_id=n))
    counts = run_relay(once=True, prune=None)
    assert (counts[DeliveryStatus.DEAD], counts[DeliveryStatus.SUCCEEDED]) == (3, 3)
    dead = DeliveryRecord.objects.filter(receiver_key="t.raises")
    assert set(dead.values_list("status", "attempts")) == {(DeliveryStatus.DEAD, 1)}
    assert sorted(ran) == [0, 1, 2]


def test_outside_a_relay_a_keyboard_interrupt_is_recorded_then_still_stops_the_caller() -> None:
    """In a shell, Ctrl-C may be what raised it: the attempt is recorded, then it goes on
    up, so ``deliver_pending()`` stops as the user asked. (Python's own SIGINT handler is
    put in place first: whatever an earlier test left there is not what a shell has.)"""
    receiver(OrderPlaced, key="t.interrupted", max_attempts=2)(raises(KeyboardInterrupt()))
    event_id = fire_one(OrderPlaced(order_id=1))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            deliver_pending()
    finally:
        signal.signal(signal.SIGINT, previous)
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    assert row.last_error == "KeyboardInterrupt"


def test_a_task_left_by_an_async_receiver_cannot_write_outside_its_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The task writes after its receiver returned, while the next row runs: its query is
    refused when it comes to run (here as the relay stops, the first moment the relay's
    thread is free for it), loudly and naming the receiver, rather than run in another
    delivery's transaction; the relay and both rows are unharmed."""

    queued, slow_done, give_up = threading.Event(), threading.Event(), threading.Event()
    ended: list[BaseException | None] = []  # how the task's write ended

    async def leaves_a_task(evt: OrderPlaced) -> None:
        async def later() -> None:
            await asyncio.sleep(0.1)
            write = asyncio.ensure_future(
                Delivered.objects.acreate(
                    delivery_id=1000, receiver_key="left", event_id=evt.order_id, target=""
                )
            )
            await asyncio.sleep(0)  # the write's first step ran: its query waits in a queue
            queued.set()
            try:
                await write
            except BaseException as error:
                ended.append(error)
                raise
            ended.append(None)

        asyncio.get_running_loop().create_task(later())

    def slow(evt: OrderPlaced) -> None:
        time.sleep(0.5)  # the left task's write comes while this row runs
        slow_done.set()

    receiver(OrderPlaced, key="t.a_leaves")(leaves_a_task)
    receiver(OrderPlaced, key="t.b_slow")(slow)
    fire_one(OrderPlaced(order_id=1))

    # Stop once both rows ran and the task's query is waiting for the relay's thread
    # (nothing frees that thread while the relay idles), however loaded the machine.
    def stop() -> bool:
        return (slow_done.is_set() and queued.is_set()) or give_up.is_set()

    timer = threading.Timer(60, give_up.set)
    timer.start()
    with caplog.at_level(logging.ERROR, logger="django_domain_events"):
        counts = run_relay(stop=stop, prune=None)
    timer.cancel()
    assert not give_up.is_set()
    assert counts[DeliveryStatus.SUCCEEDED] == 2
    assert not Delivered.objects.filter(receiver_key="left").exists()
    assert "receiver t.a_leaves" in caplog.text and "Await every task" in caplog.text, ended


def test_in_an_acked_group_a_receiver_killing_its_connection_is_charged_alone() -> None:
    """A group shares one transaction: a receiver that breaks the connection breaks it
    for the group, which is rolled back and run row by row; only its row is charged."""

    def record(evt: OrderPlaced) -> None:
        if evt.order_id == 1:
            kill_own_connection(evt)
        Delivered.objects.create(
            delivery_id=evt.order_id, receiver_key="t.group", event_id=evt.order_id, target=""
        )

    # A fixed wait: a jittered one may be short enough for this pass to try the row again.
    receiver(OrderPlaced, key="t.group", ack="batch", max_attempts=2, retry=Constant(3600))(record)
    for n in range(4):
        fire_one(OrderPlaced(order_id=n))
    counts = deliver_pending()
    assert (counts[DeliveryStatus.SUCCEEDED], counts[DeliveryStatus.FAILED]) == (3, 1)
    failed = DeliveryRecord.objects.get(status=DeliveryStatus.FAILED)
    assert failed.attempts == 1 and failed.event.payload["order_id"] == 1
    assert sorted(Delivered.objects.values_list("delivery_id", flat=True)) == [0, 2, 3]
