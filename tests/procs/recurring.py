"""The recurring schedule, its receiver and a simulated clock, the same in the test
process and in the relay children (tests/test_recurring_processes.py).

A child's clock is driven by the environment, so that several relays, restarted at any
moment, share one simulated time line: ``DDE_CLOCK_START`` (ISO) is the simulated time
at the real instant ``DDE_CLOCK_EPOCH`` (Unix seconds; before it the clock stands at the
start), from which it runs ``DDE_CLOCK_SPEED`` simulated seconds per real second (0: it
stands still) until it stops at ``DDE_CLOCK_END`` (ISO, optional).
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction

from django_domain_events import clock, receiver, recurring
from tests.app.events import ReportDue
from tests.procs.receivers import record

MINUTELY_KEY = "tests.minutely"
REPORT_KEY = "tests.report_delivered"
HOLD_SECONDS = 120.0  # how long a held builder waits at most


def build_report(tick: datetime) -> ReportDue:
    """The minutely schedule's builder.

    ``DDE_TICK_HOLD`` names a file: while it exists, the builder writes ``<file>.held`` (the
    tick) and sleeps, inside the tick's transaction. ``DDE_TICK_LOG`` names a file the pid
    and the tick are appended to once the tick's transaction commits.
    """
    hold = os.environ.get("DDE_TICK_HOLD")
    if hold and Path(hold).exists():
        Path(f"{hold}.held").write_text(tick.isoformat())
        deadline = time.monotonic() + HOLD_SECONDS
        while Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    log = os.environ.get("DDE_TICK_LOG")
    if log:
        line = f"{os.getpid()} {tick.isoformat()}\n"

        def committed() -> None:
            with open(log, "a") as out:
                out.write(line)

        transaction.on_commit(committed)
    return ReportDue(tick=tick.isoformat())


def declare_minutely() -> str:
    """Every minute, each missed tick fired on catch-up (up to a day and more)."""
    recurring(every=timedelta(minutes=1), catch_up="all", catch_up_limit=2000, key=MINUTELY_KEY)(
        build_report
    )
    return MINUTELY_KEY


def declare_report_receiver() -> None:
    """One Delivered row per delivery of a tick's event; its unique delivery id would
    refuse a delivery that ran twice."""
    receiver(ReportDue, key=REPORT_KEY, takes_context=True)(record)


def simulated_now(start: datetime, epoch: float, speed: float, end: datetime | None) -> datetime:
    """The simulated time now (aware): ``start`` at the real instant ``epoch``, then
    ``speed`` simulated seconds per real second, never past ``end``."""
    moment = start + timedelta(seconds=max(0.0, time.time() - epoch) * speed)
    return moment if end is None else min(moment, end)


def install_clock_from_env() -> None:
    """Make ``django_domain_events.clock.now`` the simulated clock the environment
    describes (module docstring); nothing without ``DDE_CLOCK_START``."""
    if not os.environ.get("DDE_CLOCK_START"):
        return
    start = datetime.fromisoformat(os.environ["DDE_CLOCK_START"])
    epoch = float(os.environ.get("DDE_CLOCK_EPOCH") or time.time())
    speed = float(os.environ.get("DDE_CLOCK_SPEED", "1"))
    end = (
        datetime.fromisoformat(os.environ["DDE_CLOCK_END"])
        if os.environ.get("DDE_CLOCK_END")
        else None
    )

    def now() -> datetime:
        return clock.normalize(simulated_now(start, epoch, speed, end))

    clock.now = now  # every module calls clock.now() through the module


def clock_env(
    start: datetime, *, speed: float = 0.0, epoch: float | None = None, end: datetime | None = None
) -> dict[str, str]:
    """The environment of a child whose clock ``install_clock_from_env`` drives."""
    env = {
        "DDE_CLOCK_START": start.isoformat(),
        "DDE_CLOCK_SPEED": repr(speed),
        "DDE_CLOCK_EPOCH": repr(epoch if epoch is not None else time.time()),
    }
    if end is not None:
        env["DDE_CLOCK_END"] = end.isoformat()
    return env
