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
``shop.notify_crm``                DURABLE    always fails; three attempts, then dead
=================================  =========  ===============================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal

from django.utils import timezone

from django_domain_events import (
    INLINE,
    ON_COMMIT,
    DeliveryContext,
    DeliveryFailure,
    event,
    receiver,
)

from .models import Customer, Email, LedgerEntry, Order, Shipment

logger = logging.getLogger(__name__)

# The warehouses a paid order is dispatched from, and the carrier each one books.
WAREHOUSES = {"north": "Northern Freight", "south": "Southern Post"}


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
    """The CRM is down for the whole demo: this delivery ends as a dead letter."""
    raise ConnectionError("CRM unreachable")
