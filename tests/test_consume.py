"""Consuming from the real brokers of this machine (RabbitMQ, NATS JetStream, Redis):
messages in the wire format become events once, resends are counted as duplicates, bad
ones are kept dead and acknowledged, and nothing is acknowledged before it committed.

Each test uses destinations and subscription names of its own, so the shared brokers'
other users are untouched; a broker that is not reachable skips its tests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_domain_events import receiver, registry
from django_domain_events.contrib.brokers import envelope
from django_domain_events.contrib.brokers.config import broker
from django_domain_events.contrib.brokers.consuming import run_consumer
from django_domain_events.contrib.brokers.transport import Outgoing, make_transport, run
from django_domain_events.inbox import forget
from django_domain_events.models import DeadMessage, DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, OrderShipped
from tests.brokers import CONSUMER_MODES, broker_entry, consumer_mode_id, require

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=CONSUMER_MODES, ids=consumer_mode_id)
def kind(request) -> Iterator[str]:
    """Each broker of the machine, NATS and Redis consumed both from a child process and
    in the process: skipped when down, a failure under CI=true."""
    transport, process = request.param
    url = require(transport)
    entry = broker_entry(url, process)
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": entry}}):
        yield transport


@pytest.fixture
def source() -> Iterator[str]:
    """A destination of this test only, and the subscriptions declared on it forgotten."""
    name = f"dde-test-{uuid.uuid4().hex[:10]}"
    yield name
    forget(f"{name}-in")
    forget(f"{name}-in-2")


def name_of(cls: type) -> str:
    found = registry.event_for_class(cls)
    assert found is not None
    return found.name


def envelope_of(message_id: str, ce_type: str, payload: object, **extensions) -> envelope.Envelope:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return envelope.build(
        id=message_id,
        source="shop",
        type=ce_type,
        data=data,
        time=datetime(2026, 1, 2, tzinfo=UTC),
        **extensions,
    )


def send(to: str, envelopes: list[envelope.Envelope], unroutable: int = 0) -> None:
    """Publish in the wire format through the publisher's transport, as a relay would;
    the last ``unroutable`` messages are expected back from RabbitMQ (no queue for them)."""
    transport = make_transport(broker("default"))
    run(transport.connect(), 30)
    try:
        results = run(transport.publish([Outgoing(to, env) for env in envelopes]), 60)
        sent = len(envelopes) - unroutable
        assert results[:sent] == [None] * sent
        assert all("no queue bound" in str(result) for result in results[sent:])
    finally:
        run(transport.close(), 10)


def subscribe_to(source: str, **options):
    from django_domain_events.contrib.brokers import subscribe

    return subscribe(source, name=f"{source}-in", **options)


def test_messages_become_events_once_and_bad_ones_are_kept_dead(kind, source) -> None:
    receiver(OrderPlaced, key="t.consumed")(lambda evt: None)
    subscribe_to(source)
    run_consumer(once=True, wait=0.5)  # declares queue, consumer or group: publisher second
    placed = name_of(OrderPlaced)
    good = [envelope_of(f"m{i}", placed, {"order_id": i}, payloadversion="1") for i in range(5)]
    resent = good[:2]  # a publisher's resend after a lost confirm: same ids
    poison = [
        envelope_of("garbage", placed, b"\xffnot json"),
        envelope_of("unknown", "shop.NotDeclaredAnywhere", {"n": 1}),
        envelope_of("future", placed, {"order_id": 1}, payloadversion="99"),
    ]
    send(source, good + poison)
    if kind != "nats":  # JetStream drops a resend within its window by Nats-Msg-Id itself
        send(source, resent)
    counts = run_consumer(once=True, wait=0.5)
    assert counts["recorded"] == 5 and counts["dead"] == 3
    assert counts["duplicate"] == (0 if kind == "nats" else 2)
    assert EventRecord.objects.count() == 5 and DeliveryRecord.objects.count() == 5
    assert sorted(DeadMessage.objects.values_list("message_id", flat=True)) == [
        "future",
        "garbage",
        "unknown",
    ]
    # Everything was acknowledged: nothing comes back, poison included.
    assert run_consumer(once=True, wait=0.5) == {}


def test_a_mapping_binds_only_the_types_asked_for(kind, source) -> None:
    subscribe_to(source, events={"shop.order.shipped": OrderShipped})
    run_consumer(once=True, wait=0.5)
    send(
        source,
        [
            envelope_of("s1", "shop.order.shipped", {"order_id": 1, "carrier": "ups"}),
            envelope_of("p1", name_of(OrderPlaced), {"order_id": 2}),
        ],
        unroutable=1 if kind == "rabbitmq" else 0,  # published mandatory: not dropped
    )
    counts = run_consumer(once=True, wait=0.5)
    assert counts["recorded"] == 1
    # RabbitMQ binds the asked types only (and returns the rest to the publisher); a
    # stream carries the rest, skipped.
    assert counts["ignored"] == (0 if kind == "rabbitmq" else 1)
    assert EventRecord.objects.get().name == "testapp.OrderShipped"


def test_the_command_consumes_until_drained(kind, source) -> None:
    from io import StringIO

    subscribe_to(source)
    call_command("consume_events", "--once", "--subscription", f"{source}-in", stdout=StringIO())
    send(source, [envelope_of("c1", name_of(OrderPlaced), {"order_id": 1})])
    out = StringIO()
    call_command("consume_events", "--once", "--subscription", f"{source}-in", stdout=out)
    assert out.getvalue() == "Consumed: 1 recorded, 0 duplicate, 0 dead, 0 ignored.\n"


def test_a_batch_the_database_refuses_is_not_acknowledged_and_comes_back(kind, source) -> None:
    from django.db import connection

    from django_domain_events import INLINE
    from django_domain_events.contrib.brokers.consuming import ConsumerHalted

    broken = {"on": True}

    @receiver(OrderPlaced, key="t.db_trouble", mode=INLINE)
    def db_trouble(evt) -> None:
        if broken["on"]:  # a real database error, in the recording transaction
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table_for_the_inbox")

    # A short ack_wait: a handed-back message whose nak the client lost (NATS, a message
    # arriving as a fetch times out) comes back after it, within the test's patience.
    subscribe_to(source, ack_wait_seconds=3)
    run_consumer(once=True, wait=0.5)
    placed = name_of(OrderPlaced)
    send(source, [envelope_of(f"d{i}", placed, {"order_id": i}) for i in range(3)])
    with pytest.raises(ConsumerHalted, match="failed 5 times in a row"):
        run_consumer(once=True, wait=0.5)
    assert not EventRecord.objects.exists() and not DeadMessage.objects.exists()
    broken["on"] = False  # the database is back: the broker still holds every message
    # Every one comes back, once each: at once, or a fetch later, or after the ack_wait.
    recorded, deadline = 0, time.monotonic() + 30
    while recorded < 3 and time.monotonic() < deadline:
        recorded += run_consumer(once=True, wait=0.5).get("recorded", 0)
    assert recorded == 3
    assert run_consumer(once=True, wait=0.5).get("recorded", 0) == 0  # nothing twice
    assert EventRecord.objects.count() == 3


def test_a_consumer_stopping_hands_back_the_batch_it_fetched_ahead(kind, source) -> None:
    import threading

    subscribe_to(source, batch_size=2)
    run_consumer(once=True, wait=0.5)
    placed = name_of(OrderPlaced)
    send(source, [envelope_of(f"a{i}", placed, {"order_id": i}) for i in range(6)])
    stop = threading.Event()
    first = run_consumer(stop=stop, wait=0.5, on_batch=lambda sub, counts: stop.set())
    # One batch: two messages, or one when the second had not reached the consumer yet
    # (a RabbitMQ batch takes what has arrived); the rest were fetched ahead meanwhile.
    assert first in ({"recorded": 2}, {"recorded": 1}), first
    # Handed back, not left for the broker's ack_wait (30 s): the rest comes at once.
    assert run_consumer(once=True, wait=0.5) == {"recorded": 6 - first["recorded"]}
    assert EventRecord.objects.count() == 6


@pytest.mark.parametrize("process", [True, False], ids=["child", "thread"])
def test_a_stream_entry_with_bytes_that_are_not_utf8_is_kept_dead(source, process) -> None:
    import redis

    url = require("redis")
    entry = broker_entry(url, process)
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": entry}}):
        subscribe_to(source)
        run_consumer(once=True, wait=0.5)
        client = redis.Redis.from_url(url)
        try:
            fields = {"ce-specversion": "1.0", "ce-id": "bad-bytes", "ce-source": "shop"}
            client.xadd(source, {**fields, "ce-type": b"shop.\xff", "data": b"{}"})
        finally:
            client.close()
        assert run_consumer(once=True, wait=0.5) == {"dead": 1}
        entry = DeadMessage.objects.get()
        assert entry.message_id == "bad-bytes" and entry.type == "shop.\ufffd"
        assert entry.reason.startswith("unknown type:")
        assert run_consumer(once=True, wait=0.5) == {}  # acknowledged: never again
