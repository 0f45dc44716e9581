"""``manage.py prune_events``: delete settled events whose retention has run out."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...retention import prune_events
from ..arguments import days, non_negative, positive
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = "Delete settled events past their retention; owed and scheduled work is kept."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, help="Window instead of RETENTION_DAYS.")
        parser.add_argument("--limit", type=int, help="At most N events.")
        parser.add_argument("--batch-size", type=int, help="Rows per batch.")

    def handle(self, *args: Any, **options: Any) -> None:
        window = days(options["days"], "--days")
        limit = non_negative(options["limit"], "--limit")
        batch_size = positive(options["batch_size"], "--batch-size")
        count = prune_events(window, limit=limit, batch_size=batch_size)
        self.stdout.write(f"pruned: {count} events")
