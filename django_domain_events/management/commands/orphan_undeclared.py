"""``manage.py orphan_undeclared [--receiver KEY ...]``: end at once the rows of receivers
this release no longer declares, instead of waiting ``ORPHAN_AFTER_SECONDS``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...operations import orphan_undeclared
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = (
        "Orphan the owed rows of receivers this release does not declare; run it only "
        "once no relay of an older or newer release that declares them is running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--receiver",
            action="append",
            metavar="KEY",
            help="Only this receiver key (repeatable); default: every undeclared key.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            orphaned = orphan_undeclared(options["receiver"])
        except ValueError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(f"orphaned: {orphaned}")
