"""The events the benchmark fires.

``Tick`` has no receiver here: ``bench/run.py`` declares them at run time, one set per
measured case of sections 1-4, and forgets them afterwards, so each case owes exactly the
rows it declares.

``Relayed`` has one no-op durable receiver declared here, at import, so that
autodiscovery declares it in every process alike: the benchmark's and the relay
processes it starts (``manage.py deliver_events``, sections 5-7).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from django_domain_events import DeliveryContext, event, receiver

RELAY_NOOP_KEY = "bench.relay_noop"
BULKY_KEY = "bench.bulky"


@event
@dataclass(frozen=True)
class Tick:
    n: int


@event
@dataclass(frozen=True)
class Relayed:
    n: int


@receiver(Relayed, key=RELAY_NOOP_KEY)
def relay_noop(evt: Relayed) -> None:
    """Does nothing: what is measured is the relay around it."""


@event
@dataclass(frozen=True)
class Bulky:
    """A large payload (section 8): what a relay holds in memory while it delivers."""

    blob: str


@receiver(Bulky, key=BULKY_KEY, lane="bulky")
def bulky_noop(evt: Bulky) -> None:
    """Does nothing with the payload it was given: the relay's memory is what is measured."""


@event
@dataclass(frozen=True)
class Slow:
    """Section 9: a receiver that waits 50 ms on the network, as a webhook would."""

    n: int


def _log_run(delivery_id: int | None) -> None:
    """Append the delivery id to DDE_BENCH_RUN_LOG: every run, counted outside the database."""
    path = os.environ.get("DDE_BENCH_RUN_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{delivery_id}\n")


@receiver(Slow, key="bench.slow", lane="slow", takes_context=True)
def slow_sync(evt: Slow, ctx: DeliveryContext) -> None:
    """Waits 50 ms with ``time.sleep``, which releases the GIL like a socket read."""
    time.sleep(0.05)
    _log_run(ctx.delivery_id)


@receiver(Slow, key="bench.slow_async", lane="slow_async", takes_context=True)
async def slow_async(evt: Slow, ctx: DeliveryContext) -> None:
    """Awaits 50 ms, as an ``async def`` receiver calling an HTTP API would."""
    await asyncio.sleep(0.05)
    _log_run(ctx.delivery_id)


@event
@dataclass(frozen=True)
class Trickle:
    """The low-priority trickle of section 15 (its receiver is declared there)."""

    n: int


# Section 16: a receiver limited to 50/s and an unlimited one, in one lane. -------------

METERED_KEY, UNMETERED_KEY, PACED_KEY = "bench.metered", "bench.unmetered", "bench.paced"
METERED_RATE = "50/s"


@event
@dataclass(frozen=True)
class Metered:
    """Work for a receiver limited to ``METERED_RATE`` (an SMS gateway's quota)."""

    n: int


@event
@dataclass(frozen=True)
class Unmetered:
    """Work for an unlimited receiver in the same lane as the metered one."""

    n: int


def _log_interval(key: str, start: float) -> None:
    """Append ``key start end`` to DDE_BENCH_LIMITS_LOG: each run's interval."""
    path = os.environ.get("DDE_BENCH_LIMITS_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{key} {start:.6f} {time.time():.6f}\n")


@receiver(Metered, key=METERED_KEY, lane="metered", rate_limit=METERED_RATE)
def metered(evt: Metered) -> None:
    """Does nothing but log when it ran: what is measured is the limit around it."""
    _log_interval(METERED_KEY, time.time())


@receiver(Unmetered, key=UNMETERED_KEY, lane="metered")
def unmetered(evt: Unmetered) -> None:
    """Does nothing but log when it ran."""
    _log_interval(UNMETERED_KEY, time.time())


@event
@dataclass(frozen=True)
class Paced:
    """The control of section 16: fired at the metered rate, to an unlimited receiver."""

    n: int


@receiver(Paced, key=PACED_KEY, lane="metered")
def paced(evt: Paced) -> None:
    """Does nothing but log when it ran: the same work as the metered rows, no limit."""
    _log_interval(PACED_KEY, time.time())
