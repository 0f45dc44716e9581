"""A child process: declare the tests' receivers, then run ``manage.py deliver_events``.

Usage: relay.py [deliver_events arguments...]
Environment: DDE_SLOW_SECONDS makes the recorder sleep before writing (default 0);
DDE_READY_FILE, when set, is created once the relay is about to start; with DDE_GO_FILE
it then waits for that file (``tests.procs.ready_then_go``).
"""

from __future__ import annotations

import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from tests.procs import ready_then_go  # noqa: E402
from tests.procs.receivers import declare_all  # noqa: E402

declare_all()
ready_then_go()
call_command("deliver_events", *sys.argv[1:])
