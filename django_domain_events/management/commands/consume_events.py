"""``manage.py consume_events``: record the messages of every declared subscription."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

# -v 2 shows the consumer's INFO lines, -v 3 its DEBUG lines too.
_LOG_LEVELS = {2: logging.INFO, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Consume events other services publish (subscribe() declarations) into the inbox. "
        "Runs until SIGTERM/SIGINT unless --once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--broker", metavar="NAME", help="Only this broker's subscriptions.")
        parser.add_argument("--subscription", metavar="NAME", help="Only this subscription.")
        parser.add_argument(
            "--once", action="store_true", help="Consume until each subscription is drained."
        )
        parser.add_argument("--worker-id", help="This consumer's name (default host:pid).")

    def handle(self, *args: Any, **options: Any) -> None:
        level = _LOG_LEVELS.get(options["verbosity"])
        if level is not None:
            logging.getLogger("django_domain_events").setLevel(level)
        # Imported here: nothing broker-specific loads until a consumer is asked for.
        from ...contrib.brokers.consuming import ConsumerHalted, run_consumer

        try:
            counts = run_consumer(
                broker=options["broker"],
                subscription=options["subscription"],
                once=options["once"],
                worker_id=options["worker_id"],
            )
        except (ConsumerHalted, ImproperlyConfigured) as error:
            raise CommandError(str(error)) from error
        shown = ", ".join(f"{counts[k]} {k}" for k in ("recorded", "duplicate", "dead", "ignored"))
        self.stdout.write(f"Consumed: {shown}.")
