"""The package's clock follows the database's (issue 19, item 7)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_domain_events import clock
from django_domain_events.delivery.relay import RelayHalted, run_relay

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_offset() -> Iterator[None]:
    """Each test measures for itself; the offset it leaves is forgotten."""
    yield
    clock._offset = timedelta(0)
    clock._measured_at = float("-inf")


def test_now_follows_the_database_clock_when_the_host_runs_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=60))
    reading = clock.synchronise(connection.alias)
    if connection.vendor == "sqlite":  # one host: the database's clock is this one
        assert reading == clock.Reading(0.0, 0.0)
        return
    assert -61 < reading.offset < -59
    assert abs((clock.now() - real()).total_seconds()) < 1


def test_a_clock_in_agreement_with_the_database_gets_no_offset() -> None:
    clock.synchronise(connection.alias)
    assert abs(clock.offset().total_seconds()) < 0.05


def test_a_relay_refuses_to_run_on_a_clock_it_cannot_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(clock, "MAX_UNCERTAINTY_SECONDS", -1.0)
    with (
        caplog.at_level(logging.ERROR),
        pytest.raises(RelayHalted, match="Could not read the clock"),
    ):
        run_relay(once=True, prune=None)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info, errors
