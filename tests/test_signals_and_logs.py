"""Signals and structured log records (issue 14, items 3 and 4)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_domain_events import (
    DeliveryStatus,
    PermanentFailure,
    deliver_pending,
    fire,
    receiver,
    signals,
)
from django_domain_events.testing import drain_outbox
from tests.app.events import OrderPlaced, Pinged
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = {
    "delivery_id",
    "event_id",
    "event_name",
    "receiver_key",
    "attempt",
    "status",
    "worker_id",
    "lane",
}


class Heard:
    """Everything a signal sent, as (signal name, sender, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self._connected: list[tuple[Any, Any]] = []

    def listen(self, *names: str) -> Heard:
        for name in names:
            signal = getattr(signals, name)

            def handler(sender: Any, name: str = name, **kwargs: Any) -> None:
                kwargs.pop("signal", None)
                self.calls.append((name, sender, kwargs))

            signal.connect(handler, weak=False)
            self._connected.append((signal, handler))
        return self

    def close(self) -> None:
        for signal, handler in self._connected:
            signal.disconnect(handler)


@pytest.fixture
def heard() -> Any:
    found = Heard().listen(
        "event_recorded", "delivery_succeeded", "delivery_failed", "delivery_dead"
    )
    yield found
    found.close()


def test_event_recorded_is_sent_after_commit_and_never_for_a_rollback(heard: Heard) -> None:
    receiver(OrderPlaced, key="t.sig")(lambda evt: None)
    with pytest.raises(RuntimeError), transaction.atomic():
        fire(OrderPlaced(order_id=1))
        raise RuntimeError("roll back")
    assert heard.calls == []
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=2))
        assert heard.calls == []  # not before the commit
    [(name, sender, kwargs)] = heard.calls
    assert (name, sender) == ("event_recorded", OrderPlaced)
    assert kwargs["event_id"] == event_id and kwargs["deliveries"] == 1
    assert kwargs["event"] == OrderPlaced(order_id=2)


def test_delivery_signals_carry_what_happened(heard: Heard) -> None:
    def fails(evt: Pinged) -> None:
        raise ConnectionError("down")

    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    receiver(Pinged, key="t.down", max_attempts=2)(fails)
    fire_one(OrderPlaced(order_id=1))
    fire_one(Pinged(n=1))
    heard.calls.clear()
    drain_outbox()
    by_name = {name: kwargs for name, _, kwargs in heard.calls}
    assert [name for name, _, _ in heard.calls] == [
        "delivery_succeeded",
        "delivery_failed",
        "delivery_dead",
    ]
    success = by_name["delivery_succeeded"]
    assert success["receiver_key"] == "t.ok"
    assert success["duration"] >= 0 and success["lag"] >= 0
    assert by_name["delivery_failed"]["attempt"] == 1
    dead = by_name["delivery_dead"]
    assert dead["attempt"] == 2 and isinstance(dead["error"], ConnectionError)
    assert dead["last_error"] == "ConnectionError: down"


def test_a_row_dead_without_running_sends_delivery_dead(heard: Heard) -> None:
    receiver(OrderPlaced, key="t.short", ttl=timedelta(minutes=1))(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    heard.calls.clear()
    deliver_pending(now=timezone.now() + timedelta(hours=1))
    [(name, sender, kwargs)] = heard.calls
    assert (name, sender) == ("delivery_dead", OrderPlaced)
    assert kwargs["last_error"].startswith("expired:")


def test_every_delivery_record_carries_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    def refuses(evt: Pinged) -> None:
        raise PermanentFailure("no such customer")

    receiver(OrderPlaced, key="t.ok", lane="default")(lambda evt: None)
    receiver(Pinged, key="t.refuses")(refuses)
    fire_one(OrderPlaced(order_id=1))
    fire_one(Pinged(n=1))
    with caplog.at_level(logging.DEBUG, logger="django_domain_events"):
        drain_outbox()
    records = [r for r in caplog.records if r.name == "django_domain_events.delivery"]
    assert records
    for record in records:
        assert set(vars(record)) >= FIELDS, record.getMessage()
    success = next(r for r in records if r.receiver_key == "t.ok")
    assert (success.levelno, success.status, success.attempt) == (logging.DEBUG, "succeeded", 1)
    dead = next(r for r in records if r.receiver_key == "t.refuses")
    assert (dead.levelno, dead.status, dead.lane) == (logging.ERROR, "dead", "default")
    assert dead.exc_info is not None and dead.exc_info[0] is PermanentFailure


def test_a_dead_letter_reaches_an_error_handler_with_its_traceback() -> None:
    seen: list[logging.LogRecord] = []

    class ErrorsOnly(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = ErrorsOnly(level=logging.ERROR)  # as Sentry's logging integration listens
    logging.getLogger("django_domain_events").addHandler(handler)
    try:

        def fails(evt: OrderPlaced) -> None:
            raise ValueError("bad data")

        receiver(OrderPlaced, key="t.fails", max_attempts=1)(fails)
        fire_one(OrderPlaced(order_id=1))
        assert drain_outbox()[DeliveryStatus.DEAD] == 1
    finally:
        logging.getLogger("django_domain_events").removeHandler(handler)
    [record] = seen
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
    assert record.receiver_key == "t.fails" and record.status == "dead"
