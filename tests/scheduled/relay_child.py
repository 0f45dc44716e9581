"""A child process: declare the scheduled wake receiver, then run ``manage.py deliver_events``.

Usage: relay_child.py [deliver_events arguments...]
Environment: DDE_DUE_SECONDS, the receiver's due= delay (default 2); DDE_READY_FILE, when
set, is created once the relay is about to start.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

WAKE_KEY = "scheduled.wake"


def declare(due_seconds: float) -> None:
    """The same receiver in the test process (to write the row) and in the relay (to run it)."""
    from django_domain_events import receiver
    from tests.app.events import Pinged
    from tests.procs.receivers import record

    receiver(Pinged, key=WAKE_KEY, due=timedelta(seconds=due_seconds), takes_context=True)(record)


if __name__ == "__main__":
    import django

    django.setup()

    from django.core.management import call_command

    declare(float(os.environ.get("DDE_DUE_SECONDS", "2")))
    if os.environ.get("DDE_READY_FILE"):
        open(os.environ["DDE_READY_FILE"], "w").close()
    call_command("deliver_events", *sys.argv[1:])
