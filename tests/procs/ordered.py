"""The ordered receiver of tests/test_ordering_processes.py, declared alike in the test
and in its relays: one row per successful run in RunLog (the key as ``receiver_key``,
the firing sequence as ``attempt``), 10% of first attempts failing, 0-5 ms of work, and
a PostgreSQL advisory lock per key that tells when two rows of one key run at once."""

from __future__ import annotations

import os
import random
import time
from datetime import timedelta

from django.db import connection

from django_domain_events import DeliveryContext, receiver
from django_domain_events.retry import Constant
from tests.app.events import OrderPlaced
from tests.app.models import RunLog

ORDERED_KEY = "tests.ordered_log"
KEYS = 200


def key_of(evt: OrderPlaced) -> int:
    return evt.order_id % KEYS


def log_in_order(evt: OrderPlaced, ctx: DeliveryContext) -> None:
    key = key_of(evt)
    with connection.cursor() as cursor:  # held until this delivery's commit
        cursor.execute("SELECT pg_try_advisory_xact_lock(23, %s)", [key])
        alone = cursor.fetchone()[0]
    if not alone:
        with open(os.environ["DDE_OVERLAP_LOG"], "a") as log:
            log.write(f"{key} {evt.order_id}\n")
    time.sleep(random.uniform(0, 0.005))
    if ctx.attempt == 1 and random.random() < 0.1:
        raise RuntimeError(f"first attempt of {evt.order_id} fails")
    RunLog.objects.create(delivery_id=ctx.delivery_id, receiver_key=str(key), attempt=evt.order_id)


def declare_ordered() -> None:
    receiver(
        OrderPlaced,
        key=ORDERED_KEY,
        takes_context=True,
        ordered_by=key_of,
        lease_seconds=3,
        retry=Constant(0.05),
        give_up_after=timedelta(minutes=30),
        max_attempts=20,
    )(log_in_order)
