"""``manage.py schedules``: the ``@recurring`` schedules, their ticks; pause, resume, forget."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import CommandError, CommandParser

from ... import clock
from ...introspect import ScheduleStatus, schedule_status
from ...operations import forget_schedule, pause_schedule, resume_schedule
from ...recurrence import aware
from ..base import OutboxCommand, age, shown_in

FORMATS = ("text", "json")


class Command(OutboxCommand):
    help = (
        "List the @recurring schedules: the last tick each fired, skipped and failed, and "
        "its next three; or pause, resume or forget one."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=FORMATS, default="text")
        change = parser.add_mutually_exclusive_group()
        change.add_argument(
            "--pause",
            metavar="KEY",
            help="stop the schedule firing, on every relay, until it is resumed",
        )
        change.add_argument(
            "--resume",
            metavar="KEY",
            help="let a paused schedule fire from its next tick; the ticks of the pause are "
            "recorded skipped",
        )
        change.add_argument(
            "--forget",
            metavar="KEY",
            help="delete the cursor row of a schedule no longer declared (its tick rows stay "
            "until pruned)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["format"] not in FORMATS:  # call_command(format=...) skips argparse
            raise CommandError(
                f"--format {options['format']!r} is not a format; use one of {', '.join(FORMATS)}."
            )
        if options.get("pause"):
            self._pause(options["pause"])
        elif options.get("resume"):
            self._resume(options["resume"])
        elif options.get("forget"):
            self._forget(options["forget"])
        elif options["format"] == "json":
            self._json(schedule_status())
        else:
            self._text(schedule_status())

    # pause and resume ----------------------------------------------------------

    def _pause(self, key: str) -> None:
        try:
            paused = pause_schedule(key)
        except ValueError as error:
            raise CommandError(f"{error} Nothing was paused.") from None
        if paused:
            self.stdout.write(f"Paused {key}.")
        else:
            self.stdout.write(f"{key} was already paused.")

    def _forget(self, key: str) -> None:
        try:
            forgotten = forget_schedule(key)
        except ValueError as error:
            raise CommandError(f"{error} Nothing was deleted.") from None
        if forgotten:
            self.stdout.write(f"Forgot {key}: its cursor row is deleted; its tick rows stay.")
        else:
            self.stdout.write(f"No schedule row has the key {key!r}: nothing to forget.")

    def _resume(self, key: str) -> None:
        try:
            resumed = resume_schedule(key)
        except ValueError as error:
            raise CommandError(f"{error} Nothing was resumed.") from None
        if not resumed:
            self.stdout.write(f"{key} was not paused.")
            return
        (status,) = [s for s in schedule_status() if s.key == key]
        zone = ZoneInfo(status.timezone)
        text = f"Resumed {key}; its next tick is {shown_in(status.next_tick_at, zone)}"
        if status.skip_reason.startswith("the schedule was paused") and status.last_skipped:
            text += f"; the ticks of the pause ({_run(status, zone)}) were recorded skipped"
        self.stdout.write(text + ".")

    # the list -------------------------------------------------------------------

    def _json(self, found: tuple[ScheduleStatus, ...]) -> None:
        rows = []
        for status in found:
            zone = ZoneInfo(status.timezone)
            rows.append(
                {name: _in_zone(value, zone) for name, value in dataclasses.asdict(status).items()}
            )
        self.stdout.write(json.dumps(rows, indent=2))

    def _text(self, found: tuple[ScheduleStatus, ...]) -> None:
        if not found:
            self.stdout.write("No schedule is declared, and no cursor row is left of one.")
            return
        now = aware(clock.now())
        blocks = [self._block(status, now) for status in found]
        self.stdout.write("\n\n".join(blocks))

    def _block(self, status: ScheduleStatus, now: datetime) -> str:
        zone = ZoneInfo(status.timezone)
        head = status.key
        if not status.declared:
            head += " (not declared: no relay fires it; declare it again, or delete its rows)"
        lines = [head, f"  spec: {status.spec}", f"  catch-up: {status.catch_up or '-'}"]
        if status.paused:
            lines.append(f"  paused: since {shown_in(status.paused_at, zone)}")
        else:
            lines.append("  paused: no")
        fired = shown_in(status.last_fired, zone)
        if status.last_event_id is not None:
            fired += f" (event #{status.last_event_id})"
        lines.append(f"  last fired: {fired}")
        skipped = _run(status, zone) if status.last_skipped is not None else "-"
        if status.skip_reason:
            skipped += f" ({status.skip_reason})"
        lines.append(f"  last skipped: {skipped}")
        failed = shown_in(status.last_failed, zone)
        if status.failure:
            failed += f": {status.failure}"
        lines.append(f"  last failed: {failed}")
        if status.next_ticks:
            lines.append(f"  next: {', '.join(shown_in(t, zone) for t in status.next_ticks)}")
        else:
            lines.append(f"  next: - ({'paused' if status.paused else 'not declared'})")
        if status.late and status.next_tick_at is not None:
            overdue = age(status.next_tick_at, now)
            lines.append(
                f"  LATE: the tick of {shown_in(status.next_tick_at, zone)} is {overdue} overdue: "
                "no relay is firing it"
            )
        if status.failing:
            lines.append("  FAILING: its newest tick failed, and none has fired since")
        return "\n".join(lines)


def _run(status: ScheduleStatus, zone: ZoneInfo) -> str:
    """The last run of skipped ticks: one tick, or ``FIRST to LAST``."""
    last = shown_in(status.last_skipped, zone)
    if status.skipped_from is None or status.skipped_from == status.last_skipped:
        return last
    return f"{shown_in(status.skipped_from, zone)} to {last}"


def _in_zone(value: Any, zone: ZoneInfo) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(zone).isoformat()
    if isinstance(value, tuple | list):
        return [_in_zone(item, zone) for item in value]
    return value
