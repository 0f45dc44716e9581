"""Prometheus metrics for the outbox: ``outbox_health()``, read at scrape time.

Serve them with the view, or add the collector to the registry an exporter already
serves (``prometheus_client.REGISTRY`` by default)::

    from django_domain_events.contrib.prometheus import metrics_view, register

    urlpatterns = [path("metrics/events", metrics_view)]   # this package's metrics only
    register()                                              # or: into the default registry

Every figure is read from the database, so any process reports the same numbers however
many relays run: scrape one target. A scrape costs what ``outbox_health()`` costs: four
queries, whatever the size of the history or the schedule.
"""

from __future__ import annotations

from collections.abc import Iterator

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import REGISTRY
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_domain_events.contrib.prometheus needs prometheus-client: "
        "pip install django-domain-outbox[prometheus]"
    ) from exc

from django.http import HttpRequest, HttpResponse

from .. import clock
from ..declare import registry
from ..introspect import outbox_health

PREFIX = "domain_events"
LABELS = ["receiver", "lane"]

_PER_RECEIVER = {
    "owed": "Deliveries due now and not settled (pending, failed or claimed).",
    "scheduled": "Deliveries whose due time is still ahead: booked, not late.",
    "claimed": "Deliveries a worker holds right now (also counted in owed).",
    "dead": "Dead letters, plus owed deliveries already past their lifetime.",
    "oldest_owed_age_seconds": "Age of the oldest owed delivery, from its due time; 0 if none.",
}


class OutboxCollector:
    """A collector that turns one ``outbox_health()`` call into gauges, per receiver and lane."""

    def describe(self) -> list[Metric]:
        """The metric names without their samples, so registering never touches the database."""
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        """Read ``outbox_health()`` now and yield its figures."""
        health = outbox_health()
        now = clock.now()
        families = _families()
        for backlog in health.receivers:
            declared = registry.receiver(backlog.key)
            labels = [backlog.key, declared.lane if declared is not None else "default"]
            age = (now - backlog.oldest_owed_at).total_seconds() if backlog.oldest_owed_at else 0.0
            families["owed"].add_metric(labels, backlog.owed)
            families["scheduled"].add_metric(labels, backlog.scheduled)
            families["claimed"].add_metric(labels, backlog.claimed)
            families["dead"].add_metric(labels, backlog.dead)
            families["oldest_owed_age_seconds"].add_metric(labels, max(age, 0.0))
        families["lapsed_leases"].add_metric([], health.lapsed_leases)
        for lane in health.lanes:
            families["lane_paused_relays"].add_metric([lane.lane], len(lane.pauses))
        yield from families.values()


def _families() -> dict[str, GaugeMetricFamily]:
    families = {
        name: GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=LABELS)
        for name, text in _PER_RECEIVER.items()
    }
    families["lapsed_leases"] = GaugeMetricFamily(
        f"{PREFIX}_lapsed_leases",
        "Claimed deliveries whose lease ran out: a relay died, or a receiver outran its lease.",
        labels=[],
    )
    families["lane_paused_relays"] = GaugeMetricFamily(
        f"{PREFIX}_lane_paused_relays",
        "Relays holding the lane back after RetryAfter(counts=False).",
        labels=["lane"],
    )
    return families


_registered: dict[int, OutboxCollector] = {}


def register(into: CollectorRegistry = REGISTRY) -> OutboxCollector:
    """Add the outbox collector to ``into`` once; calling it again returns the same one."""
    if id(into) not in _registered:
        collector = OutboxCollector()
        into.register(collector)
        _registered[id(into)] = collector
    return _registered[id(into)]


_OWN = CollectorRegistry(auto_describe=False)
_OWN.register(OutboxCollector())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """This package's metrics in the format the scraper asks for (text or OpenMetrics).

    The receiver keys are visible to whoever can reach it: mount it where only your
    monitoring can, or wrap it (``staff_member_required``, a network rule).
    """
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(_OWN), content_type=content_type)
