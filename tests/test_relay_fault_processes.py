"""Relay faults that need real processes (issue 10); a listener's need PostgreSQL.

Runs are counted in a file the receiver appends to outside any transaction, so a run
whose outcome was later lost still counts: "exactly once" here means executed once,
not only recorded once.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time

import pytest
from django.db import connection, transaction

from django_domain_events import DeliveryStatus, fire, notify_relay
from django_domain_events.delivery.wake import Listener
from django_domain_events.models import DeliveryRecord
from tests.app.events import Pinged
from tests.conftest import needs_postgresql, needs_several_relays, start_child, wait_for
from tests.procs.receivers import RUN_LOG_KEY, declare_run_logger, run_log_relay_env

pytestmark = pytest.mark.django_db(transaction=True)


def finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


@needs_several_relays
def test_d1_two_relays_with_a_short_lease_run_every_row_of_a_long_batch_once() -> None:
    """LEASE_SECONDS=1, one batch of 6 rows that each run 0.6 s (3.6 s in all): the rows
    lapse while they wait their turn, the second relay takes them over, and the first
    skips every row it no longer holds."""
    declare_run_logger()
    with transaction.atomic():
        for n in range(6):
            fire(Pinged(n=n))
    log, env = run_log_relay_env(0.6, LEASE_SECONDS=1, POLL_SECONDS=0.1)
    first = start_child("relay", "--batch-size", "6", env=env)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    wait_for(lambda: rows.filter(status=DeliveryStatus.CLAIMED).count() == 6, 30, "the claim")
    second = start_child("relay", "--batch-size", "6", env=env)
    try:
        wait_for(lambda: rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 6, 60, "all 6")
    finally:
        for process in (first, second):
            process.send_signal(signal.SIGTERM)
        outputs = [finish(process) for process in (first, second)]
    assert [code for code, _ in outputs] == [0, 0], outputs
    runs = log.read_text().split()
    assert sorted(runs) == sorted(str(pk) for pk in rows.values_list("id", flat=True)), runs
    assert set(rows.values_list("attempts", flat=True)) == {1}  # nobody was charged twice
    assert len(set(rows.values_list("claimed_by", flat=True))) == 2  # both relays ran rows


def test_d5_deliver_events_once_exits_non_zero_on_a_missing_column() -> None:
    declare_run_logger()
    with transaction.atomic():
        fire(Pinged(n=1))
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    # claimed_by, which every claim writes and no CHECK constraint names: MariaDB 10.11 now
    # and then refuses to rename a column a CHECK names ("Unknown column ... in 'CHECK'").
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN claimed_by TO claimed_by_x")
    try:
        process = start_child("relay", "--once", env={"DDE_RECEIVERS": "run_log"})
        code, output = finish(process, timeout=60)  # it stops: it does not retry for ever
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME COLUMN claimed_by_x TO claimed_by")
    assert code != 0, output
    assert "manage.py migrate" in output and "claimed_by" in output
    assert "Delivered:" not in output  # nothing that reads as success
    row = DeliveryRecord.objects.get()
    assert (row.status, row.attempts) == (DeliveryStatus.PENDING, 0)


@needs_postgresql
def test_d8_a_listener_that_lost_its_connection_listens_again_and_asks_for_a_pass() -> None:
    listener = Listener(connection.alias)
    assert listener.listen()
    pid = listener._connection.info.backend_pid
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        woke = [listener.wait(0.2) for _ in range(3)]
        assert woke[0] is False and True in woke  # the catch-up pass after listening again
        time.sleep(0.6)  # any coalescing window of earlier tests closes
        notify_relay()
        assert listener.wait(2.0)  # and it hears wake-ups again
    finally:
        listener.close()


@needs_postgresql
def test_d8_a_listen_that_fails_is_logged_once_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = Listener(connection.alias)
    listener.RETRY_SECONDS = 0.0
    port = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = "1"  # nothing listens there: connecting fails for real
    try:
        with caplog.at_level(logging.INFO, logger="django_domain_events"):
            assert listener.listen() is False
            assert listener.wait(0.05) is False
            assert listener.wait(0.05) is False
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1 and "cannot LISTEN" in warnings[0].getMessage()
            connection.settings_dict["PORT"] = port
            assert listener.wait(0.05) is True  # listening again: a catch-up pass
        assert "LISTENs for wake-ups again" in caplog.text
    finally:
        connection.settings_dict["PORT"] = port
        listener.close()
