"""A relay publishing to NATS or Redis through its client in a child process
(``PUBLISHER_PROCESS``), with the machine's real brokers and real processes.

A child killed mid-stream is a broker outage: the batches it held are handed back
uncharged and sent again by the next child, and every row reaches the broker. A relay
killed leaves no child behind (the child reads its stdin to the end), and the next
relay publishes the rest."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_domain_events import deliver_pending, fire
from django_domain_events.contrib.brokers import publish
from django_domain_events.contrib.brokers.links import close_all
from django_domain_events.contrib.brokers.publisher_process import CHILD
from django_domain_events.models import DeliveryRecord
from tests import brokers
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import (
    children_of,
    needs_postgresql,
    needs_several_relays,
    running,
    start_child,
    stop_child,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 2_000
BATCH = 100


@pytest.fixture(params=["nats", "redis"])
def broker(request) -> Iterator[tuple[str, str, str]]:
    """(transport, url, destination) on a ``default`` broker publishing from a child (the
    default); the link closed and the destination removed after."""
    transport = request.param
    url = brokers.require(transport)
    to = brokers.new_destination()
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": {"URL": url}}}):
        yield transport, url, to
        close_all()
    brokers.remove(transport, url, to)


def fire_pings(count: int) -> None:
    with transaction.atomic():
        for n in range(count):
            fire(Pinged(n=n))


def owed_to_relay_processes(url: str, to: str, lease_seconds: float) -> dict[str, str]:
    """``ROWS`` events owed to ``to``, published as ``tests/procs/publisher.py`` declares
    it; the environment that relay process needs."""
    publish(OrderPlaced, to=to, max_attempts=100)
    with transaction.atomic():
        for n in range(ROWS):
            fire(OrderPlaced(order_id=n))
    return {"DDE_BROKER_URL": url, "DDE_PUBLISH_TO": to, "DDE_LEASE_SECONDS": str(lease_seconds)}


def published_rows():
    return DeliveryRecord.objects.filter(receiver_key__startswith="brokers:")


def assert_every_row_on_the_broker_once_charged(transport: str, url: str, to: str) -> list:
    """Every row acknowledged after one attempt and its message on the broker; what the
    broker holds."""
    rows = published_rows()
    assert set(rows.values_list("status", "attempts")) == {("succeeded", 1)}
    found = brokers.read(transport, url, to)
    assert {int(env.id.split(".")[1]) for _, env in found} == set(rows.values_list("id", flat=True))
    return found


def test_a_child_killed_mid_stream_is_an_outage_and_every_row_reaches_the_broker(broker):
    """SIGKILL to the child after 500 acknowledgements: the batches on their way are
    answered as an outage (handed back, no attempt charged), a new child is started at
    the next connection attempt, and the relay publishes the rest; the broker holds
    every row's message, the ones sent again at most the two batches the child held."""
    transport, url, to = broker
    publish(Pinged, to=to)
    fire_pings(ROWS)
    killed: list[int] = []

    def kill_the_child(done: int) -> None:
        if not killed and done >= 500:
            (child,) = children_of(os.getpid(), CHILD)
            os.kill(child, signal.SIGKILL)
            killed.append(child)

    assert brokers.relay_until_published(ROWS, kill_the_child, batch_size=BATCH) == ROWS

    assert killed and not running(killed[0])
    found = assert_every_row_on_the_broker_once_charged(transport, url, to)
    assert len(found) - ROWS <= 2 * BATCH  # NATS drops them by their id; Redis keeps them
    (new_child,) = children_of(os.getpid(), CHILD)
    assert new_child != killed[0]
    close_all()
    assert children_of(os.getpid(), CHILD) == []


def test_a_child_that_stops_answering_is_killed_and_its_batches_sent_by_the_next(broker):
    """SIGSTOP to the child after 500 acknowledgements: it neither answers nor reads its
    pipe, yet holds up only its own batches. Unanswered for ``CONFIRM_TIMEOUT_SECONDS``
    (+ 5 s), they are an outage (uncharged); the stopped child is killed within the
    link's close, and a new child publishes every row."""
    transport, url, to = broker
    entry = {"URL": url, "CONFIRM_TIMEOUT_SECONDS": 1, "RETRY_CONNECT_SECONDS": 0.1}
    stopped: list[int] = []

    def stop_the_child(done: int) -> None:
        if not stopped and done >= 500:
            (child,) = children_of(os.getpid(), CHILD)
            os.kill(child, signal.SIGSTOP)
            stopped.append(child)

    try:
        with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": entry}}):
            publish(Pinged, to=to)
            fire_pings(ROWS)
            assert brokers.relay_until_published(ROWS, stop_the_child, batch_size=BATCH) == ROWS
            (new_child,) = children_of(os.getpid(), CHILD)
            close_all()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    assert stopped and not running(stopped[0]) and new_child != stopped[0]
    found = assert_every_row_on_the_broker_once_charged(transport, url, to)
    assert len(found) - ROWS <= 2 * BATCH


@needs_several_relays
@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_a_relay_killed_leaves_no_child_and_the_next_relay_publishes_the_rest(
    broker, tmp_path, concurrency
):
    """``manage.py deliver_events`` SIGKILLed while publishing: its child sees its stdin
    end and exits by itself; the rows of the killed relay's batches come back when their
    lease lapses, and a second relay publishes them and the rest, its child stopped with
    it by SIGTERM. With ``--concurrency 4`` too: one child per relay, whatever its slots."""
    transport, url, to = broker
    env = owed_to_relay_processes(url, to, lease_seconds=3)
    output = tmp_path / "relays.log"
    rows = published_rows()
    try:
        args = ("--batch-size", str(BATCH), "--concurrency", concurrency)
        first = start_child("publisher", *args, env=env, output=output)
        try:
            wait_for(lambda: len(children_of(first.pid, CHILD)) == 1, 60, "the relay's child")
            (child,) = children_of(first.pid, CHILD)
            wait_for(lambda: rows.filter(status="succeeded").count() >= 300, 60, "300 published")
        finally:
            first.kill()
            first.wait(10)
        wait_for(lambda: not running(child), 10, f"the orphaned child {child} to exit")

        second = start_child("publisher", *args, env=env, output=output)
        try:
            wait_for(lambda: len(children_of(second.pid, CHILD)) == 1, 60, "its child")
            (second_child,) = children_of(second.pid, CHILD)
            wait_for(lambda: not rows.exclude(status="succeeded").exists(), 120, "the rest")
        finally:
            stop_child(second)
        wait_for(lambda: not running(second_child), 10, "the second relay's child to stop")
        assert second.returncode == 0
    finally:
        print(f"--- the relays' output\n{output.read_text(errors='replace')[-5000:]}")

    found = brokers.read(transport, url, to)
    assert {int(env.id.split(".")[1]) for _, env in found} == set(rows.values_list("id", flat=True))
    assert {r.status for r in rows} == {"succeeded"}


@needs_postgresql
def test_a_relay_stopped_past_its_lease_holding_locked_batches_goes_on(broker, tmp_path):
    """``manage.py deliver_events`` SIGSTOPped while its batches are locked (a backend of
    its idle in transaction), for longer than ``LEASE_SECONDS``: PostgreSQL ends those
    transactions. Resumed, the relay records what the broker confirmed, logs the lapsed
    lock, hands back the rest uncharged and publishes everything; it never stops."""
    transport, url, to = broker
    env = owed_to_relay_processes(url, to, lease_seconds=1)
    output = tmp_path / "relay.log"
    rows = published_rows()
    relay = start_child("publisher", "--batch-size", "20", env=env, output=output)
    try:
        wait_for(lambda: rows.filter(status="succeeded").count() >= 100, 60, "100 published")
        for _ in range(50):  # stop it at a moment it holds a batch locked
            relay.send_signal(signal.SIGSTOP)
            if _idle_in_transaction():
                break
            relay.send_signal(signal.SIGCONT)
        else:
            pytest.fail("the relay never held a batch locked when stopped")
        wait_for(lambda: not _idle_in_transaction(), 10, "PostgreSQL to end its transaction")
        relay.send_signal(signal.SIGCONT)
        wait_for(lambda: not rows.exclude(status="succeeded").exists(), 120, "every row")
        assert relay.poll() is None, "the relay stopped"
        stop_child(relay)
        assert relay.returncode == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            relay.send_signal(signal.SIGCONT)
        stop_child(relay)
        log = output.read_text(errors="replace")
        print(f"--- the relay's output\n{log[-5000:]}")
    assert "lapsed" in log and "LEASE_SECONDS" in log
    assert "will not fix" not in log and "Traceback" not in log
    found = brokers.read(transport, url, to)
    assert {int(env.id.split(".")[1]) for _, env in found} == set(rows.values_list("id", flat=True))
    assert {r.attempts for r in rows} == {1}  # the lapse charged nothing


def _idle_in_transaction() -> bool:
    """Whether a backend of the test database other than this one is idle in a
    transaction: here, the relay's lock on a batch."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
        )
        (count,) = cursor.fetchone()
    return bool(count)


def test_a_child_that_cannot_connect_is_one_outage_with_its_reason_and_leaves_no_child(caplog):
    """A broker refusing the connection: the child answers why and exits; the relay logs
    the outage once with that reason, charges nothing and starts a new child only at the
    next connection attempt."""
    url = "nats://127.0.0.1:1"
    broker = {"URL": url, "RETRY_CONNECT_SECONDS": 0.05, "CONNECT_TIMEOUT_SECONDS": 0.5}
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": broker}}):
        publish(Pinged, to="nowhere")
        fire_pings(1)
        with caplog.at_level(logging.ERROR, logger="django_domain_events.brokers"):
            deliver_pending()
            deliver_pending()
            assert children_of(os.getpid(), CHILD) == []
        close_all()

    (outage,) = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert "127.0.0.1:1" in outage and ("refused" in outage.lower() or "111" in outage), outage
    row = published_rows().get()
    assert (row.status, row.attempts, row.last_error) == ("pending", 0, "")


@pytest.mark.parametrize("in_child", [True, False])
def test_publisher_process_false_publishes_on_the_process_own_broker_thread(broker, in_child):
    """The option decides where the client runs; the messages are the same."""
    transport, url, to = broker
    entry = {"URL": url, "PUBLISHER_PROCESS": in_child}
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": entry}}):
        publish(Pinged, to=to)
        fire_pings(3)
        deliver_pending()
        children = children_of(os.getpid(), CHILD)  # the link stays open after a pass
        close_all()

    assert len(children) == (1 if in_child else 0)
    found = assert_every_row_on_the_broker_once_charged(transport, url, to)
    assert sorted(json.loads(env.data)["n"] for _, env in found) == [0, 1, 2]
