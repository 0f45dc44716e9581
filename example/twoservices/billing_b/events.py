"""Billing declares the shop's event under the shop's name, subscribes to it, and
opens an invoice per order (a unique column: an order recorded twice would fail)."""

from dataclasses import dataclass

from django.conf import settings

from django_domain_events import event, receiver
from django_domain_events.contrib.brokers import subscribe


@event(name="shop.OrderPlaced")
@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    total_cents: int


subscribe(settings.DESTINATION)


@receiver(OrderPlaced, key="billing.open_invoice")
def open_invoice(evt: OrderPlaced) -> None:
    from twoservices.billing_b.models import Invoice

    Invoice.objects.create(order_id=evt.order_id, total_cents=evt.total_cents)
