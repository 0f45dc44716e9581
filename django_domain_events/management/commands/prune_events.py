"""``manage.py prune_events``: delete settled events whose retention has run out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...retention import prune_events
from ..arguments import non_negative, positive


class Command(BaseCommand):
    help = "Delete settled events past their retention; owed and scheduled work is kept."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, help="Window instead of RETENTION_DAYS.")
        parser.add_argument("--limit", type=int, help="At most N events.")
        parser.add_argument("--batch-size", type=int, help="Rows per batch.")

    def handle(self, *args: Any, **options: Any) -> None:
        days = non_negative(options["days"], "--days")
        count = prune_events(
            timedelta(days=days) if days is not None else None,
            limit=non_negative(options["limit"], "--limit"),
            batch_size=positive(options["batch_size"], "--batch-size"),
        )
        self.stdout.write(f"pruned: {count} events")
