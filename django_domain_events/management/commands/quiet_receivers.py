"""``manage.py quiet_receivers``: durable receivers with no recent success."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...introspect import quiet_receivers


class Command(BaseCommand):
    help = "List durable receivers with no success in the window (default RETENTION_DAYS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, help="The window, in days.")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"]
        if days is not None and days <= 0:
            raise CommandError(f"--days must be a positive number of days, not {days:g}.")
        quiet = quiet_receivers(within=timedelta(days=days) if days else None)
        if not quiet:
            self.stdout.write("Every durable receiver succeeded inside the window.")
        for row in quiet:
            last = row.last_succeeded_at.isoformat() if row.last_succeeded_at else "never"
            self.stdout.write(f"{row.key} ({row.event_name}): last succeeded {last}")
