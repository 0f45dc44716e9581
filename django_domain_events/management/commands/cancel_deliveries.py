"""``manage.py cancel_deliveries ID... --receiver KEY``: withdraw work known to be moot."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandParser

from ...operations import cancel_deliveries
from ..arguments import existing_events, receiver_of_events
from ..base import OutboxCommand


class _Once(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option} is given once; run the command again for another receiver.")
        setattr(namespace, self.dest, values)


class Command(OutboxCommand):
    help = "Cancel the owed deliveries of these events; claimed ones are counted in flight."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+", type=int, metavar="ID", help="Event ids.")
        parser.add_argument("--receiver", action=_Once, metavar="KEY", help="Only this receiver.")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = existing_events(options["ids"])
        key = options["receiver"] and receiver_of_events(options["receiver"], ids, or_rows=True)
        result = cancel_deliveries(ids, receiver_key=key)
        self.stdout.write(f"cancelled: {result['cancelled']}, in_flight: {result['in_flight']}")
