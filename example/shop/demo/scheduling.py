"""Scheduled reactions: receivers declared with ``due=``, run later by moving the clock.

``drain_outbox()`` skips backoff but never a due time; ``drain_outbox(now=T)`` claims
as if it were ``T``, so a chapter can jump 48 hours or a fortnight ahead in a second.
The receivers themselves run on the real clock and compare with ``ctx.due_at``.
"""

from __future__ import annotations

from datetime import timedelta

from django_domain_events import DeliveryStatus, drain_outbox, outbox_health
from django_domain_events.models import DeliveryRecord
from shop import events
from shop.models import Email, Offer
from shop.services import (
    accept_offer,
    extend_offer,
    issue_invoice,
    make_offer,
    pay_invoice,
    schedule_newsletter,
)

from .clock import SimClock
from .story import Story

HOURS_48 = timedelta(hours=48)
HOURS_72 = timedelta(hours=72)

OFFERS = [("Ada", "Difference Engine kit"), ("Grace", "A-0 compiler manual"), ("Alan", "Bombe")]


def offers_are_made(story: Story) -> None:
    """Scheduled reactions: an offer now, its expiry in 48 hours"""
    story.say("make_offer() creates an offer and fires OfferMade in one transaction. Two")
    story.say("receivers are owed it: shop.send_offer now, and shop.expire_offer, declared")
    story.say("with due=timedelta(hours=48): its row is written now and claimed when due.")
    story.say()
    for name, item in OFFERS:
        story.offers[name] = make_offer(story.customers[name], item)
    clock = story.clock = SimClock.start()
    for name, offer in story.offers.items():
        rows = DeliveryRecord.objects.filter(event_id=offer.made_event_id).order_by("receiver_key")
        owed = ", ".join(f"{row.receiver_key} due {clock.label(row.due_at)}" for row in rows)
        story.say(f"Offer #{offer.pk} of the {offer.item} to {name} (event #{offer.made_event_id})")
        story.say(f"  owing {owed}")
    story.expect(
        [_expiry(o).due_at for o in story.offers.values()]
        == [o.expires_at for o in story.offers.values()],
        "each expiry row should be due exactly when its offer expires (occurred_at + 48h)",
    )

    story.say()
    story.say(f"{clock.label(clock.zero)}: drain_outbox() delivers what is due now:")
    counts = drain_outbox()
    print_journal(story, clock.label(clock.zero))
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 3 and sum(counts.values()) == 3,
        f"drain_outbox() should run the three send_offer deliveries only, not {counts}",
    )
    story.expect(
        all(_expiry(o).status == DeliveryStatus.PENDING for o in story.offers.values()),
        "drain_outbox() ran an expiry before its due time",
    )
    health = outbox_health()
    story.say()
    story.say(f"outbox_health(): scheduled={health.scheduled}, owed={health.owed}.")
    story.say("A row whose due time is ahead is work that has not arrived: it is counted as")
    story.say("scheduled, not owed, and never ages the backlog.")
    story.expect(
        (health.scheduled, health.owed) == (3, 0),
        f"outbox_health() should count 3 scheduled and 0 owed, not {health}",
    )


def an_offer_is_extended_another_accepted(story: Story) -> None:
    """One offer is extended, another accepted"""
    clock = _clock(story)
    grace = story.offers["Grace"] = extend_offer(story.offers["Grace"], hours=24)
    story.say(
        f"extend_offer(offer #{grace.pk}, hours=24): Grace's offer now expires at "
        f"{clock.label(grace.expires_at)}."
    )
    story.say(
        f"Its expiry row is still due at {clock.label(_expiry(grace).due_at)}: nothing told it. "
        "The receiver will notice."
    )
    story.say()
    alan = story.offers["Alan"]
    cancelled = accept_offer(alan)
    story.offers["Alan"] = alan = Offer.objects.get(pk=alan.pk)
    story.say(f"accept_offer(offer #{alan.pk}): Alan accepts, and in the same transaction")
    story.say(f'cancel_deliveries([{alan.made_event_id}], receiver_key="shop.expire_offer")')
    story.say(f"returned {cancelled}.")
    expiry = _expiry(alan)
    story.say(f"The expiry row is now {expiry.status}: no relay will ever claim it.")
    story.expect(
        cancelled == {"cancelled": 1, "in_flight": 0},
        f"cancelling a pending expiry returned {cancelled}",
    )
    story.expect(expiry.status == DeliveryStatus.CANCELLED, f"the expiry is {expiry.status}")
    health = outbox_health()
    story.say()
    story.say(
        f"outbox_health(): scheduled={health.scheduled}, owed={health.owed} "
        "(a cancelled row is settled, not counted)."
    )
    story.expect(
        (health.scheduled, health.owed) == (2, 0),
        f"outbox_health() should count 2 scheduled and 0 owed, not {health}",
    )


def forty_eight_hours_later(story: Story) -> None:
    """+48 hours: one offer expires, the extended one is not due yet"""
    clock = _clock(story)
    at_48 = clock.at(HOURS_48)
    ahead = outbox_health(now=at_48)
    story.say(
        f"Seen from then, outbox_health(now=+48h): scheduled={ahead.scheduled}, "
        f"owed={ahead.owed}. Both expiries have come due."
    )
    story.expect(
        (ahead.scheduled, ahead.owed) == (0, 2),
        f"at +48h both expiries should be owed, not {ahead}",
    )
    story.say("drain_outbox(now=+48h) claims them as if it were then:")
    story.say()
    counts = drain_outbox(now=at_48)
    print_journal(story, clock.label(at_48))
    story.say()
    ada, grace = (Offer.objects.get(pk=story.offers[n].pk) for n in ("Ada", "Grace"))
    row = _expiry(grace)
    story.say(
        f"Offer #{grace.pk}'s expiry answered NotYet({clock.label(grace.expires_at)}), so its row "
        f"is {row.status} again,"
    )
    story.say(
        f"due {clock.label(row.due_at)}, with attempts {row.attempts} and last_error "
        f"{row.last_error!r}: no attempt spent, no failure"
    )
    story.say("recorded, on_failure not called. The work moved later; nothing is lost.")
    story.expect(ada.expired, f"offer #{ada.pk} should have expired at +48h")
    story.expect(not grace.expired, f"the extended offer #{grace.pk} expired at +48h")
    story.expect(
        (row.status, row.attempts, row.last_error, row.due_at)
        == (DeliveryStatus.PENDING, 0, "", grace.expires_at),
        f"NotYet should leave the row pending, unspent and due at the new time: {row.__dict__}",
    )
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 1 and counts[DeliveryStatus.PENDING] == 1,
        f"drain_outbox(now=+48h) should report 1 succeeded and 1 rescheduled, not {counts}",
    )
    health = outbox_health()
    story.say(
        f"outbox_health() on the real clock: scheduled={health.scheduled}, owed={health.owed}."
    )
    story.expect(
        (health.scheduled, health.owed) == (1, 0),
        f"outbox_health() should count 1 scheduled and 0 owed, not {health}",
    )


def seventy_two_hours_later(story: Story) -> None:
    """+72 hours: the extended offer expires; the accepted one never ran"""
    clock = _clock(story)
    at_72 = clock.at(HOURS_72)
    counts = drain_outbox(now=at_72)
    print_journal(story, clock.label(at_72))
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 1 and sum(counts.values()) == 1,
        f"drain_outbox(now=+72h) should run only the extended expiry, not {counts}",
    )
    story.say()
    story.say("The three offers:")
    results = {}
    for name, offer in story.offers.items():
        offer = Offer.objects.get(pk=offer.pk)
        row = _expiry(offer)
        state = "accepted" if offer.accepted else "expired" if offer.expired else "open"
        results[name] = (state, row.status, row.attempts)
        story.say(
            f"  offer #{offer.pk} ({name}): {state}; expire_offer {row.status} after "
            f"{row.attempts} attempt{'s' if row.attempts != 1 else ''}"
        )
    story.expect(
        results
        == {
            "Ada": ("expired", DeliveryStatus.SUCCEEDED, 1),
            "Grace": ("expired", DeliveryStatus.SUCCEEDED, 1),
            "Alan": ("accepted", DeliveryStatus.CANCELLED, 0),
        },
        f"the offers ended otherwise: {results}",
    )
    health = outbox_health()
    story.say(f"outbox_health(): scheduled={health.scheduled}, owed={health.owed}.")
    story.expect((health.scheduled, health.owed) == (0, 0), f"nothing should be left, not {health}")


def an_invoice_reminder(story: Story) -> None:
    """An invoice reminder a fortnight later: one paid, one not"""
    ada = issue_invoice(story.customers["Ada"], "30.00")
    grace = issue_invoice(story.customers["Grace"], "45.00")
    clock = story.clock = SimClock.start()
    reminders = DeliveryRecord.objects.filter(receiver_key="shop.remind_unpaid_invoice")
    due = reminders.earliest("id").due_at
    story.say(
        f"Invoices #{ada.pk} (Ada, {ada.amount}) and #{grace.pk} (Grace, {grace.amount}) are "
        "issued. Each owes"
    )
    story.say(
        f"shop.remind_unpaid_invoice, declared due=timedelta(days={events.REMIND_AFTER.days}): "
        f"at {clock.label(due)}."
    )
    pay_invoice(ada)
    story.say(f"Ada pays invoice #{ada.pk}. Nothing cancels her reminder: it will re-check.")
    story.say()
    at_13 = clock.at(timedelta(days=13))
    early = drain_outbox(now=at_13)
    story.say(f"{clock.label(at_13)}: drain_outbox(now=+13d) delivers {sum(early.values())}.")
    story.expect(sum(early.values()) == 0, f"a reminder ran a day early: {early}")
    at_14 = clock.at(events.REMIND_AFTER)
    counts = drain_outbox(now=at_14)
    print_journal(story, clock.label(at_14))
    story.say()
    mailed = Email.objects.filter(subject__startswith="Reminder:").order_by("id")
    story.say(
        f"{counts[DeliveryStatus.SUCCEEDED]} deliveries succeeded: finding the invoice paid is "
        "a success that does nothing."
    )
    for email in mailed:
        story.say(f"  email to {email.to}: {email.subject}")
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 2 and sum(counts.values()) == 2,
        f"drain_outbox(now=+14d) should run both reminders, not {counts}",
    )
    story.expect(
        [e.to for e in mailed] == [story.customers["Grace"].email],
        "only Grace's unpaid invoice should be reminded",
    )


def a_newsletter_at_a_chosen_time(story: Story) -> None:
    """A newsletter sent at the time chosen when it was scheduled"""
    clock = story.clock = SimClock.start()
    send_at = clock.at(timedelta(days=7))
    newsletter = schedule_newsletter("The spring catalogue is out", send_at)
    row = DeliveryRecord.objects.get(receiver_key="shop.send_newsletter")
    story.say(
        f"schedule_newsletter(subject, send_at={clock.label(send_at)}) fires "
        "NewsletterScheduled. shop.send_newsletter is"
    )
    story.say(
        "declared due=lambda evt: evt.send_at, so its row is due at "
        f"{clock.label(row.due_at)}: the time the event names."
    )
    story.expect(row.due_at == send_at, f"the row is due at {row.due_at}, not at {send_at}")
    story.say()
    at_6 = clock.at(timedelta(days=6))
    early = drain_outbox(now=at_6)
    story.say(f"{clock.label(at_6)}: drain_outbox(now=+6d) delivers {sum(early.values())}.")
    story.expect(sum(early.values()) == 0, f"the newsletter went out early: {early}")
    counts = drain_outbox(now=send_at)
    print_journal(story, clock.label(send_at))
    newsletter.refresh_from_db()
    sent = Email.objects.filter(subject=newsletter.subject).count()
    story.expect(
        counts[DeliveryStatus.SUCCEEDED] == 1 and newsletter.sent_at is not None and sent == 3,
        f"the newsletter should go to 3 customers at {clock.label(send_at)}: {counts}, {sent}",
    )


def _clock(story: Story) -> SimClock:
    story.expect(story.clock is not None, "a scheduling chapter ran before the offers were made")
    assert story.clock is not None
    return story.clock


def _expiry(offer: Offer) -> DeliveryRecord:
    return DeliveryRecord.objects.get(
        event_id=offer.made_event_id, receiver_key="shop.expire_offer"
    )


def print_journal(story: Story, label: str) -> None:
    """Print what the scheduled receivers did since the last call, at ``label``."""
    for line in events.JOURNAL:
        story.say(f"{label}: {line}")
    events.JOURNAL.clear()
