"""Settings: merged over the defaults, and every bad value refused with the fix."""

from __future__ import annotations

import re

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

from django_domain_events import conf, fire
from django_domain_events.models import EventRecord
from tests.app.events import Pinged


def test_defaults() -> None:
    settings = conf.get()
    assert settings.BATCH_SIZE == 50
    assert settings.LEASE_SECONDS == 300
    assert settings.WAKE == "notify"
    assert settings.MESSAGE_TTL_SECONDS is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"BATCH_SIZ": 10}, "Did you mean 'BATCH_SIZE'"),
        ({"BATCH_SIZE": 0}, "whole number >= 1"),
        ({"LEASE_SECONDS": -1}, "positive number"),
        ({"POLL_SECONDS": "1"}, "positive number"),
        ({"WAKE": "listen"}, "'notify' or 'poll'"),
        ({"RELAY_PRUNE": 1}, "True or False"),
        ({"CODEC": "nodots"}, "dotted import path"),
        ({"BACKOFF_BASE_SECONDS": 10, "BACKOFF_CAP_SECONDS": 5}, "raise the cap"),
        ({"MESSAGE_TTL_SECONDS": 0}, "None \\(no lifetime\\) or a positive number"),
        ({"DEAD_LETTER_TTL_SECONDS": "week"}, "positive number"),
        ({"TASK_BACKEND": {"OPTIONS": {}}}, "'BACKEND' dotted path"),
        ("not a dict", "must be a dict"),
        # The relay's bounds, refused where the setting is read rather than at its start.
        ({"CONCURRENCY": 257}, "'CONCURRENCY'\\] must be a whole number from 1 to 256"),
        ({"BATCH_SIZE": 10_001}, "'BATCH_SIZE'\\] must be a whole number from 1 to 10000"),
    ],
)
def test_an_invalid_setting_is_refused_by_name(raw: object, message: str) -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS=raw):
        with pytest.raises(ImproperlyConfigured, match=message):
            conf.get()
        errors = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.E001"]
        assert any(re.search(message, error.msg) for error in errors)


@pytest.mark.django_db
@override_settings(DJANGO_DOMAIN_EVENTS={"BATCH_SIZE": -3})
def test_fire_with_an_invalid_setting_changes_nothing() -> None:
    with pytest.raises(ImproperlyConfigured, match="BATCH_SIZE"), transaction.atomic():
        fire(Pinged())
    assert not EventRecord.objects.exists()


@pytest.mark.skipif(
    __import__("django.db").db.connection.vendor != "postgresql", reason="PostgreSQL only"
)
def test_psycopg2_with_notify_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db.backends.postgresql import psycopg_any

    assert not [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W001"]
    monkeypatch.setattr(psycopg_any, "is_psycopg3", False)
    warnings = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W001"]
    assert warnings and "POLL_SECONDS" in warnings[0].msg
    assert "pip install 'django-domain-outbox[postgres]'" in warnings[0].hint
    with override_settings(DJANGO_DOMAIN_EVENTS={"WAKE": "poll"}):
        assert not [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W001"]


def test_a_misspelt_settings_name_is_reported() -> None:
    from django.conf import settings

    with override_settings(DJANGO_DOMAIN_EVENT={"BATCH_SIZE": 5}):
        del settings.DJANGO_DOMAIN_EVENTS
        try:
            errors = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.E002"]
        finally:
            settings.DJANGO_DOMAIN_EVENTS = {"WARN_OUTSIDE_ATOMIC": True}
    assert errors and "DJANGO_DOMAIN_EVENT looks like a misspelling" in errors[0].msg


def test_a_codec_that_cannot_rebuild_an_event_is_reported() -> None:
    from dataclasses import dataclass

    from django_domain_events import event, registry

    @event(name="t.Unsupported")
    @dataclass(frozen=True)
    class Unsupported:
        data: dict  # type: ignore[type-arg]

    try:
        errors = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.E005"]
        assert errors and "t.Unsupported" in errors[0].msg and "data" in errors[0].msg
        with override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": "no.such.Codec"}):
            assert [e for e in run_checks(databases=[]) if e.id == "django_domain_events.E004"]
    finally:
        registry._events_by_name.pop("t.Unsupported")
        registry._events_by_class.pop(Unsupported)


def test_a_receiver_of_an_undeclared_class_is_reported() -> None:
    from dataclasses import dataclass

    from django_domain_events import event, receiver, registry

    @event(name="t.Temporary")
    @dataclass(frozen=True)
    class Temporary:
        n: int = 0

    receiver(Temporary, key="t.orphan_receiver")(lambda evt: None)
    registry._events_by_name.pop("t.Temporary")
    registry._events_by_class.pop(Temporary)
    errors = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.E003"]
    assert errors and "t.orphan_receiver" in errors[0].msg


@pytest.mark.django_db
def test_owed_rows_nobody_can_deliver_are_reported() -> None:
    from django_domain_events import receiver, registry
    from tests.app.events import OrderPlaced

    receiver(OrderPlaced, key="t.leaving")(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    registry.forget("t.leaving")
    EventRecord.objects.filter(pk=event_id).update(name="testapp.Renamed")
    found = {e.id: e.msg for e in run_checks(databases=["default"])}
    assert "'t.leaving'" in found["django_domain_events.W002"]
    assert "'testapp.Renamed'" in found["django_domain_events.W003"]


@pytest.mark.django_db
def test_owed_rows_whose_receiver_now_listens_to_another_event_are_reported() -> None:
    from django_domain_events import receiver, registry
    from tests.app.events import OrderPlaced, Pinged

    receiver(OrderPlaced, key="t.moved")(lambda evt: None)
    receiver(OrderPlaced, key="t.stays")(lambda evt: None)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
    registry.forget("t.moved")
    receiver(Pinged, key="t.moved")(lambda evt: None)
    found = [e for e in run_checks(databases=["default"]) if e.id == "django_domain_events.W004"]
    assert len(found) == 1
    assert "'t.moved'" in found[0].msg and "testapp.OrderPlaced" in found[0].msg
    assert "testapp.Pinged" in found[0].msg and found[0].hint
