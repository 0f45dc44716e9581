"""A child process: declare the tests' receivers, then run ``manage.py deliver_events``.

Usage: relay.py [deliver_events arguments...]
Environment: DDE_SLOW_SECONDS makes the recorder sleep before writing (default 0);
DDE_READY_FILE, when set, is created once the relay is about to start; with DDE_GO_FILE
it then waits for that file (``tests.procs.ready_then_go``); DDE_RECEIVERS=run_log
declares only the run logger (tests.procs.receivers.log_run), DDE_RECEIVERS=async_run_log
only its async def twin (log_run_async), DDE_RECEIVERS=faulty the run logger and
the receivers that fail outside a plain exception (declare_faulty),
DDE_RECEIVERS=crash_or_log only the receiver that ends its process on one row
(crash_or_log, with DDE_POISON_N), DDE_RECEIVERS=batch_run_log the run logger with
ack="batch", DDE_RECEIVERS=with_failing
adds an always failing receiver on the mail lane (declare_failing), DDE_RECEIVERS=limited
a limited receiver and a free one (declare_limited, with DDE_RATE_LIMIT and
DDE_CONCURRENCY_LIMIT), DDE_RECEIVERS=grouped two receivers of the limit group ``sms``
(declare_grouped), DDE_RECEIVERS=ordered the ordered receiver (tests.procs.ordered);
DDE_SPANS_FILE, when
set, turns contrib.opentelemetry on and writes the spans there as JSON lines.

For the recurring schedules (tests.procs.recurring): DDE_RECEIVERS=report declares only
the receiver of the tick events (declare_report_receiver); DDE_SCHEDULE=minutely declares
the minutely schedule (declare_minutely, with its DDE_TICK_HOLD and DDE_TICK_LOG knobs);
DDE_CLOCK_START, DDE_CLOCK_EPOCH, DDE_CLOCK_SPEED and DDE_CLOCK_END drive the package's
clock (install_clock_from_env), so that several relays share one simulated time line.
"""

from __future__ import annotations

import os
import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from tests.procs import ready_then_go  # noqa: E402
from tests.procs.receivers import (  # noqa: E402
    declare_all,
    declare_async_run_logger,
    declare_batch_run_logger,
    declare_crash_or_log,
    declare_failing,
    declare_faulty,
    declare_grouped,
    declare_limited,
    declare_run_logger,
)
from tests.procs.recurring import (  # noqa: E402
    declare_minutely,
    declare_report_receiver,
    install_clock_from_env,
)

if os.environ.get("DDE_CLOCK_AHEAD"):
    # This host's clock runs ahead by that many seconds: the clock every part of the
    # package reads (tests/test_clock_processes.py).
    from datetime import timedelta

    from django.utils import timezone

    _real_now = timezone.now
    _ahead = timedelta(seconds=float(os.environ["DDE_CLOCK_AHEAD"]))
    timezone.now = lambda: _real_now() + _ahead

if os.environ.get("DDE_SPANS_FILE"):
    from tests.procs.spans import export_spans_to

    export_spans_to(os.environ["DDE_SPANS_FILE"])
install_clock_from_env()
if os.environ.get("DDE_RECEIVERS") == "run_log":
    declare_run_logger()
elif os.environ.get("DDE_RECEIVERS") == "report":
    declare_report_receiver()
elif os.environ.get("DDE_RECEIVERS") == "async_run_log":
    declare_async_run_logger()
elif os.environ.get("DDE_RECEIVERS") == "limited":
    declare_limited()
elif os.environ.get("DDE_RECEIVERS") == "grouped":
    declare_grouped()
elif os.environ.get("DDE_RECEIVERS") == "faulty":
    declare_run_logger()
    declare_faulty()
elif os.environ.get("DDE_RECEIVERS") == "batch_run_log":
    declare_batch_run_logger()
elif os.environ.get("DDE_RECEIVERS") == "crash_or_log":
    declare_crash_or_log()
elif os.environ.get("DDE_RECEIVERS") == "ordered":
    from tests.procs.ordered import declare_ordered

    declare_ordered()
else:
    declare_all()
if os.environ.get("DDE_RECEIVERS") == "with_failing":
    declare_failing()
if os.environ.get("DDE_SCHEDULE") == "minutely":
    declare_minutely()
ready_then_go()
call_command("deliver_events", *sys.argv[1:])
