"""``manage.py deliver_events``: run the relay."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser

from ...delivery.relay import DeliveryStatus, RelayHalted, run_relay
from ...delivery.relay_options import check_relay_options, check_shutdown_timeout, lane_slots
from ..base import OutboxCommand

# -v 2 shows the relay's INFO lines (start, stop, hand-backs), -v 3 its DEBUG lines too.
_LOG_LEVELS = {2: logging.INFO, 3: logging.DEBUG}


def _lane_numbers(values: list[str], flag: str) -> dict[str, int]:
    """``LANE=N`` arguments of ``flag`` as a dict; a lane given twice is refused."""
    found: dict[str, int] = {}
    for value in values:
        lane, sep, size = value.partition("=")
        if not sep or not lane or not size.strip().lstrip("-").isdigit():
            raise CommandError(f"{flag} takes LANE=N, for example {flag} mail=10; got {value!r}.")
        if lane in found:
            raise CommandError(f"{flag} gives lane {lane!r} twice; give it once.")
        found[lane] = int(size)
    return found


def _metrics_port(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit() or not 1 <= int(value) <= 65535:
        raise CommandError(f"--metrics-port takes a port from 1 to 65535, not {value!r}.")
    return int(value)


def _start_metrics(port: int | None, addr: str) -> None:
    """Count this relay's deliveries and, given a port, serve them (imports
    prometheus_client, so only when asked)."""
    try:
        from ...contrib import prometheus
    except ImportError as error:
        raise CommandError(str(error)) from error
    try:
        if port is None:
            prometheus.instrument()
        else:
            prometheus.serve(port, addr)
    except ValueError as error:  # PROMETHEUS_MULTIPROC_DIR names no directory
        raise CommandError(str(error)) from error
    except OSError as error:
        raise CommandError(
            f"Cannot serve metrics on {addr} port {port}: {error}. Choose another "
            "--metrics-port (each relay on a host needs its own), or --metrics-addr."
        ) from error


class Command(OutboxCommand):
    help = "Deliver owed events: the relay. Runs until SIGTERM/SIGINT unless --once or --passes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once", action="store_true", help="Deliver what is owed now, then exit."
        )
        parser.add_argument("--limit", type=int, help="With --once: deliver at most N rows.")
        parser.add_argument("--passes", type=int, help="Exit after N passes.")
        parser.add_argument(
            "--worker-id", help="This relay's name in claims (default host:pid:token)."
        )
        parser.add_argument(
            "--lane", action="append", dest="lanes", help="Serve this lane (repeatable)."
        )
        parser.add_argument("--batch-size", type=int, help="Rows claimed per batch.")
        parser.add_argument(
            "--lane-batch-size",
            action="append",
            default=[],
            dest="lane_batch_sizes",
            help="LANE=N: this lane's batch size (repeatable).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            help="Run up to N deliveries of each lane at once (default CONCURRENCY, 1).",
        )
        parser.add_argument(
            "--lane-concurrency",
            action="append",
            default=[],
            dest="lane_concurrency",
            help="LANE=N: this lane's concurrency (repeatable).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, wait at most this long for the rows being run, then "
            "exit (default SHUTDOWN_TIMEOUT_SECONDS; none: wait for them).",
        )
        parser.add_argument(
            "--metrics-port",
            metavar="PORT",
            help="Serve Prometheus metrics on this port while the relay runs: delivery "
            "counts, durations and lags, and the outbox gauges (needs prometheus-client).",
        )
        parser.add_argument(
            "--metrics-addr",
            metavar="ADDR",
            help="With --metrics-port: the address to bind (default 127.0.0.1, this host "
            "only; 0.0.0.0 listens on every interface, unauthenticated: see docs/relay.md).",
        )
        parser.add_argument(
            "--record-metrics",
            action="store_true",
            help="Count delivery metrics without serving them: with PROMETHEUS_MULTIPROC_DIR, "
            "for relays whose counts another process on the host serves.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lanes: list[str] = options["lanes"] or ["default"]
        once, limit, passes = options["once"], options["limit"], options["passes"]
        if limit is not None and not once:
            raise CommandError("--limit only goes with --once; add --once, or drop --limit.")
        if limit is not None and limit < 1:
            raise CommandError(f"--limit must be at least 1, not {limit}.")
        if passes is not None and passes < 1:
            raise CommandError(f"--passes must be at least 1, not {passes}.")
        if once and passes is not None:
            raise CommandError(
                "--once runs until nothing is owed and --passes counts passes; give one of them."
            )
        sizes = _lane_numbers(options["lane_batch_sizes"], "--lane-batch-size")
        concurrency = _lane_numbers(options["lane_concurrency"], "--lane-concurrency")
        try:
            served = check_relay_options(lanes, options["batch_size"], sizes)
            lane_slots(served, options["concurrency"], concurrency)
            check_shutdown_timeout(options["shutdown_timeout"])
        except ValueError as error:
            raise CommandError(str(error)) from error
        port = _metrics_port(options["metrics_port"])
        if options["metrics_addr"] is not None and port is None:
            raise CommandError("--metrics-addr goes with --metrics-port; add the port.")
        level = _LOG_LEVELS.get(options["verbosity"])
        if level is not None:
            logging.getLogger("django_domain_events").setLevel(level)
        if port is not None or options["record_metrics"]:
            _start_metrics(port, options["metrics_addr"] or "127.0.0.1")
        try:
            counts = run_relay(
                worker_id=options["worker_id"],
                passes=passes,
                once=once,
                lane=lanes,
                batch_size=options["batch_size"],
                lane_batch_sizes=sizes,
                limit=limit,
                concurrency=options["concurrency"],
                lane_concurrency=concurrency,
                shutdown_timeout=options["shutdown_timeout"],
            )
        except (RelayHalted, ImproperlyConfigured, ValueError) as error:
            raise CommandError(str(error)) from error
        done = ", ".join(f"{counts[s]} {s.value}" for s in DeliveryStatus if counts[s])
        self.stdout.write(f"Delivered: {done or 'nothing owed'}.")
