"""``async def`` receivers share one event loop per relay (issue 12).

At every concurrency, a relay runs its async receivers and async ``on_failure`` hooks on
one event loop kept for its life, so a module-level async client works across calls and
receivers; each delivery still keeps its own transaction, which its receiver's ORM calls
join. The tests read what the receivers recorded and the rows they left.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from django_domain_events import (
    DeliveryFailure,
    DeliveryStatus,
    PermanentFailure,
    deliver_pending,
    receiver,
    run_relay,
)
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered
from tests.conftest import start_child, wait_for
from tests.procs.receivers import (
    ASYNC_RUN_LOG_KEY,
    declare_async_run_logger,
    forget_client,
    run_log_relay_env,
    shared_client,
)
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)

needs_server = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite runs one delivery at a time"
)
# Concurrency 1 everywhere; above 1 on PostgreSQL and MariaDB only.
CONCURRENCIES = [1, pytest.param(4, marks=needs_server)]


@pytest.fixture(autouse=True)
def fresh_client() -> Iterator[None]:
    """Each test's relay makes its own module-level client on its own loop."""
    forget_client()
    yield
    forget_client()


class Calls:
    """What the async receivers saw: the loop each ran on (kept, so that no id is reused)
    and when each ran."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.spans: list[tuple[float, float]] = []

    def loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self.loops.append(loop)
        return loop

    def distinct_loops(self) -> int:
        return len({id(loop) for loop in self.loops})

    def most_at_once(self) -> int:
        starts = [(start, 1) for start, _ in self.spans]
        edges = sorted(starts + [(end, -1) for _, end in self.spans])
        now = most = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most


@pytest.mark.parametrize("concurrency", CONCURRENCIES)
def test_a_relays_async_receivers_run_on_one_loop_side_by_side(concurrency: int) -> None:
    calls = Calls()

    async def slow(evt: OrderPlaced, ctx: object) -> None:
        loop = calls.loop()
        started = time.monotonic()
        await asyncio.sleep(0.2)
        await Delivered.objects.acreate(
            delivery_id=ctx.delivery_id,
            receiver_key="t.slow",
            event_id=ctx.event_id,
            note=str(id(loop)),
        )
        calls.spans.append((started, time.monotonic()))

    receiver(OrderPlaced, key="t.slow", takes_context=True)(slow)
    for n in range(8):
        fire_one(OrderPlaced(order_id=n))
    counts = run_relay(once=True, concurrency=concurrency, prune=None)
    assert counts[DeliveryStatus.SUCCEEDED] == 8
    assert calls.distinct_loops() == 1
    assert len(set(Delivered.objects.values_list("note", flat=True))) == 1  # one loop id
    if concurrency > 1:
        assert 2 <= calls.most_at_once() <= concurrency


@pytest.mark.parametrize("concurrency", CONCURRENCIES)
def test_a_module_level_async_client_serves_every_delivery_of_a_relay(concurrency: int) -> None:
    """The client's background task and lock live on the loop it was made on."""

    async def call(evt: OrderPlaced, ctx: object) -> None:
        assert await shared_client().call(evt.order_id) == evt.order_id
        await asyncio.sleep(0.05)  # held in turn under the client's lock at concurrency 4

    receiver(OrderPlaced, key="t.client", takes_context=True, max_attempts=1)(call)
    for n in range(8):
        fire_one(OrderPlaced(order_id=n))
    counts = run_relay(once=True, concurrency=concurrency, prune=None)
    failed = DeliveryRecord.objects.exclude(status=DeliveryStatus.SUCCEEDED)
    assert counts[DeliveryStatus.SUCCEEDED] == 8, list(failed.values_list("last_error", flat=True))


@pytest.mark.parametrize("concurrency", CONCURRENCIES)
def test_an_async_receivers_orm_calls_join_its_deliverys_transaction(concurrency: int) -> None:
    """A write then a raise rolls the write back with the failed attempt; a write that
    succeeds commits with its acknowledgement. The write runs in the thread that holds the
    delivery's ``atomic()`` block: the relay's own at concurrency 1, its slot's above."""

    def where() -> str:
        return f"{connection.in_atomic_block} {threading.current_thread().name}"

    async def write(evt: OrderPlaced, ctx: object) -> None:
        await Delivered.objects.acreate(
            delivery_id=ctx.delivery_id,
            receiver_key="t.write",
            event_id=ctx.event_id,
            target=str(evt.order_id),
            note=await sync_to_async(where)(),
        )
        if evt.order_id % 2:
            raise ValueError(f"order {evt.order_id} refused")

    receiver(OrderPlaced, key="t.write", takes_context=True, max_attempts=3)(write)
    for n in range(6):
        fire_one(OrderPlaced(order_id=n))
    run_relay(once=True, concurrency=concurrency, prune=None)
    rows = DeliveryRecord.objects.order_by("event_id")
    assert [row.status for row in rows] == [DeliveryStatus.SUCCEEDED, DeliveryStatus.FAILED] * 3
    assert sorted(Delivered.objects.values_list("target", flat=True)) == ["0", "2", "4"]
    relay_thread = threading.current_thread().name if concurrency == 1 else "relay default"
    for note in Delivered.objects.values_list("note", flat=True):
        in_atomic, thread = note.split(" ", 1)
        assert in_atomic == "True"
        assert thread.startswith(relay_thread)


@pytest.mark.parametrize("concurrency", CONCURRENCIES)
def test_an_async_on_failure_hook_runs_on_the_relays_loop(concurrency: int) -> None:
    calls = Calls()

    async def refuse(evt: OrderPlaced) -> None:
        calls.loop()
        raise PermanentFailure("no")

    async def hook(failure: DeliveryFailure) -> None:
        calls.loop()
        await Delivered.objects.acreate(
            delivery_id=failure.delivery_id, receiver_key="t.hook", event_id=failure.event_id
        )

    receiver(OrderPlaced, key="t.refuse", on_failure=hook)(refuse)
    for n in range(4):
        fire_one(OrderPlaced(order_id=n))
    counts = run_relay(once=True, concurrency=concurrency, prune=None)
    assert counts[DeliveryStatus.DEAD] == 4
    assert Delivered.objects.filter(receiver_key="t.hook").count() == 4
    assert len(calls.loops) == 8
    assert calls.distinct_loops() == 1


@pytest.mark.parametrize("concurrency", CONCURRENCIES)
def test_a_relay_leaves_no_thread_behind_and_deliver_pending_still_runs_async_receivers(
    concurrency: int,
) -> None:
    """After a relay in this thread, ``deliver_pending()`` here runs async receivers as
    before: each call on a loop of its own, closed when it returns."""
    calls = Calls()

    async def note(evt: OrderPlaced) -> None:
        calls.loop()

    receiver(OrderPlaced, key="t.note")(note)
    before = {t for t in threading.enumerate() if "heartbeat" not in t.name}
    for n in range(4):
        fire_one(OrderPlaced(order_id=n))
    assert run_relay(once=True, concurrency=concurrency, prune=None)[DeliveryStatus.SUCCEEDED] == 4
    relay_loop = calls.loops[0]
    for n in range(2):
        fire_one(OrderPlaced(order_id=n))
    assert deliver_pending()[DeliveryStatus.SUCCEEDED] == 2
    assert relay_loop.is_closed()
    assert all(loop.is_closed() and loop is not relay_loop for loop in calls.loops[4:])
    wait_for(
        lambda: {t for t in threading.enumerate() if "heartbeat" not in t.name} <= before,
        10,
        "the relay's threads to end",
    )


@pytest.mark.parametrize("concurrency", ["1", pytest.param("4", marks=needs_server)])
def test_sigterm_finishes_the_async_receivers_in_hand_and_closes_the_loop_cleanly(
    concurrency: str,
) -> None:
    declare_async_run_logger()
    for n in range(20):
        fire_one(Pinged(n=n))
    log, env = run_log_relay_env(0.5, POLL_SECONDS=0.1)
    env["DDE_RECEIVERS"] = "async_run_log"
    env["PYTHONWARNINGS"] = "always"  # a coroutine never awaited would show on stderr
    in_hand = int(concurrency)
    relay = start_child("relay", "--concurrency", concurrency, env=env)
    try:
        wait_for(  # past the first round: the client's second calls are running
            lambda: log.exists() and len(log.read_text().splitlines()) > in_hand,
            30,
            f"{in_hand + 1} rows run",
        )
        relay.send_signal(signal.SIGTERM)
        out, err = relay.communicate(timeout=30)
    finally:
        if relay.poll() is None:  # hung: end it rather than leave it behind
            relay.kill()
            relay.communicate()
    assert relay.returncode == 0, out + err
    for trouble in ("Task was destroyed", "never awaited", "Event loop is closed", "Traceback"):
        assert trouble not in err, err
    runs = [line.split() for line in log.read_text().splitlines()]
    ran = [delivery_id for delivery_id, _ in runs]
    assert len(ran) == len(set(ran)) > in_hand  # no row twice
    assert len({loop_id for _, loop_id in runs}) == 1
    done = DeliveryRecord.objects.filter(
        receiver_key=ASYNC_RUN_LOG_KEY, status=DeliveryStatus.SUCCEEDED
    )
    assert sorted(map(str, done.values_list("id", flat=True))) == sorted(ran)  # all finished
