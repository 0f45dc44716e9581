"""Message lifecycle: dead letters from the shell, a constant retry policy, a lifetime.

These chapters use ``deliver_pending(now=T)``, which (unlike ``drain_outbox()``)
respects backoff, so the waits between attempts are the policy's own.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

from django.core.management import call_command
from django.core.management.base import CommandError

from django_domain_events import (
    DeliveryStatus,
    dead_letters,
    deliver_pending,
    drain_outbox,
    outbox_health,
)
from django_domain_events.models import DeliveryRecord, EventRecord
from shop import events
from shop.models import Shipment
from shop.services import count_stock, dispatch_shipment

from .clock import SimClock, mask_times
from .scheduling import print_journal
from .story import Story

TRACKING_KEY = "shop.register_tracking"
STOCK_KEY = "shop.push_stock_to_marketplace"


def a_dead_letter_is_dumped(story: Story) -> None:
    """Dead letters from the shell: dump"""
    story.say("$ python manage.py dead_letters dump")
    lines = _command("dead_letters", "dump").splitlines()
    for line in lines:
        story.say(mask_times(line))
    story.say("(One JSON object per dead letter; its two timestamps are shown as <time> here,")
    story.say("so every run prints the same.)")
    story.expect(len(lines) == 1, f"dead_letters dump printed {len(lines)} lines, expected 1")
    record = json.loads(lines[0])
    story.expect(
        record["receiver"] == "shop.notify_crm" and record["attempts"] == 3,
        f"the dump should show the CRM's dead letter after 3 attempts, not {record}",
    )
    story.expect(
        record["last_error"] == "ConnectionError: CRM unreachable",
        f"the dump's last_error is {record['last_error']!r}",
    )


def the_dead_letter_is_retried(story: Story) -> None:
    """The cause is fixed and the dead letter retried"""
    events.CRM_REACHABLE = True
    story.say("The CRM is back (here: shop.events.CRM_REACHABLE = True; in life, a fix deployed).")
    story.say()
    story.say("$ python manage.py dead_letters retry")
    output = _command("dead_letters", "retry")
    for line in output.splitlines():
        story.say(line)
    story.expect(
        output.splitlines() == ["Total dead letters: 1", "Retrying: 1/1"],
        f"dead_letters retry printed {output!r}",
    )
    row = DeliveryRecord.objects.get(receiver_key="shop.notify_crm")
    story.say()
    story.say(
        f"Delivery #{row.pk} is {row.status} again with a fresh budget: attempts {row.attempts} "
        f"of {row.max_attempts}. drain_outbox():"
    )
    story.expect(
        (row.status, row.attempts) == (DeliveryStatus.PENDING, 0),
        f"the retried row is {row.status} after {row.attempts} attempts",
    )
    counts = drain_outbox()
    row.refresh_from_db()
    succeeded = counts[DeliveryStatus.SUCCEEDED]
    story.say(f"Delivered: {succeeded} succeeded. Delivery #{row.pk}: {row.status}.")
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 1 and row.status == DeliveryStatus.SUCCEEDED,
        f"the retried CRM delivery should succeed: {counts}, {row.status}",
    )
    story.expect(not dead_letters().exists(), "a dead letter is left after the retry")


def a_constant_retry_policy(story: Story) -> None:
    """A retry policy: Constant(10 minutes)"""
    shipment = Shipment.objects.filter(carrier="Northern Freight").earliest("id")
    dispatch_shipment(shipment)
    clock = story.clock = SimClock.start()
    row = DeliveryRecord.objects.get(receiver_key=TRACKING_KEY)
    story.say(
        f"dispatch_shipment(shipment #{shipment.pk}) fires ShipmentDispatched. {TRACKING_KEY} is"
    )
    story.say("declared retry=Constant(10 * 60): the carrier knows a parcel only once its depot")
    story.say("has scanned it, and asks callers to come back every ten minutes.")
    story.say("deliver_pending(now=...) respects backoff, so each step claims only what is due.")
    story.say()

    with clock.in_logs():
        steps = [(1, "attempt 1"), (6, None), (11, "attempt 2")]
        for minute, expected in steps:
            moment = clock.at(timedelta(minutes=minute))
            counts = deliver_pending(now=moment)
            row.refresh_from_db()
            label = clock.label(moment)
            if expected is None:
                story.say(f"{label}: deliver_pending(now={label}) claims nothing: the row waits.")
                story.expect(sum(counts.values()) == 0, f"{label}: a row ran early: {counts}")
                continue
            wait = row.available_at - moment
            story.say(
                f"{label}: {expected} {row.status}; next attempt at "
                f"{clock.label(row.available_at)}, {wait.total_seconds() / 60:g} minutes later"
            )
            story.expect(
                row.status == DeliveryStatus.FAILED and wait == timedelta(minutes=10),
                f"{label}: expected a failure and exactly 10 minutes' wait, got {row.status} "
                f"and {wait}",
            )
        story.say()
        events.CARRIER_SCANNED.add(shipment.pk)
        story.say(f"The depot scans parcel #{shipment.pk}.")
        moment = clock.at(timedelta(minutes=21))
        counts = deliver_pending(now=moment)
    print_journal(story, clock.label(moment))
    row.refresh_from_db()
    shipment.refresh_from_db()
    story.say(
        f"Delivery #{row.pk} {row.status} on attempt {row.attempts}. The waits were exactly 10 "
        "minutes each:"
    )
    story.say("Constant is not jittered (the default Exponential curve draws each wait at random).")
    story.expect(
        (row.status, row.attempts, counts[DeliveryStatus.SUCCEEDED])
        == (DeliveryStatus.SUCCEEDED, 3, 1)
        and shipment.tracking_code != "",
        f"the tracking registration should succeed on attempt 3: {row.status}, {row.attempts}",
    )


def a_message_lifetime(story: Story) -> None:
    """A message's lifetime: ttl=timedelta(hours=1)"""
    count = count_stock("north", "DE-KIT", 4)
    clock = story.clock = SimClock.start()
    row = DeliveryRecord.objects.get(receiver_key=STOCK_KEY)
    story.say(f"count_stock() records stock count #{count.pk} and fires StockCounted. {STOCK_KEY}")
    story.say("is declared ttl=timedelta(hours=1), retry=Constant(30 * 60): a count older than")
    story.say("an hour is superseded, so publishing it late would be worse than not at all.")
    story.say(
        f"Its row: due {clock.label(row.due_at)}, expires_at {clock.label(row.expires_at)}"
        if row.expires_at is not None
        else "Its row has no expires_at."
    )
    story.expect(
        row.expires_at is not None and row.expires_at - row.due_at == timedelta(hours=1),
        f"the row's lifetime should be one hour from its due time: {row.expires_at}",
    )
    story.say()
    with clock.in_logs():
        first = clock.at(timedelta(minutes=1))
        deliver_pending(now=first)
        row.refresh_from_db()
        story.say(
            f"{clock.label(first)}: attempt 1 {row.status}; next attempt at "
            f"{clock.label(row.available_at)}."
        )
        story.expect(row.status == DeliveryStatus.FAILED, f"attempt 1 left the row {row.status}")
        story.say("Then the relay is stopped for two hours (a deploy gone wrong).")
        later = clock.at(timedelta(hours=2))
        health = outbox_health(now=later)
        story.say(
            f"outbox_health(now={clock.label(later)}) already counts it dead "
            f"(owed={health.owed}, dead={health.dead}): still owed past its lifetime."
        )
        story.say(
            f"{clock.label(later)}: the relay is back, deliver_pending(now={clock.label(later)}):"
        )
        story.say()
        counts = deliver_pending(now=later)
    row.refresh_from_db()
    story.say()
    story.say(
        f"Delivery #{row.pk} is {row.status} after {row.attempts} attempt: claimed past its "
        "lifetime, it was"
    )
    story.say("dead-lettered without running the receiver again. Its last_error:")
    story.say(f"  {clock.relative(row.last_error)}")
    story.expect(
        counts[DeliveryStatus.DEAD] == 1
        and row.status == DeliveryStatus.DEAD
        and row.attempts == 1
        and row.last_error.startswith("expired:"),
        f"the row should die expired without running: {counts}, {row.status}, "
        f"{row.attempts}, {row.last_error!r}",
    )
    story.expect(
        (health.owed, health.dead) == (0, 1),
        f"outbox_health(now=+2h) should count the expired row dead: {health}",
    )


def dead_letters_are_purged(story: Story) -> None:
    """Dead letters are purged"""
    story.say("$ python manage.py dead_letters purge")
    try:
        _command("dead_letters", "purge")
    except CommandError as error:
        story.say(f"CommandError: {error}")
    else:
        story.expect(False, "dead_letters purge without a scope should be refused")
    story.say()
    story.say(f"$ python manage.py dead_letters purge --receiver {STOCK_KEY}")
    output = _command("dead_letters", "purge", "--receiver", STOCK_KEY)
    for line in output.splitlines():
        story.say(line)
    story.expect(output.strip() == "Purged: 1", f"dead_letters purge printed {output!r}")
    left = DeliveryRecord.objects.filter(receiver_key=STOCK_KEY).count()
    kept = EventRecord.objects.filter(name="shop.StockCounted").count()
    story.say(f"Delivery rows left for {STOCK_KEY}: {left}. The StockCounted event stays")
    story.say(f"in the log ({kept} row): only the dead delivery is gone.")
    story.expect(left == 0 and kept == 1, f"purge left {left} rows and {kept} events")
    story.expect(not dead_letters().exists(), "dead letters are left after the purge")


def _command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
