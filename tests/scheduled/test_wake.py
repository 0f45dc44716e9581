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
from django.db import connection, transaction
from django.utils import timezone

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import Pinged
from tests.app.models import Delivered
from tests.conftest import ROOT, child_env, needs_postgresql, relay_listening, wait_for
from tests.scheduled.relay_child import WAKE_KEY, declare

pytestmark = pytest.mark.django_db(transaction=True)


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
    if connection.vendor == "postgresql":
        wait_for(relay_listening, 30, "the relay to finish its first pass and listen")
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


def test_an_idle_relay_delivers_a_scheduled_row_by_polling_after_its_due_time() -> None:
    """'an idle relay finds the row on its next poll, so within POLL_SECONDS of it. The NOTIFY a
    fire() sends on commit wakes the relay when the row is written, and it finds nothing due
    yet.' Checked by the row's state, with one-sided bounds a loaded host cannot break:
    before its due time the row is untouched, and it is never delivered before that time;
    with nothing else to wake the relay, its poll delivers it within a generous ceiling."""
    declare(2.0)
    process = start_relay(poll_seconds=0.5, due_seconds=2.0)
    try:
        event_id = fire_ping()
        time.sleep(1.0)
        early = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
        if timezone.now() < early.due_at:  # woken by the fire, it found nothing due yet
            assert early.status == DeliveryStatus.PENDING
            assert early.attempts == 0 and early.claimed_at is None
        wait_for(lambda: Delivered.objects.exists(), 30, "the scheduled delivery")
    finally:
        output = stop(process)
    done = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
    assert done.status == DeliveryStatus.SUCCEEDED, output
    assert done.succeeded_at is not None and done.claimed_at is not None
    assert done.claimed_at >= done.due_at  # never before its due time
    assert done.attempts == 1


@needs_postgresql
def test_nothing_wakes_the_relay_at_the_due_time() -> None:
    """'Nothing wakes the relay at a due time: an idle relay finds the row on its next poll ...
    The NOTIFY a fire() sends on commit wakes the relay when the row is written, and it finds
    nothing due yet.' With an 8 s poll and a row due 3 s after the fire, the relay is woken at
    the fire (finding nothing) and sleeps a full poll from there: well after the due time
    the row is still untouched, checked by its state, and the poll delivers it later."""
    declare(3.0)
    process = start_relay(poll_seconds=8.0, due_seconds=3.0)
    try:
        event_id = fire_ping()
        row = DeliveryRecord.objects.get(event_id=event_id, receiver_key=WAKE_KEY)
        # Look 2.5 s after the due time: a relay woken at the due time would have run it by
        # then; this one is still asleep. A loaded host only makes the relay later.
        time.sleep(max(0.0, (row.due_at - timezone.now()).total_seconds()) + 2.5)
        waiting = DeliveryRecord.objects.get(pk=row.pk)
        assert waiting.status == DeliveryStatus.PENDING and waiting.claimed_at is None
        assert not Delivered.objects.exists()
        wait_for(lambda: Delivered.objects.exists(), 30, "the scheduled delivery")
    finally:
        output = stop(process)
    done = DeliveryRecord.objects.get(pk=row.pk)
    assert done.status == DeliveryStatus.SUCCEEDED, output
    assert done.claimed_at is not None and done.claimed_at >= done.due_at
