"""Several deliveries at once inside one relay (issue 12): ``concurrency``.

Speed is measured in bench/, not here: these tests assert what the rows and the
receivers' own records show.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management.base import CommandError
from django.db import connection

from django_domain_events import DeliveryStatus, receiver, run_relay
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered
from tests.support import command, fire_one

pytestmark = pytest.mark.django_db(transaction=True)

needs_server = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite runs one delivery at a time"
)


class Overlap:
    """How many receivers ran at the same moment, at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


@needs_server
def test_a_relay_with_concurrency_runs_rows_side_by_side_each_exactly_once() -> None:
    overlap = Overlap()

    def slow(evt: OrderPlaced, ctx: object) -> None:
        with overlap:
            time.sleep(0.2)
            Delivered.objects.create(
                delivery_id=ctx.delivery_id, receiver_key="t.slow", event_id=ctx.event_id
            )

    receiver(OrderPlaced, key="t.slow", takes_context=True)(slow)
    for n in range(12):
        fire_one(OrderPlaced(order_id=n))
    counts = run_relay(once=True, concurrency=4, prune=None)
    assert counts[DeliveryStatus.SUCCEEDED] == 12
    assert Delivered.objects.count() == 12  # unique delivery ids: none ran twice
    assert set(DeliveryRecord.objects.values_list("status", "attempts")) == {
        (DeliveryStatus.SUCCEEDED, 1)
    }
    assert 2 <= overlap.most <= 4


@needs_server
def test_a_lane_concurrency_applies_to_that_lane_only() -> None:
    overlaps = {"mail": Overlap(), "default": Overlap()}

    def record(lane: str):
        def run(evt: Pinged) -> None:
            with overlaps[lane]:
                time.sleep(0.15)

        return run

    receiver(Pinged, key="t.mail", lane="mail")(record("mail"))
    receiver(OrderPlaced, key="t.default")(record("default"))
    for n in range(6):
        fire_one(Pinged(n=n))
        fire_one(OrderPlaced(order_id=n))
    run_relay(once=True, lane=["default", "mail"], lane_concurrency={"mail": 3}, prune=None)
    assert overlaps["default"].most == 1
    assert 2 <= overlaps["mail"].most <= 3
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 12


@needs_server
@pytest.mark.parametrize("concurrency", ["1", "3"])
def test_an_acknowledgement_that_cannot_be_written_stops_the_relay_uncharged(
    concurrency: str,
) -> None:
    """The receiver ran, its acknowledgement failed: the package's error, not the row's."""

    def breaks(evt: OrderPlaced) -> None:
        return None

    receiver(OrderPlaced, key="t.breaks", max_attempts=2)(breaks)
    for n in range(6):
        fire_one(OrderPlaced(order_id=n))
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    with connection.cursor() as cursor:  # the acknowledgement's column is gone
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN succeeded_at TO succeeded_gone")
    try:
        with pytest.raises(CommandError, match="manage.py migrate"):
            command("deliver_events", "--once", "--concurrency", concurrency)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME COLUMN succeeded_gone TO succeeded_at")
    assert set(DeliveryRecord.objects.values_list("status", "attempts")) == {
        (DeliveryStatus.PENDING, 0)
    }


def test_concurrency_is_refused_on_sqlite_and_out_of_range_everywhere() -> None:
    if connection.vendor == "sqlite":
        with pytest.raises(CommandError, match="SQLite has a single writer"):
            command("deliver_events", "--once", "--concurrency", "2")
    with pytest.raises(CommandError, match="concurrency must be a whole number from 1 to 256"):
        command("deliver_events", "--once", "--concurrency", "0")
    with pytest.raises(CommandError, match="does not serve it"):
        command("deliver_events", "--once", "--lane-concurrency", "mail=2")
    with pytest.raises(CommandError, match="takes LANE=N"):
        command("deliver_events", "--once", "--lane-concurrency", "mail")


@needs_server
def test_sigterm_finishes_the_rows_in_hand_and_hands_back_the_rest() -> None:
    import signal

    from tests.conftest import start_child, wait_for
    from tests.procs.receivers import RUN_LOG_KEY, declare_run_logger, run_log_relay_env

    declare_run_logger()
    for n in range(20):
        fire_one(Pinged(n=n))
    log, env = run_log_relay_env(0.5, POLL_SECONDS=0.1)
    relay = start_child("relay", "--concurrency", "4", env=env)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    wait_for(lambda: log.exists() and len(log.read_text().split()) >= 4, 30, "4 rows running")
    relay.send_signal(signal.SIGTERM)
    out, err = relay.communicate(timeout=30)
    assert relay.returncode == 0, out + err
    ran = log.read_text().split()
    assert len(ran) == len(set(ran)) >= 4  # the rows in hand, no row twice
    done = rows.filter(status=DeliveryStatus.SUCCEEDED)
    assert sorted(map(str, done.values_list("id", flat=True))) == sorted(ran)  # all finished
    rest = rows.exclude(status=DeliveryStatus.SUCCEEDED)
    assert set(rest.values_list("status", "attempts")) == {(DeliveryStatus.PENDING, 0)}
