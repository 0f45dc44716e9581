"""The shop's write operations: the pattern to copy.

Each one changes the model and fires the event inside one ``transaction.atomic()``:
the event (and every delivery it owes) exists if and only if the change committed,
and an INLINE receiver that raises rolls both back.

Two of them answer a scheduled reaction that the world overtook: ``accept_offer()``
cancels the offer's pending expiry in the same transaction as the acceptance, and
``extend_offer()`` only moves the offer's time, which the expiry receiver notices and
answers with ``NotYet`` (firing an event there as well would keep the log honest about
why the time moved; ``NotYet`` is what keeps the work from being lost when that is
forgotten).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from django_domain_events import cancel_deliveries, fire

from .events import (
    OFFER_VALID_FOR,
    InvoiceIssued,
    NewsletterScheduled,
    OfferMade,
    OrderCancelled,
    OrderPaid,
    OrderPlaced,
    ShipmentDispatched,
    StockCounted,
)
from .models import Customer, Invoice, Newsletter, Offer, Order, Shipment, StockCount

CENT = Decimal("0.01")


def place_order(
    customer: Customer, total: Decimal | str, *, placed_at: datetime | None = None
) -> Order:
    """Create an order and record ``OrderPlaced``; ``ValueError`` if a receiver refuses it.

    ``placed_at`` (default now) is when the order was placed, for an import or a backfill;
    the event's ``occurred_at`` says the same.
    """
    amount = Decimal(total).quantize(CENT)
    placed_at = placed_at or timezone.now()
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=amount, placed_at=placed_at)
        fire(
            OrderPlaced(order_id=order.pk, customer_id=customer.pk, total=amount),
            occurred_at=placed_at,
        )
    return order


def pay_order(order: Order) -> Order:
    """Mark a placed order paid and record ``OrderPaid``."""
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order.pk)
        if order.status != Order.Status.PLACED:
            raise ValueError(f"order #{order.pk} is {order.status}; only a placed order is paid")
        order.status = Order.Status.PAID
        order.save(update_fields=["status"])
        fire(OrderPaid(order_id=order.pk))
    return order


def cancel_order(order: Order, reason: str) -> Order:
    """Cancel a placed order and record ``OrderCancelled`` with the reason."""
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order.pk)
        if order.status != Order.Status.PLACED:
            raise ValueError(f"order #{order.pk} is {order.status}; only a placed order cancels")
        order.status = Order.Status.CANCELLED
        order.save(update_fields=["status"])
        fire(OrderCancelled(order_id=order.pk, reason=reason))
    return order


# Scheduled reactions ------------------------------------------------------------------------


def make_offer(customer: Customer, item: str) -> Offer:
    """Offer ``item`` to a waitlisted customer for 48 hours and record ``OfferMade``.

    The event's id is kept on the offer, so accepting it can cancel the pending expiry.
    """
    made_at = timezone.now()
    with transaction.atomic():
        offer = Offer.objects.create(
            customer=customer, item=item, expires_at=made_at + OFFER_VALID_FOR
        )
        offer.made_event_id = fire(OfferMade(offer_id=offer.pk), occurred_at=made_at)
        offer.save(update_fields=["made_event_id"])
    return offer


def extend_offer(offer: Offer, hours: int) -> Offer:
    """Give the customer ``hours`` more; the pending expiry finds out when it runs."""
    with transaction.atomic():
        offer = Offer.objects.select_for_update().get(pk=offer.pk)
        if offer.accepted or offer.expired:
            raise ValueError(f"offer #{offer.pk} is closed; only an open offer is extended")
        offer.expires_at += timedelta(hours=hours)
        offer.save(update_fields=["expires_at"])
    return offer


def accept_offer(offer: Offer) -> dict[str, int]:
    """Accept an open offer and cancel its expiry in the same transaction.

    Returns what ``cancel_deliveries()`` reported: ``{"cancelled": n, "in_flight": m}``.
    A claimed expiry (in flight) is left to the receiver's own re-check of ``accepted``.
    """
    with transaction.atomic():
        offer = Offer.objects.select_for_update().get(pk=offer.pk)
        if offer.accepted or offer.expired or offer.made_event_id is None:
            raise ValueError(f"offer #{offer.pk} is closed; only an open offer is accepted")
        offer.accepted = True
        offer.save(update_fields=["accepted"])
        return cancel_deliveries([offer.made_event_id], receiver_key="shop.expire_offer")


def issue_invoice(customer: Customer, amount: Decimal | str) -> Invoice:
    """Issue an invoice and record ``InvoiceIssued``; a reminder is owed a fortnight later."""
    with transaction.atomic():
        invoice = Invoice.objects.create(customer=customer, amount=Decimal(amount).quantize(CENT))
        fire(InvoiceIssued(invoice_id=invoice.pk))
    return invoice


def pay_invoice(invoice: Invoice) -> Invoice:
    """Mark an invoice paid. Its reminder is not cancelled: it re-checks, and does nothing."""
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        invoice.paid = True
        invoice.save(update_fields=["paid"])
    return invoice


def schedule_newsletter(subject: str, send_at: datetime) -> Newsletter:
    """Schedule a newsletter for ``send_at`` (aware) and record ``NewsletterScheduled``."""
    with transaction.atomic():
        newsletter = Newsletter.objects.create(subject=subject, send_at=send_at)
        fire(NewsletterScheduled(newsletter_id=newsletter.pk, send_at=send_at))
    return newsletter


# Message lifecycle ---------------------------------------------------------------------------


def dispatch_shipment(shipment: Shipment) -> Shipment:
    """Hand a parcel to its carrier and record ``ShipmentDispatched``."""
    with transaction.atomic():
        shipment = Shipment.objects.select_for_update().get(pk=shipment.pk)
        shipment.dispatched = True
        shipment.save(update_fields=["dispatched"])
        fire(ShipmentDispatched(shipment_id=shipment.pk))
    return shipment


def count_stock(warehouse: str, sku: str, quantity: int) -> StockCount:
    """Record a warehouse's stock count and ``StockCounted``."""
    with transaction.atomic():
        count = StockCount.objects.create(warehouse=warehouse, sku=sku, quantity=quantity)
        fire(StockCounted(stock_count_id=count.pk, sku=sku, quantity=quantity))
    return count
