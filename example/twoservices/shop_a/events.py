"""The shop's event, published to the destination of this run."""

from dataclasses import dataclass

from django.conf import settings

from django_domain_events import event
from django_domain_events.contrib.brokers import publish


@event(name="shop.OrderPlaced")
@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    total_cents: int


publish(OrderPlaced, to=settings.DESTINATION)
