"""The first chapters: fire inside a transaction, a veto, the relay, and what it left behind."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.models import Count

from django_domain_events import DeliveryStatus, drain_outbox
from django_domain_events.models import DeliveryRecord, EventRecord
from shop.events import WAREHOUSES
from shop.models import Customer, Email, LedgerEntry, Order, Shipment
from shop.services import cancel_order, pay_order, place_order

from .story import Story

OWED = (DeliveryStatus.PENDING, DeliveryStatus.FAILED, DeliveryStatus.CLAIMED)


def fresh_database(story: Story) -> None:
    """A fresh database"""
    database = settings.DATABASES["default"]
    story.expect(
        database["ENGINE"] == "django.db.backends.sqlite3",
        "the demo deletes its database file, so it runs on SQLite only",
    )
    path = Path(database["NAME"])
    connections.close_all()
    for suffix in ("", "-journal", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    call_command("migrate", verbosity=0, interactive=False)
    story.say(f"Deleted {path.name} and ran migrate: every table is empty.")


def customers_sign_up(story: Story) -> None:
    """Customers sign up"""
    for name, email in [
        ("Ada", "ada@example.com"),
        ("Grace", "grace@example.com"),
        ("Alan", "alan@example.com"),
    ]:
        story.customers[name] = Customer.objects.create(name=name, email=email)
        story.say(f"{name} <{email}>")


def orders_are_placed(story: Story) -> None:
    """Orders are placed: the change and its event commit together"""
    story.say("place_order() creates the order and calls fire(OrderPlaced(...)) in one")
    story.say("transaction.atomic(). The ON_COMMIT receiver logs once the order has committed.")
    story.say()
    for name, total in [("Ada", "12.50"), ("Grace", "40.00"), ("Alan", "7.25")]:
        customer = story.customers[name]
        order = place_order(customer, Decimal(total))
        story.orders[name] = order
        event = EventRecord.objects.latest("id")
        story.say(f"Placed order #{order.pk} for {name} ({order.total})")
        story.say(f"  {_recorded(event)}")


def a_negative_order_is_refused(story: Story) -> None:
    """A negative order is refused: no order, no event"""
    orders, events = Order.objects.count(), EventRecord.objects.count()
    try:
        place_order(story.customers["Alan"], Decimal("-5.00"))
    except ValueError as error:
        story.say(f"place_order(Alan, -5.00) raised ValueError: {error}")
    else:
        story.expect(False, "the INLINE receiver shop.refuse_negative_total let -5.00 through")
    orders_after, events_after = Order.objects.count(), EventRecord.objects.count()
    story.say(
        f"Orders: {orders} before, {orders_after} after. Events: {events} before, "
        f"{events_after} after."
    )
    story.say("The INLINE receiver raised inside the transaction, so the order row, the")
    story.say("event row and its delivery rows were rolled back together.")
    story.expect(
        (orders_after, events_after) == (orders, events),
        "the vetoed order left rows behind",
    )


def orders_are_paid_and_cancelled(story: Story) -> None:
    """Orders are paid and cancelled"""
    for name in ("Ada", "Grace"):
        order = pay_order(story.orders[name])
        story.orders[name] = order
        event = EventRecord.objects.latest("id")
        story.say(f"Paid order #{order.pk} ({name})")
        story.say(f"  {_recorded(event)}")
    order = cancel_order(story.orders["Alan"], reason="changed his mind")
    story.orders["Alan"] = order
    event = EventRecord.objects.latest("id")
    story.say(f"Cancelled order #{order.pk} (Alan changed his mind)")
    story.say(f"  {_recorded(event)}")


def the_relay_delivers(story: Story) -> None:
    """The relay delivers what is owed"""
    owed = DeliveryRecord.objects.filter(status__in=OWED).count()
    story.say(
        f"Before: {_plural(owed, 'delivery', 'deliveries')} owed, "
        f"{_plural(LedgerEntry.objects.count(), 'ledger entry', 'ledger entries')}, "
        f"{_plural(Email.objects.count(), 'email')}, "
        f"{_plural(Shipment.objects.count(), 'shipment')}: nothing has run yet."
    )
    story.say("drain_outbox() runs the real delivery path and skips backoff, so the CRM")
    story.say("receiver spends its three attempts in this one call:")
    story.say()
    counts = drain_outbox()
    story.say()
    story.say(
        f"Delivered: {counts[DeliveryStatus.SUCCEEDED]} succeeded, "
        f"{counts[DeliveryStatus.DEAD]} dead "
        f"(after {_plural(counts[DeliveryStatus.FAILED], 'failed attempt')} that were retried)."
    )
    still_owed = DeliveryRecord.objects.filter(status__in=OWED).count()
    story.expect(still_owed == 0, f"{still_owed} deliveries are still owed after drain_outbox()")
    again = drain_outbox()
    story.say(
        f"A second drain_outbox() delivers {sum(again.values())}: a succeeded delivery "
        "is never run again."
    )
    story.expect(sum(again.values()) == 0, f"the second drain delivered {again}")


def what_happened(story: Story) -> None:
    """What the database holds now"""
    events = EventRecord.objects.values_list("name").annotate(n=Count("id")).order_by("name")
    story.say(f"Events recorded: {sum(n for _, n in events)}")
    for name, n in events:
        story.say(f"  {name:<24} {n}")

    story.say()
    by_status = Counter(DeliveryRecord.objects.values_list("status", flat=True))
    summary = ", ".join(f"{by_status[s]} {s}" for s in DeliveryStatus if by_status[s])
    story.say(f"Deliveries by status: {summary}")
    rows = (
        DeliveryRecord.objects.values_list("receiver_key", "status")
        .annotate(n=Count("id"))
        .order_by("receiver_key", "status")
    )
    for key, status, n in rows:
        story.say(f"  {key:<32} {n} {status}")

    story.say()
    story.say("Ledger entries (shop.record_ledger_entry, shop.reverse_ledger_entry):")
    for entry in LedgerEntry.objects.order_by("id"):
        story.say(f"  order #{entry.order_id}  {entry.amount:>+8}")
    balance = sum((e.amount for e in LedgerEntry.objects.all()), Decimal("0.00"))
    story.say(f"  balance   {balance:>8}")
    story.expect(
        LedgerEntry.objects.count()
        == EventRecord.objects.filter(name__in=["shop.OrderPlaced", "shop.OrderCancelled"]).count(),
        "a ledger entry is missing or was written twice",
    )

    story.say()
    story.say("Emails sent (shop.send_confirmation_email):")
    for email in Email.objects.order_by("id"):
        story.say(f"  to {email.to}: {email.subject}")

    story.say()
    story.say("Fan-out of shop.notify_warehouse, one delivery row per warehouse:")
    for warehouse, carrier in WAREHOUSES.items():
        statuses = Counter(
            DeliveryRecord.objects.filter(
                receiver_key="shop.notify_warehouse", target=warehouse
            ).values_list("status", flat=True)
        )
        orders = Shipment.objects.filter(carrier=carrier).order_by("order_id")
        booked = ", ".join(f"#{s.order_id}" for s in orders) or "none"
        rows_text = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        story.say(f"  {warehouse}: {rows_text}; {carrier} shipped orders {booked}")

    story.say()
    story.say("Dead letters (kept for an operator to retry or purge):")
    dead = DeliveryRecord.objects.filter(status=DeliveryStatus.DEAD).select_related("event")
    for row in dead.order_by("id"):
        story.say(
            f"  delivery #{row.pk}: {row.receiver_key} for {row.event.name} #{row.event_id} "
            f"(order #{row.event.payload.get('order_id')})"
        )
        story.say(
            f"    attempts {row.attempts} of {row.max_attempts}; last error: {row.last_error}"
        )
    story.expect(
        [row.receiver_key for row in dead] == ["shop.notify_crm"],
        "the only dead letter should be shop.notify_crm's",
    )


def _recorded(event: EventRecord) -> str:
    """``event #4 shop.OrderPaid, owing shop.a -> north, shop.a -> south`` for one event row."""
    owed = [
        f"{d.receiver_key} -> {d.target}" if d.target else d.receiver_key
        for d in event.deliveries.order_by("receiver_key", "target")
    ]
    return f"event #{event.pk} {event.name}, owing {', '.join(owed) or 'nothing'}"


def _plural(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
