"""A rolling deploy (issue 19, item 2): a relay never ends a row whose receiver it does
not declare while a relay of another release may declare it. Such rows wait, unclaimed
and uncharged, shown as not declared by this relay, until ``ORPHAN_AFTER_SECONDS`` after
they came due or until an operator orphans them."""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    deliver_one,
    drain_outbox,
    fire,
    outbox_health,
    receiver,
    run_relay,
)
from django_domain_events.declare import registry
from django_domain_events.models import DeliveryRecord
from django_domain_events.operations import orphan_undeclared
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered
from tests.conftest import start_child, wait_for
from tests.procs.receivers import (
    RECORDER_KEY,
    declare_recorder,
    declare_run_logger,
    run_log_relay_env,
)
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)


def fired_by_the_new_release(n: int = 1) -> list[int]:
    """Rows of ``t.new``, a receiver the new release declares and this process (the
    previous release's relay) does not."""
    receiver(OrderPlaced, key="t.new")(lambda evt: None)
    ids = [fire_one(OrderPlaced(order_id=i)) for i in range(n)]
    registry.forget("t.new")
    return ids


def test_a_relay_leaves_rows_it_does_not_declare_unclaimed_and_uncharged() -> None:
    fired_by_the_new_release(3)
    # --once ends only when a pass claims nothing: a relay that claimed and handed the
    # rows back, pass after pass, would never end here.
    counts = run_relay(once=True, prune=None)
    assert counts[DeliveryStatus.ORPHANED] == 0
    rows = DeliveryRecord.objects.all()
    assert set(rows.values_list("status", "attempts", "claimed_by")) == {("pending", 0, "")}


def test_a_direct_attempt_hands_an_undeclared_row_back_unrun() -> None:
    (event_id,) = fired_by_the_new_release()
    pk = DeliveryRecord.objects.get(event_id=event_id).pk
    assert deliver_one(pk) is None
    row = DeliveryRecord.objects.get(pk=pk)
    assert (row.status, row.attempts) == (DeliveryStatus.PENDING, 0)


def test_undeclared_rows_are_orphaned_once_their_wait_is_over() -> None:
    fired_by_the_new_release(2)
    assert drain_outbox(now=timezone.now() + timedelta(minutes=59))[DeliveryStatus.ORPHANED] == 0
    later = timezone.now() + timedelta(hours=1, seconds=1)
    assert drain_outbox(now=later)[DeliveryStatus.ORPHANED] == 2


@override_settings(DJANGO_DOMAIN_EVENTS={"ORPHAN_AFTER_SECONDS": 60})
def test_the_wait_is_a_setting() -> None:
    fired_by_the_new_release()
    later = timezone.now() + timedelta(seconds=61)
    assert drain_outbox(now=later)[DeliveryStatus.ORPHANED] == 1


def test_health_and_events_status_show_rows_not_declared_by_this_relay() -> None:
    fired_by_the_new_release(2)
    health = outbox_health()
    (backlog,) = [r for r in health.receivers if r.key == "t.new"]
    assert (backlog.owed, backlog.declared) == (2, False)
    assert health.undeclared == 2
    out = StringIO()
    call_command("events_status", stdout=out)
    assert "receiver t.new: owed=2" in out.getvalue()
    assert "(not declared by this relay)" in out.getvalue()


def test_an_operator_orphans_undeclared_rows_at_once() -> None:
    declare_recorder()
    kept = fire_one(OrderPlaced(order_id=9))
    fired_by_the_new_release(2)
    with pytest.raises(ValueError, match="declared here"):
        orphan_undeclared([RECORDER_KEY])
    out = StringIO()
    call_command("orphan_undeclared", "--receiver", "t.new", stdout=out)
    assert out.getvalue().strip() == "orphaned: 2"
    orphaned = DeliveryRecord.objects.filter(receiver_key="t.new")
    assert set(orphaned.values_list("status", flat=True)) == {DeliveryStatus.ORPHANED}
    assert "by an operator" in orphaned.first().last_error
    assert DeliveryRecord.objects.get(event_id=kept).status == DeliveryStatus.PENDING
    with pytest.raises(CommandError, match="declared here"):
        call_command("orphan_undeclared", "--receiver", RECORDER_KEY)


def test_a_relay_of_the_previous_release_leaves_the_new_receivers_rows_to_the_new_relay() -> None:
    """The previous release's relay runs (it declares only the run logger) while the new
    release fires 30 events for its new receiver (the recorder); then the new relay
    starts. Every new row succeeds, none is orphaned, none is charged."""
    declare_run_logger()
    log, env = run_log_relay_env(0, POLL_SECONDS=0.1)
    old = start_child("relay", env=env)
    new = None
    try:
        declare_recorder()  # the new release, firing
        with transaction.atomic():
            for n in range(30):
                fire(OrderPlaced(order_id=n))
            for n in range(3):
                fire(Pinged(n=n))
        logged = DeliveryRecord.objects.exclude(receiver_key=RECORDER_KEY)
        wait_for(
            lambda: set(logged.values_list("status", flat=True)) == {DeliveryStatus.SUCCEEDED},
            60,
            "the old relay to run the rows it declares",
        )
        time.sleep(1)  # passes of the old relay over the new rows (it polls every 0.1 s)
        rows = DeliveryRecord.objects.filter(receiver_key=RECORDER_KEY)
        assert set(rows.values_list("status", "attempts", "claimed_by")) == {("pending", 0, "")}
        if connection.vendor == "sqlite":  # one relay per SQLite file: a stop, then a start
            stop(old)
        new = start_child("relay", env={"DDE_SETTINGS_JSON": '{"POLL_SECONDS": 0.1}'})
        wait_for(
            lambda: rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 30,
            60,
            "the new relay to run the new rows",
        )
    finally:
        outputs = [stop(process) for process in (old, new) if process is not None]
    assert all(code == 0 for code, _ in outputs), outputs
    assert set(rows.values_list("status", "attempts")) == {(DeliveryStatus.SUCCEEDED, 1)}
    assert Delivered.objects.filter(receiver_key=RECORDER_KEY).count() == 30
    assert not DeliveryRecord.objects.filter(status=DeliveryStatus.ORPHANED).exists()
    assert sorted(log.read_text().split()) == sorted(
        str(pk) for pk in logged.values_list("id", flat=True)
    )


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return process.returncode, out + err


def test_the_dashboard_shows_a_receiver_not_declared_by_this_relay(admin_client: Any) -> None:
    fired_by_the_new_release(2)
    url = reverse("admin:django_domain_events_deliveryrecord_dashboard")
    page = admin_client.get(url).content.decode()
    row = page[page.index('data-receiver="t.new"') :]
    assert "not declared by this relay" in row[: row.index("</tr>")]
