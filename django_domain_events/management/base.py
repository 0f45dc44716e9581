"""The base of the package's commands: output that may be piped into ``head``, a broken
setting said in one line, and the way they print an age and a time."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

#: What a shell reports for a writer its reader left: killed by SIGPIPE (128 + 13).
CLOSED_PIPE_EXIT = 141


class OutboxCommand(BaseCommand):
    """A command whose reader may stop early (``events_status | head -1``).

    Python turns the closed pipe into a ``BrokenPipeError`` at the next write or at the
    final flush; the command then ends quietly with the conventional status instead of
    a traceback, as a command-line tool killed by SIGPIPE would. A setting that cannot be
    used (``ImproperlyConfigured``, met under ``--skip-checks``) is one ``CommandError``
    line, as ``manage.py check`` would have said it.
    """

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            output = super().execute(*args, **options)
            self.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from error
        except BrokenPipeError:
            # Nothing more can reach the reader; keep the exit flush from failing again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(CLOSED_PIPE_EXIT)
        return output


def age(oldest: datetime | None, now: datetime) -> str:
    """How long ago ``oldest`` was, in its largest whole unit (``3h``); ``-`` for None."""
    if oldest is None:
        return "-"
    seconds = max(0, int((now - oldest).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def shown_in(value: datetime | None, zone: ZoneInfo) -> str:
    """``value`` in ISO 8601 in ``zone`` (a schedule's times as its users read them)."""
    return value.astimezone(zone).isoformat() if value is not None else "-"
