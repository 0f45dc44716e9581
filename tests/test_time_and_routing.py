"""Datetimes follow USE_TZ; every transaction the package opens uses the router's alias."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import DeliveryStatus, drain_outbox, fire, receiver
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered


@pytest.mark.django_db
def test_written_datetimes_follow_use_tz() -> None:
    receiver(OrderPlaced, key="t.tz")(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    drain_outbox()
    event = EventRecord.objects.get(pk=event_id)
    row = DeliveryRecord.objects.get(event_id=event_id)
    stamps = [event.occurred_at, event.recorded_at, row.due_at, row.claimed_at, row.succeeded_at]
    if settings.USE_TZ:
        assert all(timezone.is_aware(s) for s in stamps)
    else:
        assert all(timezone.is_naive(s) for s in stamps)
        # Naive local time, not UTC: Europe/Paris is ahead of UTC all year.
        assert abs(event.recorded_at - datetime.now()) < timedelta(minutes=1)


@pytest.mark.django_db
def test_an_aware_occurred_at_is_stored_in_the_projects_convention() -> None:
    moment = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1), occurred_at=moment)
    stored = EventRecord.objects.get(pk=event_id).occurred_at
    if settings.USE_TZ:
        assert stored == moment
    else:
        assert stored == datetime(2026, 6, 1, 14, 0)  # Paris summer time, naive


@pytest.mark.django_db
def test_a_naive_occurred_at_is_refused_only_under_use_tz() -> None:
    naive = datetime(2026, 6, 1, 12, 0)
    if settings.USE_TZ:
        with pytest.raises(TypeError, match="must be an aware datetime"), transaction.atomic():
            fire(OrderPlaced(order_id=1), occurred_at=naive)
        assert not EventRecord.objects.exists()
    else:
        with transaction.atomic():
            event_id = fire(OrderPlaced(order_id=1), occurred_at=naive)
        assert EventRecord.objects.get(pk=event_id).occurred_at == naive


class EventsRouter:
    """Sends the package's tables to the ``events`` database."""

    def _route(self, model: Any, **hints: Any) -> str | None:
        return "events" if model._meta.app_label == "django_domain_events" else None

    db_for_read = _route
    db_for_write = _route

    def allow_relation(self, a: Any, b: Any, **hints: Any) -> bool:
        return True


@pytest.mark.django_db(databases=["default", "events"], transaction=True)
@override_settings(DATABASE_ROUTERS=["tests.test_time_and_routing.EventsRouter"])
def test_every_transaction_uses_the_routers_alias() -> None:
    def record(evt: OrderPlaced, ctx: Any) -> None:
        Delivered.objects.using("events").create(
            delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, event_id=ctx.event_id
        )

    receiver(OrderPlaced, key="t.routed", takes_context=True)(record)
    with transaction.atomic(using="events"):
        event_id = fire(OrderPlaced(order_id=1))
    assert EventRecord.objects.using("events").filter(pk=event_id).exists()
    assert not EventRecord.objects.using("default").exists()
    counts = drain_outbox()
    assert counts[DeliveryStatus.SUCCEEDED] == 1
    row = DeliveryRecord.objects.using("events").get(event_id=event_id)
    assert row.status == DeliveryStatus.SUCCEEDED
    assert Delivered.objects.using("events").count() == 1


@pytest.mark.django_db(databases=["default", "events"], transaction=True)
@override_settings(DATABASE_ROUTERS=["tests.test_time_and_routing.EventsRouter"])
def test_a_rollback_on_the_routed_alias_leaves_no_event() -> None:
    receiver(OrderPlaced, key="t.routed")(lambda evt: None)
    with pytest.raises(RuntimeError), transaction.atomic(using="events"):
        fire(OrderPlaced(order_id=1))
        raise RuntimeError("change failed")
    assert not EventRecord.objects.using("events").exists()
    assert not DeliveryRecord.objects.using("events").exists()
