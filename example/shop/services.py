"""The shop's write operations: the pattern to copy.

Each one changes the model and fires the event inside one ``transaction.atomic()``:
the event (and every delivery it owes) exists if and only if the change committed,
and an INLINE receiver that raises rolls both back.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from django_domain_events import fire

from .events import OrderCancelled, OrderPaid, OrderPlaced
from .models import Customer, Order

CENT = Decimal("0.01")


def place_order(customer: Customer, total: Decimal | str) -> Order:
    """Create an order and record ``OrderPlaced``; ``ValueError`` if a receiver refuses it."""
    amount = Decimal(total).quantize(CENT)
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=amount)
        fire(OrderPlaced(order_id=order.pk, customer_id=customer.pk, total=amount))
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
