"""What every operations command does with bad arguments and a reader that stops early."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.management import CommandError

from django_domain_events import DeliveryStatus, drain_outbox, receiver
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import ROOT, child_env
from tests.support import command, failing, fire_one

pytestmark = pytest.mark.django_db

TOO_BIG = "99999999999999999999"  # more than a 64-bit signed column holds


@pytest.mark.parametrize(
    "args, flag",
    [
        (("prune_events", "--days", "-1"), "--days"),
        (("quiet_receivers", "--days", "0"), "--days"),
        (("prune_events", "--days", "nan"), "--days"),
        (("prune_events", "--days", "inf"), "--days"),
        (("prune_events", "--days", "1e12"), "--days"),
        (("prune_events", "--limit", TOO_BIG), "--limit"),
        (("prune_events", "--batch-size", TOO_BIG), "--batch-size"),
        (("quiet_receivers", "--days", "nan"), "--days"),
        (("quiet_receivers", "--days=-inf"), "--days"),
        (("quiet_receivers", "--days", "1e12"), "--days"),
        (("dead_letters", "purge", "--older-than", "nan"), "--older-than"),
        (("dead_letters", "purge", "--older-than", "inf"), "--older-than"),
        (("dead_letters", "purge", "--older-than", "1e12"), "--older-than"),
        (("dead_letters", "retry", "--limit", TOO_BIG), "--limit"),
        (("requeue_dead", "--limit", TOO_BIG), "--limit"),
        (("replay_events", TOO_BIG), "ID"),
        (("cancel_deliveries", TOO_BIG), "ID"),
    ],
)
def test_numbers_out_of_range_are_refused_with_what_to_give(args: tuple, flag: str) -> None:
    receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    with pytest.raises(CommandError) as refused:
        command(*args)
    message = str(refused.value)
    assert message.startswith(flag) and "must be" in message and " to " in message, message
    assert DeliveryRecord.objects.get().status == DeliveryStatus.DEAD  # nothing changed


def test_replay_and_cancel_refuse_a_receiver_that_does_not_listen_to_the_events() -> None:
    receiver(OrderPlaced, key="t.order")(lambda evt: None)
    receiver(Pinged, key="t.ping")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    with pytest.raises(CommandError, match=r"'t.ping'.*t\.order"):
        command("replay_events", str(event_id), "--receiver", "t.ping")
    with pytest.raises(CommandError, match=r"'t.ping'.*t\.order"):
        command("cancel_deliveries", str(event_id), "--receiver", "t.ping")
    assert DeliveryRecord.objects.get().status == DeliveryStatus.SUCCEEDED
    assert command("replay_events", str(event_id), "--receiver", "t.order") == (
        "reopened: 1, added: 0\n"
    )


def test_cancel_takes_the_key_of_a_row_whose_receiver_is_gone() -> None:
    from django_domain_events import registry

    receiver(OrderPlaced, key="t.gone")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    registry.forget("t.gone")
    out = command("cancel_deliveries", str(event_id), "--receiver", "t.gone")
    assert out == "cancelled: 1, in_flight: 0\n"


def test_dead_letters_refuse_an_event_name_that_cannot_match() -> None:
    receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    for action in ("dump", "purge"):
        with pytest.raises(CommandError, match=r"'unknown'.*testapp\.OrderPlaced"):
            command("dead_letters", action, "--event-name", "unknown")
    assert DeliveryRecord.objects.count() == 1
    EventRecord.objects.update(name="testapp.Retired")  # no longer declared, still logged
    assert '"event_name": "testapp.Retired"' in command(
        "dead_letters", "dump", "--event-name", "testapp.Retired"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args", [("events_status",), ("dead_letters", "dump"), ("schedules",)])
def test_a_reader_that_stops_early_ends_the_command_quietly(args: tuple) -> None:
    receiver(OrderPlaced, key="t.dlq", max_attempts=1)(failing)
    for n in range(3):
        fire_one(OrderPlaced(order_id=n))
    drain_outbox()
    child = subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        env={**child_env(), "PYTHONUNBUFFERED": ""},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # like `| head -0`: the reader is gone before the first line
    err = child.stderr.read()
    child.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert child.returncode in (0, 141), (child.returncode, err)
