"""``manage.py deliver_events``: run the relay."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...declare import registry
from ...delivery.relay import DeliveryStatus, run_relay


def _lane_size(value: str) -> tuple[str, int]:
    lane, sep, size = value.partition("=")
    if not sep or not lane or not size.strip().lstrip("-").isdigit():
        raise CommandError(
            f"--lane-batch-size takes LANE=N, for example --lane-batch-size mail=10; got {value!r}."
        )
    return lane, int(size)


class Command(BaseCommand):
    help = "Deliver owed events: the relay. Runs until SIGTERM/SIGINT unless --once or --passes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once", action="store_true", help="Deliver what is owed now, then exit."
        )
        parser.add_argument("--limit", type=int, help="With --once: deliver at most N rows.")
        parser.add_argument("--passes", type=int, help="Exit after N passes.")
        parser.add_argument("--worker-id", help="This relay's name in claims (default host:pid).")
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
        batch_size = options["batch_size"]
        if batch_size is not None and batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, not {batch_size}.")
        sizes: dict[str, int] = {}
        for value in options["lane_batch_sizes"]:
            lane, size = _lane_size(value)
            if lane in sizes:
                raise CommandError(f"--lane-batch-size gives lane {lane!r} twice; give it once.")
            if size < 1:
                raise CommandError(f"--lane-batch-size {lane}={size}: sizes must be at least 1.")
            if lane not in lanes:
                raise CommandError(
                    f"--lane-batch-size {lane}={size}, but this relay does not serve lane "
                    f"{lane!r}; add --lane {lane}, or drop the size."
                )
            sizes[lane] = size
        declared = registry.lanes()
        for lane in lanes:
            if lane not in declared:
                raise CommandError(
                    f"No receiver declares lane {lane!r}; declared lanes are "
                    f"{', '.join(sorted(declared))}. Check the spelling."
                )
        counts = run_relay(
            worker_id=options["worker_id"],
            passes=passes,
            once=once,
            lane=lanes,
            batch_size=batch_size,
            lane_batch_sizes=sizes,
            limit=limit,
        )
        done = ", ".join(f"{counts[s]} {s.value}" for s in DeliveryStatus if counts[s])
        self.stdout.write(f"Delivered: {done or 'nothing owed'}.")
