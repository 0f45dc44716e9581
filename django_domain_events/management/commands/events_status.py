"""``manage.py events_status``: is delivery keeping up?"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import CommandParser

from ... import clock
from ...introspect import LimitStatus, OutboxHealth, ScheduleStatus, outbox_health
from ...recurrence import aware
from ...tally import recount
from ..base import OutboxCommand, age, shown_in


def _schedule_line(status: ScheduleStatus, now: datetime) -> str:
    """A schedule: its next and last fired tick in its zone, and what needs an operator."""
    zone = ZoneInfo(status.timezone)

    def shown(value: datetime | None) -> str:
        return shown_in(value, zone)

    upcoming = status.next_tick_at or (status.next_ticks[0] if status.next_ticks else None)
    line = f"schedule {status.key}: next={shown(upcoming)} last_fired={shown(status.last_fired)}"
    if status.paused:
        line += " paused"
    if not status.declared:
        line += " not_declared"
    if status.late and status.next_tick_at is not None:
        line += f" LATE by {age(status.next_tick_at, now)}: no relay is firing it"
    if status.failing:
        reason = status.failure.splitlines()[0] if status.failure else ""
        line += f" FAILING since the tick of {shown(status.last_failed)}: {reason}"
    return line


def _limit_line(limit: LimitStatus) -> str:
    line = f"limit {limit.key}:"
    if limit.rate_limit is not None:
        line += f" rate={limit.rate_limit} tokens={limit.tokens or 0:.1f}"
    if limit.concurrency_limit is not None:
        line += f" concurrency={limit.concurrency_limit}"
    line += f" running={limit.running} waiting={limit.waiting}"
    if limit.paused_until is not None:
        line += f" paused_until={limit.paused_until.isoformat()}"
    if limit.kind != "receiver":
        line += f" receivers={','.join(limit.members) or '-'}"
    return line


class Command(OutboxCommand):
    help = (
        "Print the outbox's totals, a line per lane, a line per receiver, a line per "
        "rate or concurrency limit, a line per held ordered key and a line per @recurring "
        "schedule."
    )

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
            f"oldest={age(health.oldest_owed_at, now)}"
        )
        for lane in health.lanes:
            paused = (
                f" paused_by={','.join(p.worker_id for p in lane.pauses)}" if lane.pauses else ""
            )
            write(
                f"lane {lane.lane}: owed={lane.owed} scheduled={lane.scheduled} "
                f"claimed={lane.claimed} dead={lane.dead} oldest={age(lane.oldest_owed_at, now)}"
                f"{paused}"
            )
        for row in health.receivers:
            write(
                f"receiver {row.key}: owed={row.owed} scheduled={row.scheduled} "
                f"claimed={row.claimed} dead={row.dead} oldest={age(row.oldest_owed_at, now)}"
                f"{'' if row.declared else ' (not declared by this relay)'}"
            )
        for limit in health.limits:
            write(_limit_line(limit))
        for held in health.held_keys:
            write(
                f"held key {held.receiver_key} {held.order_key!r}: by delivery "
                f"{held.delivery_id} ({held.status}, {held.why}), {held.waiting} waiting"
            )
        for status in health.schedules:
            write(_schedule_line(status, aware(now)))
