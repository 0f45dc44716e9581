"""Prometheus metrics for the outbox.

Two kinds:

- Gauges of ``outbox_health()``, read from the database at scrape time
  (``OutboxCollector``). Serve them with the view, or add the collector to the registry
  an exporter already serves (``prometheus_client.REGISTRY`` by default)::

      from django_domain_events.contrib.prometheus import metrics_view, register

      urlpatterns = [path("metrics/events", metrics_view)]   # this package's metrics only
      register()                                              # or: into the default registry

  Every figure is read from the database, so any process reports the same numbers
  however many relays run: scrape one target. A read costs what ``outbox_health()``
  costs: four queries, whatever the size of the history or the schedule (two more when
  ``@recurring`` schedules are declared, each of which gets ``schedule_late``,
  ``schedule_failing``, ``schedule_paused`` and ``schedule_last_fired_timestamp_seconds``;
  two more when limits are declared, by receivers (``rate_limit=``, ``concurrency_limit=``),
  groups (``LIMIT_GROUPS``) or lanes (``LANE_LIMITS``), each of which gets
  ``limit_running``, ``limit_waiting``, ``limit_paused``, and ``limit_concurrency`` or
  ``limit_tokens`` as it declares, its ``receiver`` label the limit's key: the
  receiver's, ``group:<name>`` or ``lane:<name>``).
  A collector reads at most once every ``SCRAPE_CACHE_SECONDS`` and one scrape at a
  time; the scrapes in between are answered from that read, so a scrape storm costs the
  database no more than one scraper does.

- Rates, counted in the process that delivers (``instrument()``, ``DeliveryMetrics``):
  deliveries by receiver, lane and outcome, and histograms of how long receivers ran
  and how late after their due time they started, fed by the delivery signals.
  ``deliver_events --metrics-port P`` instruments the relay and serves both kinds on
  ``P`` (``serve()``). With ``PROMETHEUS_MULTIPROC_DIR`` set, the counts of every
  process writing to that directory are served together (``multiprocess_registry()``).

This module imports ``prometheus_client``; the package imports it only when asked to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.metrics_core import Metric
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import REGISTRY
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_domain_events.contrib.prometheus needs prometheus-client: "
        "pip install 'django-domain-outbox[prometheus]'"
    ) from exc

from django.db import connections
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse

from .. import clock, signals
from ..declare import registry
from ..introspect import OutboxHealth, outbox_health

PREFIX = "domain_events"
SCRAPE_CACHE_SECONDS = 5.0  # a collector reads the database at most this often
LABELS = ["receiver", "lane"]

_PER_RECEIVER = {
    "owed": "Deliveries due now and not settled (pending, failed or claimed).",
    "scheduled": "Deliveries whose due time is still ahead: booked, not late.",
    "claimed": "Deliveries a worker holds right now (also counted in owed).",
    "dead": "Dead letters, plus owed deliveries already past their lifetime.",
    "oldest_owed_age_seconds": "Age of the oldest owed delivery, from its due time; 0 if none.",
}


class OutboxCollector:
    """A collector that turns one ``outbox_health()`` call into gauges, per receiver and lane.

    The read is kept for ``SCRAPE_CACHE_SECONDS`` and made by one scrape at a time: the
    others wait for it and answer from it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health: OutboxHealth | None = None
        self._read_at = float("-inf")  # time.monotonic() of the read kept

    def describe(self) -> list[Metric]:
        """The metric names without their samples, so registering never touches the database."""
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        """Read ``outbox_health()`` now and yield its figures.

        A database connection this opens is closed again: exporters such as
        prometheus_client's HTTP server collect in a new thread per scrape, whose
        connection nobody else would close.
        """
        health = self._read()
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
        for limit in health.limits:
            families["limit_running"].add_metric([limit.key], limit.running)
            families["limit_waiting"].add_metric([limit.key], limit.waiting)
            families["limit_paused"].add_metric([limit.key], int(limit.paused_until is not None))
            if limit.concurrency_limit is not None:
                families["limit_concurrency"].add_metric([limit.key], limit.concurrency_limit)
            if limit.tokens is not None:
                families["limit_tokens"].add_metric([limit.key], limit.tokens)
        for schedule in health.schedules:
            if not schedule.declared:
                continue
            for name in ("late", "failing", "paused"):
                families[f"schedule_{name}"].add_metric([schedule.key], getattr(schedule, name))
            if schedule.last_fired is not None:
                families["schedule_last_fired_timestamp_seconds"].add_metric(
                    [schedule.key], schedule.last_fired.timestamp()
                )
        yield from families.values()

    def _read(self) -> OutboxHealth:
        with self._lock:
            if self._health is None or time.monotonic() - self._read_at >= SCRAPE_CACHE_SECONDS:
                with _closing_what_it_opens():
                    self._health = outbox_health()
                self._read_at = time.monotonic()
            return self._health


@contextlib.contextmanager
def _closing_what_it_opens() -> Iterator[None]:
    """Close the database connections opened inside the block, in this thread, after it."""
    closed = {conn.alias for conn in connections.all() if conn.connection is None}
    try:
        yield
    finally:
        for conn in connections.all(initialized_only=True):
            if conn.alias in closed and conn.connection is not None and not conn.in_atomic_block:
                with contextlib.suppress(Exception):
                    conn.close()


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
    for name, text in _PER_LIMIT.items():
        families[f"limit_{name}"] = GaugeMetricFamily(
            f"{PREFIX}_limit_{name}", text, labels=["receiver"]
        )
    for name, text in _PER_SCHEDULE.items():
        families[f"schedule_{name}"] = GaugeMetricFamily(
            f"{PREFIX}_schedule_{name}", text, labels=["schedule"]
        )
    return families


# Labelled by the limit's key: a receiver's, "group:<name>" or "lane:<name>".
_PER_LIMIT = {
    "running": "Rows of the limit's receivers under a live lease, across every relay.",
    "waiting": "Rows of the limit's receivers owed and not claimed: waiting for the limit.",
    "paused": "1 while a RetryAfter holds the limit's rows back from every relay.",
    "concurrency": "The limit's concurrency_limit.",
    "tokens": "The limit's rate_limit bucket now: rows it may start at once.",
}

_PER_SCHEDULE = {
    "late": "1 when the @recurring schedule's next tick is overdue: no relay is firing it.",
    "failing": "1 when the schedule's newest failed tick is newer than its newest fired one.",
    "paused": "1 while the schedule is paused.",
    "last_fired_timestamp_seconds": "When the schedule's newest fired tick was due (Unix time).",
}

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


# Rates: counted where deliveries run, fed by the delivery signals.

logger = logging.getLogger("django_domain_events.metrics")

OUTCOMES = ("succeeded", "failed", "dead")
# Receivers run from milliseconds up to RUN_LIMIT_SECONDS (an hour by default).
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
)  # fmt: skip
# From a woken relay's few milliseconds to a backlog of hours.
LAG_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    21600.0, 86400.0,
)  # fmt: skip


class DeliveryMetrics:
    """Deliveries by receiver, lane and outcome, and how long and how late they ran.

    - ``domain_events_deliveries_total{receiver, lane, outcome}``: a Counter of
      attempts by outcome: ``succeeded``, ``failed`` (attempts left) or ``dead``
      (including rows dead-lettered without running).
    - ``domain_events_delivery_duration_seconds{receiver, lane}``: a Histogram of how
      long the receiver ran, one observation per attempt that ran, whatever its outcome.
    - ``domain_events_delivery_lag_seconds{receiver, lane}``: a Histogram of the time
      from a row's due time to the start of its attempt, for the same attempts.

    Fed by ``delivery_succeeded``, ``delivery_failed`` and ``delivery_dead`` once
    ``connect()``-ed (``instrument()`` does both). Prometheus metrics are thread-safe, so
    a relay's worker threads (``--concurrency``) may count at once.
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.registry = registry
        self.deliveries = Counter(
            f"{PREFIX}_deliveries",
            "Delivery attempts by outcome: succeeded, failed (attempts left) or dead "
            "(dead-lettered, whether it ran or not).",
            labelnames=[*LABELS, "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            f"{PREFIX}_delivery_duration_seconds",
            "How long the receiver ran, per attempt that ran.",
            labelnames=LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.lag = Histogram(
            f"{PREFIX}_delivery_lag_seconds",
            "Seconds from a delivery's due time to the start of its attempt.",
            labelnames=LABELS,
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self._handlers: list[tuple[Signal, Callable[..., None]]] = []
        self._lock = threading.Lock()

    def record(
        self, outcome: str, receiver_key: str, duration: float | None, lag: float | None
    ) -> None:
        """Count one outcome; observe its duration and lag unless None (nothing ran)."""
        labels = (receiver_key, _lane(receiver_key))
        self.deliveries.labels(*labels, outcome).inc()
        if duration is not None:
            self.duration.labels(*labels).observe(duration)
        if lag is not None:
            self.lag.labels(*labels).observe(lag)

    def declare_receivers(self) -> None:
        """Start every durable receiver's series at zero, so the first delivery shows as an
        increase rather than as a series appearing."""
        for declared in registry.receivers:
            if declared.durable:
                labels = (declared.key, declared.lane)
                for outcome in OUTCOMES:
                    self.deliveries.labels(*labels, outcome)
                self.duration.labels(*labels)
                self.lag.labels(*labels)

    def connect(self) -> None:
        """Listen to the delivery signals (again a no-op)."""
        with self._lock:
            if self._handlers:
                return
            for signal, outcome in (
                (signals.delivery_succeeded, "succeeded"),
                (signals.delivery_failed, "failed"),
                (signals.delivery_dead, "dead"),
            ):
                handler = self._handler(outcome)
                signal.connect(handler, weak=False)
                self._handlers.append((signal, handler))

    def disconnect(self) -> None:
        """Stop listening; the metrics keep their values."""
        with self._lock:
            for signal, handler in self._handlers:
                signal.disconnect(handler)
            self._handlers.clear()

    def _handler(self, outcome: str) -> Callable[..., None]:
        def handler(
            sender: Any,
            *,
            receiver_key: str,
            duration: float | None = None,
            lag: float | None = None,
            **kwargs: Any,
        ) -> None:
            self.record(outcome, receiver_key, duration, lag)

        return handler


def _lane(receiver_key: str) -> str:
    declared = registry.receiver(receiver_key)
    return declared.lane if declared is not None else "default"


_instrumented: dict[int, DeliveryMetrics] = {}
_instrument_lock = threading.Lock()


def instrument(into: CollectorRegistry = REGISTRY) -> DeliveryMetrics:
    """Count this process's deliveries into ``into``: the delivery metrics, created and
    connected to the delivery signals once per registry (a second call returns them).

    ``deliver_events --metrics-port`` calls it; call it yourself where you deliver
    otherwise (``run_relay()`` in your own process, a worker calling
    ``deliver_pending()``), before the first delivery. Raises ``ValueError`` when
    ``PROMETHEUS_MULTIPROC_DIR`` names no directory.
    """
    with _instrument_lock:
        metrics = _instrumented.get(id(into))
        if metrics is None:
            multiprocess_dir()  # a bad directory is refused now, not at the first delivery
            metrics = DeliveryMetrics(into)
            metrics.declare_receivers()
            metrics.connect()
            _instrumented[id(into)] = metrics
        return metrics


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (prometheus_client then counts in files);
    ``ValueError`` when it names no directory, where counting would fail at the first
    delivery."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    if path is not None and not os.path.isdir(path):
        raise ValueError(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory: create it, empty, "
            "before the processes that count into it start."
        )
    return path


def multiprocess_registry() -> CollectorRegistry:
    """A registry for serving in multiprocess mode: the counts every process wrote to
    ``PROMETHEUS_MULTIPROC_DIR`` summed, and the outbox gauges, read once from the
    database (gauges a collector computes are never written to the files)."""
    into = CollectorRegistry(auto_describe=True)
    MultiProcessCollector(into)
    into.register(OutboxCollector())
    return into


def serve(port: int, addr: str = "127.0.0.1") -> WSGIServer:
    """Instrument this process and serve its metrics over HTTP on ``addr:port``, from a
    daemon thread, until the process exits: any path answers, ``/metrics`` included.

    Loopback unless ``addr`` says otherwise: the server has no authentication, and the
    metrics name every receiver, lane and schedule.

    Served: the delivery metrics and the outbox gauges, plus prometheus_client's own
    process metrics; in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), the delivery
    metrics of every process writing to that directory instead of this one's, and the
    gauges. Raises ``OSError`` when the address cannot be bound.
    """
    multiprocess = multiprocess_dir() is not None
    served = multiprocess_registry() if multiprocess else REGISTRY
    server, _thread = start_http_server(port, addr, registry=served)  # bound, then counted
    if not multiprocess:
        register(REGISTRY)
    instrument()
    logger.info(
        "Serving Prometheus metrics on %s port %s%s.",
        addr,
        port,
        " (multiprocess)" if multiprocess else "",
        extra={"metrics_addr": addr, "metrics_port": port},
    )
    return server
