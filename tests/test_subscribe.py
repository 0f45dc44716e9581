"""subscribe(): what it declares and what it refuses, without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings

from django_domain_events.contrib.brokers import subscribe
from django_domain_events.inbox import forget, subscriptions
from tests.app.events import OrderPlaced, OrderShipped


@pytest.fixture(autouse=True)
def forgotten() -> Iterator[None]:
    before = {s.name for s in subscriptions()}
    yield
    for declared in subscriptions():
        if declared.name not in before:
            forget(declared.name)


@override_settings(DJANGO_DOMAIN_EVENTS={"EVENT_SOURCE": "billing"})
def test_the_default_name_is_this_service_and_the_source() -> None:
    declared = subscribe("orders")
    assert declared.name == "billing.orders" and declared.broker == "default"
    assert declared.events is None and declared.batch_size == 100
    assert declared.options == {"ack_wait_seconds": 30.0}


def test_events_by_class_take_their_declared_names_and_a_mapping_renames() -> None:
    by_class = subscribe("orders", name="t.a", events=[OrderShipped])
    assert by_class.events == {"testapp.OrderShipped": OrderShipped}
    mapped = subscribe("orders", name="t.b", events={"com.shop.placed": OrderPlaced})
    assert mapped.events == {"com.shop.placed": OrderPlaced}


def test_the_same_declaration_twice_is_one_and_a_clash_is_refused() -> None:
    subscribe("orders", name="t.same", ttl=timedelta(hours=1))
    subscribe("orders", name="t.same", ttl=timedelta(hours=1))
    with pytest.raises(ValueError, match="already declared"):
        subscribe("invoices", name="t.same")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"events": [int]}, TypeError, "takes @event classes"),
        ({"events": []}, ValueError, "is empty"),
        ({"ttl": 5}, ValueError, "positive timedelta"),
        ({"max_bytes": 0}, ValueError, "max_bytes"),
        ({"batch_size": True}, ValueError, "batch_size"),
        ({"prefetch": 3}, TypeError, "unknown options prefetch"),
        ({"name": "has space"}, ValueError, "subscribe\\(name="),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        subscribe("orders", **{"name": "t.bad", **kwargs})


def test_a_bad_source_is_refused() -> None:
    with pytest.raises(ValueError, match="must name the publisher's destination"):
        subscribe("no spaces please")


def test_manage_py_check_refuses_a_subscription_to_a_broker_not_configured() -> None:
    from django.core import checks

    E021 = "django_domain_events.E021"
    subscribe("orders", name="t.known", broker="events")
    subscribe("orders", name="t.typo", broker="evnets")
    settings = {"BROKERS": {"events": {"URL": "redis://127.0.0.1:1/"}}}  # never connected
    with override_settings(DJANGO_DOMAIN_EVENTS=settings):
        found = [m for m in checks.run_checks(tags=["compatibility"]) if m.id == E021]
    assert [m.msg for m in found] == [
        "subscribe() declared the subscription 't.typo' on broker 'evnets', which "
        "DJANGO_DOMAIN_EVENTS['BROKERS'] does not configure (configured: 'events')."
    ]
    assert "add 'evnets'" in found[0].hint and "broker='events'" in found[0].hint
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        found = [m for m in checks.run_checks(tags=["compatibility"]) if m.id == E021]
    assert sorted(m.msg.split("'")[1] for m in found) == ["t.known", "t.typo"]
    assert "(configured: none)" in found[0].msg
