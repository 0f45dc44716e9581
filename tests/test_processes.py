"""Real concurrency on PostgreSQL: several processes sharing the same owed rows."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered
from tests.conftest import needs_several_relays, start_together
from tests.procs.receivers import RECORDER_KEY, declare_recorder

pytestmark = [pytest.mark.django_db(transaction=True), needs_several_relays]


def test_two_processes_drain_2000_rows_each_exactly_once() -> None:
    declare_recorder()
    with transaction.atomic():
        for n in range(2000):
            fire(OrderPlaced(order_id=n))
    # Both begin draining at one moment, so each takes part however slowly it booted.
    children = start_together("drain", [(f"worker-{i}",) for i in range(2)])
    outputs = [child.communicate(timeout=240) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    per_worker = [int(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sum(per_worker) == 2000
    assert all(n > 0 for n in per_worker), per_worker  # both really took part
    assert Delivered.objects.count() == 2000
    assert Delivered.objects.values("delivery_id").distinct().count() == 2000
    rows = DeliveryRecord.objects.filter(receiver_key=RECORDER_KEY)
    assert rows.filter(status=DeliveryStatus.SUCCEEDED, attempts=1).count() == 2000
    assert not rows.exclude(status=DeliveryStatus.SUCCEEDED).exists()
