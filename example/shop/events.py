"""The shop's events and every reaction to them, in one place.

django_domain_events imports this module at start-up (every installed app's
``events.py`` is autodiscovered), so declaring a receiver is all it takes to be owed
the events fired afterwards. Each receiver below shows one delivery mode:

=================================  =========  ===============================================
receiver                           mode       what it shows
=================================  =========  ===============================================
``shop.refuse_negative_total``     INLINE     runs inside ``fire()``'s transaction; raising
                                              vetoes the order: no order row, no event row
``shop.record_ledger_entry``       DURABLE    touches only this database, so its writes and
                                              the acknowledgement commit together: once
``shop.send_confirmation_email``   DURABLE    a side effect, delivered at least once
``shop.log_order_placed``          ON_COMMIT  best effort after commit; errors only logged
``shop.notify_warehouse``          DURABLE    fan-out: one row per warehouse (``targets=``)
``shop.reverse_ledger_entry``      DURABLE    a second event, a second ledger entry
``shop.notify_crm``                DURABLE    fails while the CRM is down (three attempts,
                                              then dead); succeeds once retried after a fix
=================================  =========  ===============================================

Scheduled reactions (``due=``), each re-checking current state when it runs:

=================================  ===============================================================
``shop.send_offer``                ``OfferMade``: mails the offer now
``shop.expire_offer``              ``OfferMade``, due 48 hours later: expires the offer, or answers
                                   ``NotYet`` when it was extended; cancelled when it is accepted
``shop.remind_unpaid_invoice``     ``InvoiceIssued``, due a fortnight later: a reminder, or nothing
                                   when the invoice was paid meanwhile
``shop.send_newsletter``           ``NewsletterScheduled``, due at the time the event names
=================================  ===============================================================

Message lifecycle:

===================================  =============================================================
``shop.register_tracking``           ``retry=Constant(10 * 60)``: retried every ten minutes exactly
``shop.push_stock_to_marketplace``   ``ttl=timedelta(hours=1)``: a stock count older than an hour
                                     is worthless, so the row dies ``expired:`` rather than run late
===================================  =============================================================

A recurring schedule (``@recurring``), fired by the relays, once per tick:

================================  ================================================================
``shop.nightly_sales_report``     at 03:00 in Paris, fires ``SalesReportDue`` for the day before
``shop.write_sales_report``       ``SalesReportDue``: writes that day's ``DailySalesReport``
================================  ================================================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.utils import timezone

from django_domain_events import (
    INLINE,
    ON_COMMIT,
    Constant,
    DeliveryContext,
    DeliveryFailure,
    NotYet,
    event,
    receiver,
    recurring,
)

from .models import (
    Customer,
    DailySalesReport,
    Email,
    Invoice,
    LedgerEntry,
    Newsletter,
    Offer,
    Order,
    Shipment,
)

logger = logging.getLogger(__name__)

# The warehouses a paid order is dispatched from, and the carrier each one books.
WAREHOUSES = {"north": "Northern Freight", "south": "Southern Post"}

# Stand-ins for the outside world, which the demo switches on and off between chapters.
CRM_REACHABLE = False  # the CRM is down until an operator fixes it
CARRIER_SCANNED: set[int] = set()  # shipments the carrier's depot has scanned
MARKETPLACE_REACHABLE = False  # the marketplace's stock API is down all day

# What the scheduled receivers did, oldest first: the demo prints it beside the simulated
# time after each drain, then clears it. An application would not need this.
JOURNAL: list[str] = []


# Events: facts, named in the past tense, carrying ids rather than model instances. ---------


@event
@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    customer_id: int
    total: Decimal


@event
@dataclass(frozen=True)
class OrderPaid:
    order_id: int


@event
@dataclass(frozen=True)
class OrderCancelled:
    order_id: int
    reason: str


# OrderPlaced ------------------------------------------------------------------------------


@receiver(OrderPlaced, mode=INLINE)
def refuse_negative_total(evt: OrderPlaced) -> None:
    """A veto: raising here rolls back ``place_order()``'s whole transaction."""
    if evt.total < 0:
        raise ValueError(f"an order total cannot be negative, and this one is {evt.total}")


@receiver(OrderPlaced)
def record_ledger_entry(evt: OrderPlaced) -> None:
    """Database-only: this row and the delivery's acknowledgement commit together."""
    LedgerEntry.objects.create(order_id=evt.order_id, amount=evt.total)


@receiver(OrderPlaced)
def send_confirmation_email(evt: OrderPlaced) -> None:
    """A side effect. A real mailer runs at least once: give it an idempotency key."""
    customer = Customer.objects.get(pk=evt.customer_id)
    Email.objects.create(
        to=customer.email,
        subject=f"Your order #{evt.order_id} ({evt.total}) is confirmed",
        sent_at=timezone.now(),
    )


@receiver(OrderPlaced, mode=ON_COMMIT)
def log_order_placed(evt: OrderPlaced) -> None:
    """Runs once the order has committed; never retried, so only for things that may be lost."""
    logger.info("order #%s committed (total %s)", evt.order_id, evt.total)


# OrderPaid: a fan-out, one delivery row per warehouse ----------------------------------------


def paid_order_warehouses(evt: OrderPaid, ctx: DeliveryContext) -> list[str]:
    """Resolved inside ``fire()``'s transaction: one row is written per name returned."""
    return list(WAREHOUSES)


@receiver(OrderPaid, targets=paid_order_warehouses, takes_context=True)
def notify_warehouse(evt: OrderPaid, ctx: DeliveryContext) -> None:
    """Each warehouse dispatches its part of the order: ``ctx.target`` says which one."""
    Shipment.objects.create(order_id=evt.order_id, carrier=WAREHOUSES[ctx.target])


# OrderCancelled ---------------------------------------------------------------------------


@receiver(OrderCancelled)
def reverse_ledger_entry(evt: OrderCancelled) -> None:
    """Book the refund: the opposite of the order's total."""
    order = Order.objects.get(pk=evt.order_id)
    LedgerEntry.objects.create(order=order, amount=-order.total)


def report_crm_failure(failure: DeliveryFailure) -> None:
    """Called after each failed attempt is recorded, outside the delivery's transaction."""
    print(
        f"  on_failure: {failure.receiver_key} attempt {failure.attempt} for "
        f"{failure.event_name} #{failure.event_id} raised {failure.error!r}; "
        f"the delivery is now {failure.status.value}"
    )


@receiver(OrderCancelled, key="shop.notify_crm", max_attempts=3, on_failure=report_crm_failure)
def notify_crm(evt: OrderCancelled) -> None:
    """The CRM is down until the operator fixes it: the delivery dies and is retried later."""
    if not CRM_REACHABLE:
        raise ConnectionError("CRM unreachable")
    logger.info("CRM told: order #%s was cancelled (%s)", evt.order_id, evt.reason)


# Scheduled reactions: a waitlist offer that expires ----------------------------------------

OFFER_VALID_FOR = timedelta(hours=48)


@event
@dataclass(frozen=True)
class OfferMade:
    offer_id: int


@receiver(OfferMade, key="shop.send_offer")
def send_offer(evt: OfferMade) -> None:
    """Now: mail the offer."""
    offer = Offer.objects.select_related("customer").get(pk=evt.offer_id)
    Email.objects.create(
        to=offer.customer.email,
        subject=f"Offer #{offer.pk}: the {offer.item} is yours if you accept within 48 hours",
        sent_at=timezone.now(),
    )
    JOURNAL.append(f"send_offer for offer #{offer.pk} ({offer.customer}) → mailed")


@receiver(OfferMade, key="shop.expire_offer", due=OFFER_VALID_FOR, takes_context=True)
def expire_offer(evt: OfferMade, ctx: DeliveryContext) -> None:
    """48 hours after the offer: expire it, unless the world moved on or the time moved later.

    ``ctx.due_at`` is when this row came due; the real clock is only the floor that lets a
    late run proceed, so the receiver behaves the same under a test's ``now=``.
    """
    offer = Offer.objects.get(pk=evt.offer_id)
    if offer.accepted:
        JOURNAL.append(f"expire_offer for offer #{offer.pk} → accepted, nothing to do")
        return  # the world moved on: nothing to do, and that is a success
    assert ctx.due_at is not None  # a durable delivery always has one
    if offer.expires_at > max(ctx.due_at, timezone.now()):
        JOURNAL.append(f"expire_offer for offer #{offer.pk} → NotYet: the offer was extended")
        raise NotYet(offer.expires_at, reason="the offer was extended")
    offer.expire()
    JOURNAL.append(f"expire_offer for offer #{offer.pk} → expired")


# Scheduled reactions: an invoice reminder a fortnight later --------------------------------

REMIND_AFTER = timedelta(days=14)


@event
@dataclass(frozen=True)
class InvoiceIssued:
    invoice_id: int


@receiver(InvoiceIssued, key="shop.remind_unpaid_invoice", due=REMIND_AFTER)
def remind_unpaid_invoice(evt: InvoiceIssued) -> None:
    """A fortnight after the invoice: remind, unless it was paid meanwhile."""
    invoice = Invoice.objects.select_related("customer").get(pk=evt.invoice_id)
    if invoice.paid:
        JOURNAL.append(
            f"remind_unpaid_invoice for invoice #{invoice.pk} → paid already, nothing to do "
            "(the world moved on; a success)"
        )
        return
    Email.objects.create(
        to=invoice.customer.email,
        subject=f"Reminder: invoice #{invoice.pk} ({invoice.amount}) is still unpaid",
        sent_at=timezone.now(),
    )
    JOURNAL.append(
        f"remind_unpaid_invoice for invoice #{invoice.pk} → reminder mailed to "
        f"{invoice.customer.email}"
    )


# Scheduled reactions: a newsletter at the time chosen when it was scheduled ----------------


@event
@dataclass(frozen=True)
class NewsletterScheduled:
    newsletter_id: int
    send_at: datetime


@receiver(NewsletterScheduled, key="shop.send_newsletter", due=lambda evt: evt.send_at)
def send_newsletter(evt: NewsletterScheduled) -> None:
    """At ``send_at``: one email per customer. Database-only, so it runs effectively once."""
    newsletter = Newsletter.objects.get(pk=evt.newsletter_id)
    now = timezone.now()
    customers = list(Customer.objects.order_by("id"))
    for customer in customers:
        Email.objects.create(to=customer.email, subject=newsletter.subject, sent_at=now)
    newsletter.sent_at = now
    newsletter.save(update_fields=["sent_at"])
    JOURNAL.append(f"send_newsletter #{newsletter.pk} → mailed to {len(customers)} customers")


# Message lifecycle: a constant retry policy --------------------------------------------------


@event
@dataclass(frozen=True)
class ShipmentDispatched:
    shipment_id: int


@receiver(ShipmentDispatched, key="shop.register_tracking", retry=Constant(10 * 60), max_attempts=4)
def register_tracking(evt: ShipmentDispatched) -> None:
    """The carrier knows a parcel only once its depot has scanned it, and asks callers to
    come back every ten minutes: ``Constant`` waits exactly that, without jitter."""
    shipment = Shipment.objects.get(pk=evt.shipment_id)
    if shipment.pk not in CARRIER_SCANNED:
        raise LookupError(f"{shipment.carrier} has not scanned parcel #{shipment.pk} yet")
    shipment.tracking_code = f"{shipment.carrier[:2].upper()}-{shipment.pk:05d}"
    shipment.save(update_fields=["tracking_code"])
    JOURNAL.append(f"register_tracking for shipment #{shipment.pk} → {shipment.tracking_code}")


# Message lifecycle: a lifetime ---------------------------------------------------------------


@event
@dataclass(frozen=True)
class StockCounted:
    stock_count_id: int
    sku: str
    quantity: int


@receiver(
    StockCounted,
    key="shop.push_stock_to_marketplace",
    ttl=timedelta(hours=1),
    retry=Constant(30 * 60),
)
def push_stock_to_marketplace(evt: StockCounted) -> None:
    """A stock count is worth publishing for an hour; after that a newer count supersedes it,
    so the row dies ``expired:`` rather than publish a stale figure late."""
    if not MARKETPLACE_REACHABLE:
        raise ConnectionError("marketplace stock API unreachable")
    logger.info("marketplace told: %s x %s", evt.quantity, evt.sku)


# A recurring schedule: a nightly sales report -----------------------------------------------

SHOP_ZONE = ZoneInfo("Europe/Paris")  # the shop's days are Paris days


@event
@dataclass(frozen=True)
class SalesReportDue:
    day: date


# Every night at 03:00 in Paris, whichever relay looks first fires this once. catch_up="all":
# after nights with no relay running, each missed night's report is still made, oldest first.
# (03:00, not 02:00: 02:00-02:59 does not exist in Paris on the last Sunday of March, so a
# job in that hour would have no tick that night, and no report of the Saturday.)
@recurring(
    cron="0 3 * * *", timezone="Europe/Paris", key="shop.nightly_sales_report", catch_up="all"
)
def nightly_sales_report(tick: datetime) -> SalesReportDue:
    """The report of the day before the tick: the day is read from the tick, never from
    the clock, so a report fired late or delivered after a retry covers the right day."""
    return SalesReportDue(day=tick.date() - timedelta(days=1))


@receiver(SalesReportDue)
def write_sales_report(evt: SalesReportDue) -> None:
    """Database-only, so it runs effectively once; a replay rewrites the same row."""
    start = datetime.combine(evt.day, datetime.min.time(), tzinfo=SHOP_ZONE)
    orders = list(
        Order.objects.filter(placed_at__gte=start, placed_at__lt=start + timedelta(days=1))
    )
    kept = [o for o in orders if o.status != Order.Status.CANCELLED]
    DailySalesReport.objects.update_or_create(
        day=evt.day,
        defaults={
            "orders": len(orders),
            "paid": sum(o.status == Order.Status.PAID for o in orders),
            "cancelled": len(orders) - len(kept),
            "sales": sum((o.total for o in kept), Decimal("0.00")),
            "written_at": timezone.now(),
        },
    )
