"""A relay's stop and its heartbeat are bounded (issue 19, item 8): ``shutdown_timeout``,
timeouts on the heartbeat's connection, every worker error reported, worker connections
recycled as ``CONN_MAX_AGE`` says."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_domain_events import DeliveryStatus, fire, receiver, run_relay
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import start_child, wait_for
from tests.procs.receivers import RUN_LOG_KEY, declare_run_logger, run_log_relay_env
from tests.support import command, fire_one

pytestmark = pytest.mark.django_db(transaction=True)

# Several rows at once, and the heartbeat, need a database server.
needs_server = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite runs one delivery at a time, unbeaten"
)


def backend_id() -> int:
    sql = (
        "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


@needs_server
def test_the_drain_at_a_stop_gives_up_after_the_shutdown_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    started: list[int] = []

    def hangs(evt: OrderPlaced, ctx: object) -> None:
        started.append(ctx.delivery_id)
        release.wait(120)

    receiver(OrderPlaced, key="t.hangs", takes_context=True)(hangs)
    for n in range(2):
        fire_one(OrderPlaced(order_id=n))
    stop = threading.Event()
    returned = threading.Event()

    def relay() -> None:
        try:
            run_relay(stop=stop, concurrency=2, prune=None, shutdown_timeout=1)
        finally:
            returned.set()
            connections.close_all()

    thread = threading.Thread(target=relay)
    thread.start()
    try:
        wait_for(lambda: len(started) == 2, 60, "both rows to start")
        stop.set()
        # Not released: without a bound the relay would wait for ever.
        assert returned.wait(60), "run_relay did not return within 60 s of the stop"
        rows = DeliveryRecord.objects.filter(receiver_key="t.hangs")
        assert set(rows.values_list("status", flat=True)) == {DeliveryStatus.CLAIMED}
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("shutdown timeout" in m and all(str(i) in m for i in started) for m in said), (
            said
        )
    finally:
        release.set()
        thread.join(60)


def test_sigterm_with_a_shutdown_timeout_ends_a_relay_whose_receiver_hangs() -> None:
    """One delivery at a time, the stop waits for the delivery in hand: no longer than
    ``--shutdown-timeout``, after which the relay exits and the row's lease lapses."""
    declare_run_logger()
    with transaction.atomic():
        fire(Pinged(n=1))
    log, env = run_log_relay_env(300, POLL_SECONDS=0.1)
    process = start_child("relay", "--shutdown-timeout", "1", env=env)
    try:
        wait_for(lambda: log.exists() and log.read_text().strip() != "", 60, "the run to start")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, out + err
    assert "did not stop within its shutdown timeout (1.0s)" in err, err
    row = DeliveryRecord.objects.get(receiver_key=RUN_LOG_KEY)
    assert row.status == DeliveryStatus.CLAIMED  # left to lapse: another relay takes it over


@needs_server
def test_every_worker_error_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    def slow(evt: OrderPlaced) -> None:
        time.sleep(0.3)

    receiver(OrderPlaced, key="t.slow")(slow)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(3)]
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    with connection.cursor() as cursor:  # the acknowledgement's column is gone
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN succeeded_at TO succeeded_gone")
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(Exception, match="manage.py migrate"):
            command("deliver_events", "--once", "--concurrency", "3")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME COLUMN succeeded_gone TO succeeded_at")
    deliveries = DeliveryRecord.objects.filter(receiver_key="t.slow").values_list("id", flat=True)
    said = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    named = [pk for pk in deliveries if f"delivery {pk}" in said]
    assert len(ids) == 3 and len(named) == 3, said


@needs_server
@pytest.mark.parametrize(("max_age", "most"), [(0, 2), (None, 2)])
def test_worker_connections_live_as_long_as_the_worker(
    monkeypatch: pytest.MonkeyPatch, max_age: int | None, most: int
) -> None:
    """Django's default CONN_MAX_AGE = 0 means "per request"; a worker serves rows, and a
    new connection per row would cost more than the row: one connection per worker."""
    seen: list[int] = []
    receiver(OrderPlaced, key="t.conn")(lambda evt: seen.append(backend_id()))
    for n in range(6):
        fire_one(OrderPlaced(order_id=n))
    monkeypatch.setitem(connections.settings[connection.alias], "CONN_MAX_AGE", max_age)
    run_relay(once=True, concurrency=2, prune=None)
    assert len(seen) == 6
    assert 1 <= len(set(seen)) <= most, seen


@needs_server
def test_a_worker_connection_older_than_a_positive_conn_max_age_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []

    def slow(evt: OrderPlaced) -> None:
        seen.append(backend_id())
        time.sleep(0.7)

    receiver(OrderPlaced, key="t.conn")(slow)
    for n in range(8):
        fire_one(OrderPlaced(order_id=n))
    monkeypatch.setitem(connections.settings[connection.alias], "CONN_MAX_AGE", 1)
    run_relay(once=True, concurrency=2, prune=None)
    assert len(seen) == 8
    assert len(set(seen)) >= 3, seen  # 2.8 s of rows per worker: renewed past 1 s


@needs_server
def test_a_renewal_the_database_does_not_answer_times_out_and_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The heartbeat's statement waits on a row lock this test holds: it must give up
    and say so, not hang and let every running lease lapse."""
    release = threading.Event()
    started = threading.Event()

    def waits(evt: OrderPlaced) -> None:
        started.set()
        release.wait(120)

    receiver(OrderPlaced, key="t.waits")(waits)
    fire_one(OrderPlaced(order_id=1))
    stop = threading.Event()
    settings = {"LEASE_SECONDS": 3}

    def relay() -> None:
        try:
            run_relay(stop=stop, once=True, prune=None)
        finally:
            connections.close_all()

    with override_settings(DJANGO_DOMAIN_EVENTS=settings):
        thread = threading.Thread(target=relay)
        thread.start()
        try:
            assert started.wait(60)
            with transaction.atomic():
                list(DeliveryRecord.objects.select_for_update().filter(receiver_key="t.waits"))
                wait_for(
                    lambda: any(
                        "Could not renew the lease" in r.getMessage() for r in caplog.records
                    ),
                    40,
                    "the heartbeat to give up on the locked row",
                )
        finally:
            release.set()
            stop.set()
            thread.join(60)
    row = DeliveryRecord.objects.get(receiver_key="t.waits")
    assert (row.status, row.attempts) == (DeliveryStatus.SUCCEEDED, 1)


def test_a_relay_that_fails_as_it_starts_gives_back_the_callers_signal_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever escapes a relay once it has taken SIGINT and SIGTERM, the caller's
    handlers come back: a shell's Ctrl-C must go on raising KeyboardInterrupt."""
    from django_domain_events.delivery import relay

    def fails(*args: object) -> None:
        raise RuntimeError("the start's log failed")

    monkeypatch.setattr(relay, "_log_start", fails)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="start's log"):
        run_relay(once=True, prune=None)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_relay_owning_its_process_switches_threads_every_millisecond() -> None:
    """A relay on the main thread runs with a 1 ms thread switch interval (its threads
    would otherwise wait up to 5 ms for each other at every database reply); the caller's
    comes back when it returns, and a relay on another thread leaves it alone."""
    import sys

    from django_domain_events.delivery.relay import SWITCH_INTERVAL_SECONDS

    seen: list[float] = []
    receiver(Pinged, key="t.interval")(lambda evt: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL_SECONDS  # Python's default, 5 ms

    fire_one(Pinged(n=1))
    run_relay(once=True, prune=None)
    fire_one(Pinged(n=2))
    elsewhere = threading.Thread(target=lambda: run_relay(once=True, prune=None))
    elsewhere.start()
    elsewhere.join(60)

    assert seen == [SWITCH_INTERVAL_SECONDS, before]
    assert sys.getswitchinterval() == before


def test_a_relay_whose_loop_raises_gives_back_the_callers_switch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever escapes a relay that owns its process, the caller's thread switch
    interval comes back with its signal handlers."""
    import sys

    from django_domain_events.delivery import relay

    def fails(*args: object) -> None:
        raise RuntimeError("the loop failed")

    monkeypatch.setattr(relay, "on_relay_loop", fails)
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="loop failed"):
        run_relay(once=True, prune=None)
    assert sys.getswitchinterval() == before
