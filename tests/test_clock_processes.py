"""A relay whose host clock runs ahead judges leases and ticks by the database's clock
(issue 19, item 7): processes, on PostgreSQL and MariaDB.

The skewed child's ``django.utils.timezone.now`` runs 60 s ahead (``DDE_CLOCK_AHEAD``,
tests/procs/relay.py), the host clock every part of the package reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from django.db import connection, transaction

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord, ScheduleRecord, TickRecord
from tests.app.events import Pinged
from tests.conftest import needs_several_relays, start_child, wait_for
from tests.procs.receivers import RUN_LOG_KEY, declare_run_logger, run_log_relay_env
from tests.procs.recurring import MINUTELY_KEY

pytestmark = [pytest.mark.django_db(transaction=True), needs_several_relays]

AHEAD = {"DDE_CLOCK_AHEAD": "60"}


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def database_now() -> float:
    """The database's clock, in Unix seconds (the test process's clock on SQLite)."""
    sql = {
        "postgresql": "SELECT extract(epoch FROM clock_timestamp())",
        "mysql": "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) / 1e6",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return float(cursor.fetchone()[0])


def test_a_relay_whose_clock_runs_ahead_takes_over_no_live_lease() -> None:
    """Two rows run 10 s each under a 2 s lease kept alive by the heartbeat; a relay 60 s
    ahead sees those leases end in the past by its own clock, yet takes neither."""
    declare_run_logger()
    with transaction.atomic():
        for n in range(2):
            fire(Pinged(n=n))
    log, env = run_log_relay_env(10, LEASE_SECONDS=2, POLL_SECONDS=0.1)
    first = start_child("relay", "--concurrency", "2", env=env)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    try:
        wait_for(lambda: log.exists() and len(log.read_text().split()) == 2, 60, "both runs")
        ahead = start_child("relay", "--concurrency", "2", env={**env, **AHEAD})
        try:
            wait_for(lambda: rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 2, 90, "2")
        finally:
            code, output = finish(ahead)
    finally:
        first_code, first_output = finish(first)
    assert (first_code, code) == (0, 0), (first_output, output)
    runs = sorted(log.read_text().split())
    assert runs == sorted(str(pk) for pk in rows.values_list("id", flat=True)), runs
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert len(set(rows.values_list("claimed_by", flat=True))) == 1


def test_a_relay_whose_clock_runs_ahead_fires_no_tick_early() -> None:
    """A normal relay gives the minutely schedule its cursor; a relay 60 s ahead beside
    it must not fire the next tick before the database's clock reaches it."""
    env = {
        "DDE_RECEIVERS": "report",
        "DDE_SCHEDULE": "minutely",
        "DDE_SETTINGS_JSON": '{"POLL_SECONDS": 0.1}',
    }
    normal = start_child("relay", env=env)
    ahead = None
    try:
        cursor = ScheduleRecord.objects.filter(key=MINUTELY_KEY)
        wait_for(cursor.exists, 60, "the schedule's cursor")
        ready = f"/tmp/dde-clock-ready-{time.monotonic_ns()}"
        ahead = start_child("relay", env={**env, **AHEAD, "DDE_READY_FILE": ready})
        wait_for(lambda: os.path.exists(ready), 60, "the relay ahead to start")
        watched_until = time.monotonic() + 8
        while time.monotonic() < watched_until:
            now = database_now()
            ticks = [t.timestamp() for t in TickRecord.objects.values_list("tick", flat=True)]
            early = [t - now for t in ticks if t > now + 1]
            assert not early, f"ticks fired {early} s before their time"
            time.sleep(0.2)
    finally:
        outputs = [finish(p) for p in (normal, ahead) if p is not None]
    assert [code for code, _ in outputs] == [0] * len(outputs), outputs
