"""``manage.py requeue_dead``: give dead deliveries a fresh budget, owed now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...operations import requeue_dead
from ..arguments import known_receiver, non_negative
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = "Requeue dead deliveries: attempts reset, owed at once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--receiver", metavar="KEY", help="Only this receiver's.")
        parser.add_argument("--limit", type=int, help="At most N rows, lowest delivery id first.")

    def handle(self, *args: Any, **options: Any) -> None:
        limit = non_negative(options["limit"], "--limit")
        key = options["receiver"] and known_receiver(options["receiver"])
        count = requeue_dead(receiver_key=key, limit=limit)
        self.stdout.write(f"requeued: {count}")
