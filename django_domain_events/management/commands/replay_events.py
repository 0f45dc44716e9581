"""``manage.py replay_events ID...``: deliver events again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...operations import replay_events
from ..arguments import existing_events, receiver_of_events
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = "Reopen the settled deliveries of these events and add any that are missing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+", type=int, metavar="ID", help="Event ids.")
        parser.add_argument(
            "--receiver",
            action="append",
            dest="receivers",
            metavar="KEY",
            help="Only this receiver (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids = existing_events(options["ids"])
        keys = [
            receiver_of_events(key, ids, or_rows=False) for key in options["receivers"] or []
        ] or None
        try:
            result = replay_events(ids, receiver_keys=keys)
        except (LookupError, TypeError, ValueError) as error:  # e.g. a due= callable refusing
            raise CommandError(str(error)) from error
        self.stdout.write(f"reopened: {result['reopened']}, added: {result['added']}")
