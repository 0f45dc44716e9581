"""Receivers declared the same way in the test process and in its children."""

from __future__ import annotations

from django_domain_events import DeliveryContext, receiver
from tests.app.events import OrderPlaced
from tests.app.models import Delivered

RECORDER_KEY = "tests.record_order"


def record(evt: OrderPlaced, ctx: DeliveryContext) -> None:
    """Write one row per delivery; the unique delivery id makes a second run fail."""
    Delivered.objects.create(
        delivery_id=ctx.delivery_id,
        receiver_key=ctx.receiver_key,
        event_id=ctx.event_id,
        target=ctx.target,
    )


def declare_recorder() -> None:
    receiver(OrderPlaced, key=RECORDER_KEY, takes_context=True)(record)
