"""A child process of one of two services talking through a broker (tests/test_inbox_processes.py).

Usage: services.py ROLE SOURCE [N]
    fire SOURCE N     service A: fire N OrderPlaced events (order_id 0..N-1), 200 a commit
    relay SOURCE      service A: publish(OrderPlaced, to=SOURCE), then deliver_events
    consume SOURCE    service B: subscribe(SOURCE), then run_consumer; one JSON line of
                      counts per recorded batch goes to DDE_COUNTS_FILE
    deliver SOURCE    service B: the receiver writing each order id into a unique column
                      (tests.app.models.Delivered), then deliver_events
The database is DDE_DB_NAME (A's or B's), the broker DDE_SETTINGS_JSON's BROKERS.
"""

from __future__ import annotations

import json
import os
import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from django_domain_events import fire, receiver  # noqa: E402
from tests.app.events import OrderPlaced  # noqa: E402
from tests.app.models import Delivered  # noqa: E402

ROLE, SOURCE = sys.argv[1], sys.argv[2]


def record_id(evt: OrderPlaced) -> None:
    """B's receiver: the unique column makes a second run of one order fail loudly."""
    Delivered.objects.create(delivery_id=evt.order_id, receiver_key="b.ids", event_id=0)


def fire_all(count: int) -> None:
    for start in range(0, count, 200):
        with transaction.atomic():
            for order_id in range(start, min(start + 200, count)):
                fire(OrderPlaced(order_id=order_id))
    print(f"fired {count}", flush=True)


def consume() -> None:
    from django_domain_events.contrib.brokers import subscribe
    from django_domain_events.contrib.brokers.consuming import run_consumer

    subscribe(SOURCE, name=f"{SOURCE}-b", ack_wait_seconds=3)
    log = open(os.environ["DDE_COUNTS_FILE"], "a")  # noqa: SIM115 - open for the process

    def counted(subscription, counts) -> None:
        log.write(json.dumps({"pid": os.getpid(), **counts}) + "\n")
        log.flush()

    run_consumer(on_batch=counted, wait=0.5)


if ROLE in ("fire", "relay"):  # service A: the publish is declared where events fire
    from django_domain_events.contrib.brokers import publish

    publish(OrderPlaced, to=SOURCE)
elif ROLE in ("consume", "deliver"):  # service B: its receiver, where events are recorded
    receiver(OrderPlaced, key="b.ids", ack="batch")(record_id)
else:
    raise SystemExit(f"unknown role {ROLE!r}")
if ROLE == "fire":
    fire_all(int(sys.argv[3]))
elif ROLE == "consume":
    consume()
else:
    call_command("deliver_events", "--batch-size", "200")
