"""The base of the package's commands: output that may be piped into ``head``."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand

#: What a shell reports for a writer its reader left: killed by SIGPIPE (128 + 13).
CLOSED_PIPE_EXIT = 141


class OutboxCommand(BaseCommand):
    """A command whose reader may stop early (``events_status | head -1``).

    Python turns the closed pipe into a ``BrokenPipeError`` at the next write or at the
    final flush; the command then ends quietly with the conventional status instead of
    a traceback, as a command-line tool killed by SIGPIPE would.
    """

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            output = super().execute(*args, **options)
            self.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        except BrokenPipeError:
            # Nothing more can reach the reader; keep the exit flush from failing again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(CLOSED_PIPE_EXIT)
        return output
