"""The Prometheus collector and view: outbox_health() as gauges, read at scrape time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_domain_events import drain_outbox, outbox_health, receiver

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from django_domain_events.contrib.prometheus import (  # noqa: E402
    OutboxCollector,
    metrics_view,
    register,
)
from tests.app.events import OrderPlaced  # noqa: E402
from tests.support import failing, fire_one  # noqa: E402

pytestmark = pytest.mark.django_db


def declare() -> None:
    receiver(OrderPlaced, key="t.now")(lambda evt: None)
    receiver(OrderPlaced, key="t.later", due=timedelta(days=2), lane="slow")(lambda evt: None)
    receiver(OrderPlaced, key="t.dead", max_attempts=1, lane="mail")(failing)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_gauges_are_outbox_health_per_receiver_and_lane() -> None:
    declare()
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()  # t.now succeeds, t.dead dies, t.later waits two days
    fire_one(OrderPlaced(order_id=2))
    into = CollectorRegistry(auto_describe=True)
    collector = register(into)
    assert register(into) is collector  # once per registry
    got = samples(generate_latest(into).decode())
    health = {r.key: r for r in outbox_health().receivers}

    def value(name: str, key: str, lane: str) -> float:
        return got[f"domain_events_{name}", (("lane", lane), ("receiver", key))]

    for key, lane in (("t.now", "default"), ("t.later", "slow"), ("t.dead", "mail")):
        assert value("owed", key, lane) == health[key].owed
        assert value("scheduled", key, lane) == health[key].scheduled
        assert value("dead", key, lane) == health[key].dead
        assert value("claimed", key, lane) == 0
    assert (value("owed", "t.now", "default"), value("scheduled", "t.later", "slow")) == (1, 2)
    assert value("dead", "t.dead", "mail") == 1
    oldest = health["t.now"].oldest_owed_at
    assert oldest is not None
    age = value("oldest_owed_age_seconds", "t.now", "default")
    assert 0 <= age <= (timezone.now() - oldest).total_seconds() + 1
    assert value("oldest_owed_age_seconds", "t.later", "slow") == 0  # nothing owed yet
    assert got["domain_events_lapsed_leases", ()] == 0
    assert got["domain_events_lane_paused_relays", (("lane", "mail"),)] == 0


def test_registering_reads_nothing_from_the_database(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        register(CollectorRegistry(auto_describe=True))
    with django_assert_num_queries(4):
        list(OutboxCollector().collect())


def test_the_view_serves_text_and_openmetrics(rf) -> None:
    declare()
    fire_one(OrderPlaced(order_id=1))
    response = metrics_view(rf.get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'domain_events_scheduled{lane="slow",receiver="t.later"} 1.0' in text
    response = metrics_view(
        rf.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().endswith("# EOF\n")
