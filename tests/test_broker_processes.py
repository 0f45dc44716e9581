"""10,000 events published by two relays to each broker, the broker restarted once and
one relay killed with SIGKILL mid-stream: everything arrives, at least once, and every
acknowledged row is at the destination. Checked by reading the destination back.

PostgreSQL only (real concurrency), against broker servers of the test's own
(tests.broker_servers), never the machine's shared ones.
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import pytest
from django.db import transaction
from django.test import override_settings

from django_domain_events import fire
from django_domain_events.contrib.brokers import publish
from django_domain_events.models import DeliveryRecord
from tests import brokers
from tests.app.events import OrderPlaced
from tests.broker_servers import SERVERS
from tests.conftest import needs_postgresql, start_together, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql]

EVENTS = 10_000
CHUNK = 500


@pytest.fixture(params=sorted(SERVERS))
def server(request):
    server = SERVERS[request.param]()
    if not server.available():
        message = f"no {request.param} server binary on this machine"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: the broker tests are required under CI=true")
        pytest.skip(message)
    server.start()
    yield server
    server.stop()


def test_two_relays_a_broker_restart_and_a_kill_lose_nothing(server):
    to = brokers.new_destination()
    brokers.prepare(server.transport, server.url, to)
    env = {"DDE_BROKER_URL": server.url, "DDE_PUBLISH_TO": to, "DDE_LEASE_SECONDS": "5"}
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": {"URL": server.url}}}):
        publish(OrderPlaced, to=to, max_attempts=100)  # fire() writes the rows
    relays = start_together("publisher", [("--batch-size", "200")] * 2, env=env)
    rows = DeliveryRecord.objects.filter(receiver_key=f"brokers:default:{to}:testapp.OrderPlaced")
    try:
        for start in range(0, EVENTS, CHUNK):
            with transaction.atomic():
                for n in range(start, start + CHUNK):
                    fire(OrderPlaced(order_id=n))
            if start == CHUNK * 2:
                wait_for(lambda: rows.filter(status="succeeded").count() > 1000, 60, "publishing")
                relays[0].send_signal(signal.SIGKILL)
                server.restart()
        wait_for(lambda: rows.filter(status="succeeded").count() == EVENTS, 120, "every row acked")
    finally:
        for relay in relays:
            if relay.poll() is None:
                relay.send_signal(signal.SIGTERM)
        for index, relay in enumerate(relays):
            _, err = relay.communicate(timeout=60)
            print(f"relay {index} said:", err[-2000:])
    found = brokers.read(server.transport, server.url, to)
    ids_of_order: dict[int, set[str]] = defaultdict(set)
    for _, env_ in found:
        ids_of_order[env_.payload()["order_id"]].add(env_.id)
    assert sorted(ids_of_order) == list(range(EVENTS)), "an event never reached the broker"
    assert all(len(ids) == 1 for ids in ids_of_order.values()), "a resend changed its id"
    acknowledged = {f"{event_id}.{pk}" for pk, event_id in rows.values_list("pk", "event_id")}
    assert acknowledged == {next(iter(ids)) for ids in ids_of_order.values()}
    print(f"{server.transport}: {len(found)} messages for {EVENTS} events")
