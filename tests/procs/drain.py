"""A child process: declare the recording receiver, then drain until nothing is owed.

Usage: drain.py WORKER_ID
Environment: DDE_READY_FILE and DDE_GO_FILE, as ``tests.procs.ready_then_go`` reads them.
"""

from __future__ import annotations

import sys

import django

django.setup()

from django_domain_events import deliver_pending  # noqa: E402
from tests.procs import ready_then_go  # noqa: E402
from tests.procs.receivers import declare_recorder  # noqa: E402

declare_recorder()
ready_then_go()
counts = deliver_pending(worker_id=sys.argv[1], batch_size=50)
print(counts["succeeded"] if "succeeded" in counts else sum(counts.values()))
