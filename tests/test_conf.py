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
    ],
)
def test_an_invalid_setting_is_refused_by_name(raw: object, message: str) -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS=raw):
        with pytest.raises(ImproperlyConfigured, match=message):
            conf.get()
        errors = [e for e in run_checks() if e.id == "django_domain_events.E001"]
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

    assert not [e for e in run_checks() if e.id == "django_domain_events.W001"]
    monkeypatch.setattr(psycopg_any, "is_psycopg3", False)
    warnings = [e for e in run_checks() if e.id == "django_domain_events.W001"]
    assert warnings and "POLL_SECONDS" in warnings[0].msg
    with override_settings(DJANGO_DOMAIN_EVENTS={"WAKE": "poll"}):
        assert not [e for e in run_checks() if e.id == "django_domain_events.W001"]
