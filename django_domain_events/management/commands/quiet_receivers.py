"""``manage.py quiet_receivers``: durable receivers with no recent success."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...introspect import quiet_receivers
from ..arguments import days
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = "List durable receivers with no success in the window (default RETENTION_DAYS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, help="The window, in days.")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = quiet_receivers(within=days(options["days"], "--days", positive=True))
        if not quiet:
            self.stdout.write("Every durable receiver succeeded inside the window.")
        for row in quiet:
            last = row.last_succeeded_at.isoformat() if row.last_succeeded_at else "never"
            self.stdout.write(f"{row.key} ({row.event_name}): last succeeded {last}")
