"""The package's clock: every datetime it writes, compares or returns follows ``USE_TZ``.

Under ``USE_TZ = True`` datetimes are aware; under ``False`` they are naive local time
(``TIME_ZONE``), and an aware value handed in is converted to that local time.

Relays on several hosts compare each other's leases and the schedules' tick times, so
a relay reads the *database's* clock: ``synchronise`` measures the offset between this
host's clock and the database's (the sample with the shortest round trip, read at its
middle), and ``now()`` is the host's clock plus that offset. A host whose clock runs
60 s ahead then takes over no live lease and fires no tick early. A process that never
synchronises (a web worker firing events) reads its own clock. On SQLite the database
runs on this host, so the offset is nil.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections
from django.utils import timezone

MAX_UNCERTAINTY_SECONDS = 1.0  # a relay refuses to run on a reading less sure than this
SAMPLES = 5  # readings per measurement; the one with the shortest round trip wins

# The database's clock, in microseconds since the Unix epoch, whatever the session's
# time zone.
_DATABASE_NOW = {
    "postgresql": "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
    "mysql": "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
}

_offset = timedelta(0)  # add to the host's clock to read the database's
_measured_at = float("-inf")  # time.monotonic() of the last measurement
KEEP_SECONDS = 60.0  # how long ``keep_synchronised`` trusts a measurement


class ClockUnknown(RuntimeError):
    """The database's clock could not be read precisely enough to judge leases by it."""


@dataclass(frozen=True)
class Reading:
    """How far the database's clock is ahead of this host's (negative: behind)."""

    offset: float  # seconds
    uncertainty: float  # seconds either way: half the round trip of the reading


def now() -> datetime:
    """The current time by the database's clock once measured, aware or naive as
    ``USE_TZ`` says."""
    return timezone.now() + _offset


def offset() -> timedelta:
    """What ``now()`` adds to this host's clock: nil until ``synchronise`` measured it."""
    return _offset


def measure(alias: str) -> Reading:
    """Read the database's clock against this host's; nil on SQLite (one host)."""
    connection = connections[alias]
    sql = _DATABASE_NOW.get(connection.vendor)
    if sql is None:
        return Reading(0.0, 0.0)
    best: Reading | None = None
    with connection.cursor() as cursor:
        for _ in range(SAMPLES):
            before = timezone.now().timestamp()
            cursor.execute(sql)
            row = cursor.fetchone()
            after = timezone.now().timestamp()
            reading = Reading(int(row[0]) / 1e6 - (before + after) / 2, (after - before) / 2)
            if best is None or reading.uncertainty < best.uncertainty:
                best = reading
    assert best is not None
    return best


def synchronise(alias: str) -> Reading:
    """Measure the database's clock and let ``now()`` follow it from here on.

    Raises ``ClockUnknown`` when no reading is sure to within
    ``MAX_UNCERTAINTY_SECONDS``, leaving the offset as it was. An offset within the
    reading's own uncertainty is taken as nil: the clocks agree as far as can be told.
    """
    global _offset, _measured_at
    reading = measure(alias)
    if reading.uncertainty > MAX_UNCERTAINTY_SECONDS:
        raise ClockUnknown(
            f"Could not read the clock of database {alias!r} to within "
            f"{MAX_UNCERTAINTY_SECONDS}s (the fastest of {SAMPLES} readings took "
            f"{2 * reading.uncertainty:.1f}s there and back); a relay judges leases and "
            "ticks by that clock. Find what slows the connection, then start the relay again"
        )
    agreed = abs(reading.offset) <= max(reading.uncertainty, 0.001)
    _offset = timedelta(0) if agreed else timedelta(seconds=reading.offset)
    _measured_at = time.monotonic()
    return reading


def keep_synchronised(alias: str) -> None:
    """``synchronise`` unless done in the last ``KEEP_SECONDS``: for a process that takes
    rows outside a relay (a task worker, an eager attempt). A reading that is not sure
    enough keeps the offset it had."""
    if time.monotonic() - _measured_at < KEEP_SECONDS:
        return
    with contextlib.suppress(ClockUnknown):
        synchronise(alias)


def normalize(value: datetime) -> datetime:
    """``value`` in the project's convention; aware input under ``USE_TZ = False`` goes local."""
    if not settings.USE_TZ and timezone.is_aware(value):
        return timezone.make_naive(value)
    return value


def accept(value: object, *, what: str) -> datetime:
    """``value`` as a datetime the project can store, or a ``TypeError`` naming ``what``.

    A naive datetime is refused under ``USE_TZ = True``: read as UTC or as local time it
    would be wrong for somebody by hours. Under ``USE_TZ = False`` naive is local time.
    """
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__} ({value!r}).")
    if settings.USE_TZ and timezone.is_naive(value):
        raise TypeError(
            f"{what} must be an aware datetime, got the naive {value.isoformat()}; "
            "attach a time zone (for example timezone.make_aware(value))."
        )
    return normalize(value)
