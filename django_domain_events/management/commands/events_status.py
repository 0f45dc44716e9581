"""``manage.py events_status``: is delivery keeping up?"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandParser

from ... import clock
from ...introspect import OutboxHealth, outbox_health
from ...tally import recount
from ..base import OutboxCommand


def _age(oldest: datetime | None, now: datetime) -> str:
    if oldest is None:
        return "-"
    seconds = max(0, int((now - oldest).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Command(OutboxCommand):
    help = "Print the outbox's totals, a line per lane and a line per receiver."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=["text", "json"], default="text")
        parser.add_argument(
            "--recount",
            action="store_true",
            help="rebuild the scheduled tally from the delivery rows first: after rows were "
            "inserted, edited or deleted by hand (on PostgreSQL fire() waits meanwhile)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["recount"]:
            counted = recount()
            self.stderr.write(f"recounted the scheduled tally: {counted} rows due in later hours")
        health = outbox_health()
        if options["format"] == "json":
            data = dataclasses.asdict(health)
            self.stdout.write(json.dumps(data, default=lambda value: value.isoformat(), indent=2))
            return
        self._text(health, clock.now())

    def _text(self, health: OutboxHealth, now: datetime) -> None:
        write = self.stdout.write
        write(
            f"owed={health.owed} scheduled={health.scheduled} claimed={health.claimed} "
            f"dead={health.dead} lapsed_leases={health.lapsed_leases} "
            f"oldest={_age(health.oldest_owed_at, now)}"
        )
        for lane in health.lanes:
            paused = (
                f" paused_by={','.join(p.worker_id for p in lane.pauses)}" if lane.pauses else ""
            )
            write(
                f"lane {lane.lane}: owed={lane.owed} scheduled={lane.scheduled} "
                f"claimed={lane.claimed} dead={lane.dead} oldest={_age(lane.oldest_owed_at, now)}"
                f"{paused}"
            )
        for row in health.receivers:
            write(
                f"receiver {row.key}: owed={row.owed} scheduled={row.scheduled} "
                f"claimed={row.claimed} dead={row.dead} oldest={_age(row.oldest_owed_at, now)}"
            )
