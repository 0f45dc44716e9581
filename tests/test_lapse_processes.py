"""The lapse rule with real relay processes, on PostgreSQL and MariaDB (issue 19).

A receiver that ends its process (a segfault, an OOM kill, ``os._exit``) is the case the
rule exists for; it needs a real process that dies, and relays started again after it,
as a supervisor would. Runs are read from a log the receiver writes outside any
transaction, with start and end stamps, so "ran twice at the same time" is checked from
what ran, not from what was recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest
from django.db import transaction

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import Pinged
from tests.conftest import start_child, wait_for
from tests.procs.receivers import (
    BATCH_RUN_LOG_KEY,
    CRASH_KEY,
    declare_batch_run_logger,
    declare_crash_or_log,
    run_log_relay_env,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("DDE_TEST_DB", "sqlite") not in ("postgres", "postgresql", "mariadb"),
        reason="several rows at once: PostgreSQL and MariaDB (SQLite runs one at a time)",
    ),
]


def runs_from(log: Path) -> dict[int, list[tuple[float, float]]]:
    """Each delivery's runs as (start, end); a run its process died in ends when that
    process wrote ``exit``."""
    lines = [line.split() for line in log.read_text().splitlines()]
    died = {pid: float(at) for kind, _, pid, at in lines if kind == "exit"}
    started: dict[tuple[str, str], float] = {}
    runs: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for kind, pk, pid, at in lines:
        if kind == "start":
            started[(pk, pid)] = float(at)
        else:
            runs[int(pk)].append((started.pop((pk, pid)), float(at)))
    for (pk, pid), at in started.items():  # killed with its process
        runs[int(pk)].append((at, died[pid]))
    return runs


def test_a_row_that_kills_its_relay_dies_alone_after_its_attempts() -> None:
    """--concurrency 8, LEASE_SECONDS=2, 120 rows of 50 ms, one whose receiver ends its
    process on every attempt, the relay started again whenever it dies."""
    declare_crash_or_log()
    with transaction.atomic():
        for n in range(120):
            fire(Pinged(n=n))
    log = Path(tempfile.mkdtemp()) / "runs"
    env = {
        "DDE_RECEIVERS": "crash_or_log",
        "DDE_RUN_LOG": str(log),
        "DDE_SLOW_SECONDS": "0.05",
        "DDE_POISON_N": "40",
        "DDE_SETTINGS_JSON": json.dumps({"LEASE_SECONDS": 2, "POLL_SECONDS": 0.2}),
    }
    rows = DeliveryRecord.objects.filter(receiver_key=CRASH_KEY)
    poison = rows.get(event__payload__n=40)
    relay = start_child("relay", "--concurrency", "8", env=env)
    deaths = 0
    deadline = time.monotonic() + 240
    try:
        while rows.filter(status__in=("pending", "failed", "claimed")).exists():
            assert time.monotonic() < deadline, list(rows.values_list("status", "attempts"))
            if relay.poll() is not None:
                out, err = relay.communicate()
                assert relay.returncode == 3, out + err  # only the poison row ends it
                deaths += 1
                relay = start_child("relay", "--concurrency", "8", env=env)
            time.sleep(0.1)
    finally:
        relay.send_signal(signal.SIGTERM)
        try:
            relay.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            relay.kill()
    poison.refresh_from_db()
    assert (poison.status, poison.attempts) == (DeliveryStatus.DEAD, 3)
    assert "lease lapsed on attempt 3 of 3" in poison.last_error
    others = rows.exclude(pk=poison.pk)
    assert list(others.values_list("status", flat=True).distinct()) == [DeliveryStatus.SUCCEEDED]
    assert deaths == 3  # every death was the poison row's own attempt
    runs = runs_from(log)
    assert len(runs[poison.pk]) == 3
    for pk, spans in runs.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"delivery {pk} ran twice at once: {spans}"
    assert all(len(runs[pk]) >= 1 for pk in others.values_list("pk", flat=True))


def test_a_group_three_times_longer_than_its_lease_keeps_every_row() -> None:
    """ack="batch": 6 rows of 0.5 s in one commit under LEASE_SECONDS=1, a second relay
    waiting to take over: every row of the running group is kept alive, none charged."""
    declare_batch_run_logger()
    with transaction.atomic():
        for n in range(6):
            fire(Pinged(n=n))
    log, env = run_log_relay_env(0.5, LEASE_SECONDS=1, POLL_SECONDS=0.1)
    env["DDE_RECEIVERS"] = "batch_run_log"
    rows = DeliveryRecord.objects.filter(receiver_key=BATCH_RUN_LOG_KEY)
    first = start_child("relay", "--batch-size", "6", env=env)
    try:
        wait_for(lambda: rows.filter(status=DeliveryStatus.CLAIMED).count() == 6, 60, "the claim")
        second = start_child("relay", "--batch-size", "6", env=env)
        try:
            wait_for(lambda: rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 6, 60, "all")
        finally:
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert set(rows.values_list("attempts", flat=True)) == {1}  # nobody was charged
    assert sorted(log.read_text().split()) == sorted(
        str(pk) for pk in rows.values_list("pk", flat=True)
    )
