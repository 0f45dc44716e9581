"""The Prometheus collector and view (outbox_health() as gauges, read at scrape time), and
the delivery metrics fed by the signals (rates, durations, lags)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from django_domain_events import DeliveryStatus, drain_outbox, outbox_health, receiver, run_relay
from django_domain_events.models import DeliveryRecord

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from django_domain_events.contrib import prometheus  # noqa: E402
from django_domain_events.contrib.prometheus import (  # noqa: E402
    DeliveryMetrics,
    OutboxCollector,
    instrument,
    metrics_view,
    multiprocess_registry,
    register,
)
from tests.app.events import OrderPlaced  # noqa: E402
from tests.support import command, failing, fire_one  # noqa: E402

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scrape in these tests reads the database, unless a test says otherwise."""
    monkeypatch.setattr(prometheus, "SCRAPE_CACHE_SECONDS", 0.0)


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


def test_a_scrape_storm_reads_the_database_once_per_cache_period(
    rf, monkeypatch: pytest.MonkeyPatch, django_assert_num_queries
) -> None:
    declare()
    fire_one(OrderPlaced(order_id=1))
    monkeypatch.setattr(prometheus, "SCRAPE_CACHE_SECONDS", 60.0)
    list(OutboxCollector().collect())  # a collector of its own reads for itself
    with django_assert_num_queries(4):  # one read, then 49 answers from it
        for _ in range(50):
            response = metrics_view(rf.get("/metrics"))
    assert (
        samples(response.content.decode())[
            "domain_events_owed", (("lane", "default"), ("receiver", "t.now"))
        ]
        == 1
    )


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


# The delivery metrics, fed by the signals.


@pytest.fixture
def metrics() -> Iterator[DeliveryMetrics]:
    """Delivery metrics in a registry of their own, listening for this test only."""
    counted = DeliveryMetrics(CollectorRegistry(auto_describe=True))
    counted.connect()
    yield counted
    counted.disconnect()


def scraped(metrics: DeliveryMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert metrics.registry is not None
    return samples(generate_latest(metrics.registry).decode())


def counted(got: dict, key: str, lane: str, outcome: str) -> float:
    return got.get(
        (
            "domain_events_deliveries_total",
            (("lane", lane), ("outcome", outcome), ("receiver", key)),
        ),
        0.0,
    )


def observed(got: dict, name: str, key: str, lane: str) -> float:
    return got.get(
        (f"domain_events_delivery_{name}_seconds_count", (("lane", lane), ("receiver", key))), 0.0
    )


def test_the_delivery_metrics_count_what_the_rows_show(metrics: DeliveryMetrics) -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    receiver(OrderPlaced, key="t.flaky", max_attempts=3, lane="mail")(failing)
    receiver(OrderPlaced, key="t.dead", max_attempts=1, lane="mail")(failing)
    receiver(OrderPlaced, key="t.later", due=timedelta(days=2), lane="slow")(lambda evt: None)
    metrics.declare_receivers()
    for n in range(3):
        fire_one(OrderPlaced(order_id=n))
    drain_outbox()  # backoff skipped: t.flaky fails twice, then dies
    got = scraped(metrics)
    for key, lane in (("t.ok", "default"), ("t.flaky", "mail"), ("t.dead", "mail")):
        rows = DeliveryRecord.objects.filter(receiver_key=key)
        attempts = sum(rows.values_list("attempts", flat=True))
        succeeded = rows.filter(status=DeliveryStatus.SUCCEEDED).count()
        dead = rows.filter(status=DeliveryStatus.DEAD).count()
        assert counted(got, key, lane, "succeeded") == succeeded
        assert counted(got, key, lane, "dead") == dead
        assert counted(got, key, lane, "failed") == attempts - succeeded - dead
        assert observed(got, "duration", key, lane) == attempts  # every attempt ran
        assert observed(got, "lag", key, lane) == attempts
    assert counted(got, "t.ok", "default", "succeeded") == 3
    assert counted(got, "t.flaky", "mail", "failed") == 6
    assert counted(got, "t.flaky", "mail", "dead") == 3
    assert counted(got, "t.dead", "mail", "dead") == 3
    # Declared series start at zero, before their first delivery.
    key = (
        "domain_events_deliveries_total",
        (("lane", "slow"), ("outcome", "succeeded"), ("receiver", "t.later")),
    )
    assert got[key] == 0
    assert observed(got, "duration", "t.later", "slow") == 0
    duration_sum = got[
        "domain_events_delivery_duration_seconds_sum", (("lane", "default"), ("receiver", "t.ok"))
    ]
    assert 0 <= duration_sum < 5


def test_a_row_dead_without_running_counts_dead_and_observes_nothing(
    metrics: DeliveryMetrics,
) -> None:
    receiver(OrderPlaced, key="t.short", ttl=timedelta(minutes=1))(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    drain_outbox(now=timezone.now() + timedelta(hours=1))  # past its lifetime: dead unrun
    got = scraped(metrics)
    assert DeliveryRecord.objects.get(receiver_key="t.short").status == DeliveryStatus.DEAD
    assert counted(got, "t.short", "default", "dead") == 1
    assert observed(got, "duration", "t.short", "default") == 0
    assert observed(got, "lag", "t.short", "default") == 0


def test_the_lag_runs_from_the_due_time(metrics: DeliveryMetrics) -> None:
    receiver(OrderPlaced, key="t.later")(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    # Due ten minutes ago: the relay is late by that much.
    DeliveryRecord.objects.update(due_at=timezone.now() - timedelta(minutes=10))
    drain_outbox()
    got = scraped(metrics)
    lag = got[
        "domain_events_delivery_lag_seconds_sum", (("lane", "default"), ("receiver", "t.later"))
    ]
    assert 590 <= lag <= 700
    late = got[
        "domain_events_delivery_lag_seconds_bucket",
        (("lane", "default"), ("le", "300.0"), ("receiver", "t.later")),
    ]
    assert late == 0  # not within five minutes of its due time
    assert counted(got, "t.later", "default", "succeeded") == 1


def test_instrument_connects_once_per_registry() -> None:
    into = CollectorRegistry(auto_describe=True)
    first = instrument(into)
    try:
        assert instrument(into) is first
        receiver(OrderPlaced, key="t.ok")(lambda evt: None)
        fire_one(OrderPlaced(order_id=1))
        drain_outbox()
        assert counted(scraped(first), "t.ok", "default", "succeeded") == 1  # not twice
    finally:
        first.disconnect()


def test_disconnected_metrics_count_no_more(metrics: DeliveryMetrics) -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    drain_outbox()
    metrics.disconnect()
    fire_one(OrderPlaced(order_id=2))
    drain_outbox()
    assert counted(scraped(metrics), "t.ok", "default", "succeeded") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one delivery at a time")
def test_worker_threads_count_every_delivery(metrics: DeliveryMetrics) -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    receiver(
        OrderPlaced,
        key="t.flaky",
        max_attempts=2,
        backoff_base_seconds=0.01,
        backoff_cap_seconds=0.01,
    )(failing)
    for n in range(40):
        fire_one(OrderPlaced(order_id=n))
    run_relay(once=True, concurrency=8, prune=None)
    got = scraped(metrics)
    assert counted(got, "t.ok", "default", "succeeded") == 40
    flaky = DeliveryRecord.objects.filter(receiver_key="t.flaky")
    assert counted(got, "t.flaky", "default", "failed") + counted(
        got, "t.flaky", "default", "dead"
    ) == sum(flaky.values_list("attempts", flat=True))
    assert (
        counted(got, "t.flaky", "default", "dead")
        == flaky.filter(status=DeliveryStatus.DEAD).count()
    )
    assert observed(got, "duration", "t.ok", "default") == 40


def test_in_multiprocess_mode_the_counts_of_every_process_are_served_with_the_gauges(
    tmp_path, monkeypatch
) -> None:
    from prometheus_client import values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: 101))
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    one = DeliveryMetrics(CollectorRegistry())
    one.record("succeeded", "t.ok", 0.5, 0.1)
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: 102))
    other = DeliveryMetrics(CollectorRegistry())  # another process, as it were
    other.record("succeeded", "t.ok", 1.5, 0.2)
    other.record("dead", "t.ok", None, None)
    fire_one(OrderPlaced(order_id=1))
    got = samples(generate_latest(multiprocess_registry()).decode())
    assert counted(got, "t.ok", "default", "succeeded") == 2
    assert counted(got, "t.ok", "default", "dead") == 1
    assert observed(got, "duration", "t.ok", "default") == 2
    assert (
        got[
            "domain_events_delivery_duration_seconds_sum",
            (("lane", "default"), ("receiver", "t.ok")),
        ]
        == 2.0
    )
    assert got["domain_events_owed", (("lane", "default"), ("receiver", "t.ok"))] == 1


# deliver_events --metrics-port: refused before anything starts.


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http", "80.5"])
def test_a_bad_metrics_port_is_refused(port: str) -> None:
    with pytest.raises(CommandError, match="--metrics-port takes a port from 1 to 65535"):
        command("deliver_events", "--once", "--metrics-port", port)


def test_a_metrics_address_needs_a_port() -> None:
    with pytest.raises(CommandError, match="--metrics-addr goes with --metrics-port"):
        command("deliver_events", "--once", "--metrics-addr", "127.0.0.1")


def test_a_metrics_port_in_use_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"Cannot serve metrics on 127.0.0.1 port {port}"):
            command(
                "deliver_events",
                "--once",
                "--metrics-port",
                str(port),
                "--metrics-addr",
                "127.0.0.1",
            )


@pytest.mark.parametrize("flags", [["--record-metrics"], ["--metrics-port", "9"]])
def test_a_multiprocess_dir_that_is_no_directory_is_refused(flags, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(CommandError, match="PROMETHEUS_MULTIPROC_DIR=.* is not a directory"):
        command("deliver_events", "--once", *flags)


def test_each_declared_schedule_has_late_failing_paused_and_last_fired_gauges() -> None:
    from datetime import UTC, datetime

    from django_domain_events import fire_due_ticks, pause_schedule, recurring
    from tests.app.events import ReportDue

    @recurring(every=timedelta(minutes=1), key="t.minutely")
    def minutely(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    @recurring(every=timedelta(minutes=1), key="t.broken")
    def broken(tick: datetime) -> ReportDue:
        raise RuntimeError("no report today")

    start = timezone.now().astimezone(UTC).replace(second=0, microsecond=0)
    fire_due_ticks(now=start - timedelta(minutes=10, seconds=30))
    fire_due_ticks(now=start - timedelta(minutes=9, seconds=50))  # one tick each; then nothing
    pause_schedule("t.broken")
    into = CollectorRegistry(auto_describe=True)
    register(into)
    got = samples(generate_latest(into).decode())

    def value(name: str, key: str) -> float:
        return got[f"domain_events_schedule_{name}", (("schedule", key),)]

    assert value("late", "t.minutely") == 1  # nothing fired it for nine minutes
    assert value("failing", "t.minutely") == 0 and value("paused", "t.minutely") == 0
    fired = (start - timedelta(minutes=10)).timestamp()
    assert value("last_fired_timestamp_seconds", "t.minutely") == fired
    assert value("failing", "t.broken") == 1 and value("paused", "t.broken") == 1
    assert value("late", "t.broken") == 0  # paused: never late
    assert (
        "domain_events_schedule_last_fired_timestamp_seconds",
        (("schedule", "t.broken"),),
    ) not in got
