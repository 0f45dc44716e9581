"""A child process: call ``fire_due_ticks(now=...)`` on the minutely schedule, walking a clock.

Usage: fire_ticks.py FIRST STEP_SECONDS STEPS
Calls fire_due_ticks(now=FIRST) (an ISO instant), then at FIRST + k * STEP_SECONDS for k
from 1 to STEPS, and prints the counts fired, one per call, as a JSON list.
Environment: DDE_READY_FILE and DDE_GO_FILE, as ``tests.procs.ready_then_go`` reads them,
so that every child makes its first call at the same moment.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta

import django

django.setup()

from django_domain_events import fire_due_ticks  # noqa: E402
from tests.procs import ready_then_go  # noqa: E402
from tests.procs.recurring import declare_minutely  # noqa: E402

declare_minutely()
first = datetime.fromisoformat(sys.argv[1])
step = timedelta(seconds=float(sys.argv[2]))
ready_then_go()
counts = [fire_due_ticks(now=first + k * step) for k in range(int(sys.argv[3]) + 1)]
print(json.dumps(counts))
