"""contrib.opentelemetry (issue 14, item 2): a delivery is a span in the trace that fired it.

Uses the SDK's in-memory exporter in this process, and a JSON-lines exporter in a relay
child process on PostgreSQL.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_domain_events import DeliveryStatus, NotYet, deliver_one, fire, receiver, tracing
from django_domain_events.contrib.opentelemetry import install
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.models import DeliveryRecord, EventRecord
from django_domain_events.testing import drain_outbox
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import start_child
from tests.procs.receivers import declare_recorder

pytestmark = pytest.mark.django_db(transaction=True)

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)  # this test process's only provider
TRACER = trace.get_tracer("tests")


@pytest.fixture(autouse=True)
def traced() -> Iterator[None]:
    """contrib.opentelemetry on, spans exported to memory; off again afterwards."""
    install()
    EXPORTER.clear()
    yield
    tracing.uninstall()


def fire_in_a_request(evt: object) -> tuple[Any, int]:
    with TRACER.start_as_current_span("POST /orders") as request, transaction.atomic():
        event_id = fire(evt)
    assert event_id is not None
    return request.get_span_context(), event_id


def deliveries() -> list[Any]:
    return [s for s in EXPORTER.get_finished_spans() if s.name.endswith(" process")]


def test_fire_stores_the_trace_context_and_the_relay_span_is_its_child() -> None:
    receiver(OrderPlaced, key="t.traced")(lambda evt: None)
    request, event_id = fire_in_a_request(OrderPlaced(order_id=1))
    stored = json.loads(EventRecord.objects.get(pk=event_id).trace_context)
    assert stored["traceparent"].split("-")[1] == format(request.trace_id, "032x")
    drain_outbox()
    [span] = deliveries()
    assert span.name == "t.traced process" and span.kind is trace.SpanKind.CONSUMER
    assert span.context.trace_id == request.trace_id
    assert span.parent is not None and span.parent.span_id == request.span_id
    row = DeliveryRecord.objects.get()
    assert span.attributes["messaging.system"] == "django_domain_events"
    assert span.attributes["messaging.destination.name"] == "t.traced"
    assert span.attributes["messaging.message.id"] == str(row.id)
    assert span.attributes["messaging.django_domain_events.attempt"] == 1
    assert span.status.status_code is trace.StatusCode.UNSET


def test_the_callers_baggage_is_neither_stored_nor_replayed_at_an_attempt() -> None:
    """Only ``traceparent`` and ``tracestate`` go on the row: baggage may carry a user's
    data, and an attempt must not run under a request's baggage days later."""
    from opentelemetry import baggage, context

    seen: list[dict[str, object]] = []
    receiver(OrderPlaced, key="t.baggage")(lambda evt: seen.append(dict(baggage.get_all())))
    token = context.attach(baggage.set_baggage("user.email", "someone@example.com"))
    try:
        request, event_id = fire_in_a_request(OrderPlaced(order_id=1))
    finally:
        context.detach(token)
    stored = json.loads(EventRecord.objects.get(pk=event_id).trace_context)
    assert set(stored) <= {"traceparent", "tracestate"}, stored
    # A row stored before this rule, baggage and all, replays none of it.
    EventRecord.objects.filter(pk=event_id).update(
        trace_context=json.dumps({**stored, "baggage": "user.email=someone%40example.com"})
    )
    drain_outbox()
    assert seen == [{}]
    [span] = deliveries()
    assert span.context.trace_id == request.trace_id


def test_a_failure_is_recorded_on_its_span_and_not_yet_is_not() -> None:
    def fails(evt: OrderPlaced) -> None:
        raise ConnectionError("down")

    def later(evt: Pinged) -> None:
        from datetime import timedelta

        from django.utils import timezone

        raise NotYet(timezone.now() + timedelta(hours=1))

    receiver(OrderPlaced, key="t.fails")(fails)
    receiver(Pinged, key="t.later")(later)
    fire_in_a_request(OrderPlaced(order_id=1))
    fire_in_a_request(Pinged(n=1))
    drain_outbox()
    spans = {s.name: s for s in deliveries()}
    failed = spans["t.fails process"]
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.type"] == "ConnectionError"
    waiting = spans["t.later process"]
    assert waiting.status.status_code is trace.StatusCode.UNSET
    assert [e.name for e in waiting.events] == ["not yet"]


def test_eager_and_task_worker_attempts_are_traced_too() -> None:
    receiver(OrderPlaced, key="t.eager", eager=True)(lambda evt: None)
    request, _ = fire_in_a_request(OrderPlaced(order_id=1))  # attempted after commit
    receiver(Pinged, key="t.task")(lambda evt: None)
    task_request, _ = fire_in_a_request(Pinged(n=1))
    [handed] = claim_batch(worker_id="relay", now=_now(), lease=60, limit=1, lane="default")
    status = deliver_one(handed.id, claimed_by="relay", claimed_at=handed.claimed_at.isoformat())
    assert status is DeliveryStatus.SUCCEEDED
    by_name = {s.name: s for s in deliveries()}
    assert by_name["t.eager process"].context.trace_id == request.trace_id
    assert by_name["t.task process"].context.trace_id == task_request.trace_id


def test_an_event_fired_outside_any_span_stores_nothing_and_still_traces_attempts() -> None:
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    assert EventRecord.objects.get(pk=event_id).trace_context == ""
    drain_outbox()
    [span] = deliveries()
    assert span.parent is None


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def test_a_relay_process_delivers_in_the_trace_of_the_request() -> None:
    declare_recorder()
    request, event_id = fire_in_a_request(OrderPlaced(order_id=7))
    spans_file = Path(tempfile.mkdtemp()) / "spans.jsonl"
    relay = start_child("relay", "--once", env={"DDE_SPANS_FILE": str(spans_file)})
    out, err = relay.communicate(timeout=60)
    assert relay.returncode == 0, out + err
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    [span] = [
        s
        for s in spans
        if s["attributes"].get("messaging.django_domain_events.event_id") == event_id
    ]
    assert span["trace_id"] == format(request.trace_id, "032x")
    assert span["parent_id"] == format(request.span_id, "016x")
    assert span["kind"] == "CONSUMER"
    assert span["attributes"]["messaging.destination.name"] == "tests.record_order"
