"""Seed 000: 'Nothing wakes the relay at a due time: an idle relay finds the row on its next
poll, so within POLL_SECONDS of it.' A real relay process on PostgreSQL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import transaction

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import Pinged
from tests.app.models import Delivered
from tests.conftest import ROOT, child_env, needs_postgresql, wait_for
from tests.scheduled.relay_child import WAKE_KEY, declare

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql]


def start_relay(poll_seconds: float, due_seconds: float) -> subprocess.Popen[str]:
    ready = Path(tempfile.mkdtemp()) / "ready"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "scheduled" / "relay_child.py")],
        env={
            **child_env(),
            "DDE_SETTINGS_JSON": json.dumps({"POLL_SECONDS": poll_seconds}),
            "DDE_DUE_SECONDS": str(due_seconds),
            "DDE_READY_FILE": str(ready),
        },
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(ready.exists, 30, "the relay to start")
    time.sleep(1.5)  # let it finish its first pass and sit idle, listening
    return process


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, out + err
    return out + err


def fire_ping() -> int:
    with transaction.atomic():
        event_id = fire(Pinged(n=1))
    assert event_id is not None
    return event_id


def test_an_idle_relay_delivers_a_scheduled_row_within_poll_seconds_of_its_due_time() -> None:
    """'an idle relay finds the row on its next poll, so within POLL_SECONDS of it. The NOTIFY a
    fire() sends on commit wakes the relay when the row is written, and it finds nothing due
    yet.'"""
    declare(2.0)
    process = start_relay(poll_seconds=0.5, due_seconds=2.0)
    try:
        event_id = fire_ping()
        time.sleep(1.0)
        early = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
        assert early.status == DeliveryStatus.PENDING  # woken, found nothing due yet
        assert early.attempts == 0 and early.claimed_at is None
        wait_for(lambda: Delivered.objects.exists(), 10, "the scheduled delivery")
    finally:
        output = stop(process)
    done = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
    assert done.status == DeliveryStatus.SUCCEEDED, output
    assert done.succeeded_at is not None
    lateness = (done.succeeded_at - done.due_at).total_seconds()
    assert 0 <= lateness <= 0.5 + 1.0, lateness  # POLL_SECONDS, and slack for a loaded host


def test_nothing_wakes_the_relay_at_the_due_time() -> None:
    """'Nothing wakes the relay at a due time: an idle relay finds the row on its next poll ...
    The NOTIFY a fire() sends on commit wakes the relay when the row is written, and it finds
    nothing due yet.' With a 4 s poll and a row due 1 s after the fire, the relay is woken at
    the fire (finding nothing), sleeps a full poll from there, and so delivers about 3 s late:
    not at the due time (~0 s), and not at the poll it would have made unwoken (~2 s)."""
    declare(1.0)
    process = start_relay(poll_seconds=4.0, due_seconds=1.0)
    try:
        event_id = fire_ping()
        wait_for(lambda: Delivered.objects.exists(), 15, "the scheduled delivery")
    finally:
        output = stop(process)
    done = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
    assert done.succeeded_at is not None, output
    lateness = (done.succeeded_at - done.due_at).total_seconds()
    assert 2.5 <= lateness <= 4.0 + 1.5, lateness
