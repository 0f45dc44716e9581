"""Simulated time for the chapters that move the relay's clock forward.

``drain_outbox(now=T)`` and ``deliver_pending(now=T)`` claim rows as if it were ``T``,
while receivers run on the real clock. A ``SimClock`` names those moments relative to
when a chapter started ("+48h", "+14d"), so the output is the same on every run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")


@dataclass(frozen=True)
class SimClock:
    zero: datetime

    @classmethod
    def start(cls) -> SimClock:
        """A clock whose zero is the real time now."""
        return cls(timezone.now())

    def at(self, offset: timedelta) -> datetime:
        """The moment ``offset`` after zero, to pass as ``now=``."""
        return self.zero + offset

    def label(self, moment: datetime) -> str:
        """``+48h``, ``+14d``, ``+1h30m``, ``+10m``: ``moment`` to the nearest minute.

        Whole days from four on are counted in days, shorter spans in hours and minutes.
        """
        minutes = round((moment - self.zero).total_seconds() / 60)
        sign, minutes = ("-" if minutes < 0 else "+"), abs(minutes)
        if minutes >= 4 * 24 * 60 and minutes % (24 * 60) == 0:
            return f"{sign}{minutes // (24 * 60)}d"
        hours, rest = divmod(minutes, 60)
        if hours and rest:
            return f"{sign}{hours}h{rest}m"
        return f"{sign}{hours}h" if hours else f"{sign}{rest}m"

    def relative(self, text: str) -> str:
        """``text`` with every ISO 8601 timestamp in it written as a time on this clock."""
        return ISO_DATETIME.sub(lambda match: self.label(_parse(match.group())), text)

    @contextmanager
    def in_logs(self) -> Iterator[None]:
        """Print the package's log lines with their timestamps on this clock."""
        handlers = logging.getLogger("django_domain_events").handlers
        relative = _Relative(self)
        for handler in handlers:
            handler.addFilter(relative)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(relative)


def _parse(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


class _Relative(logging.Filter):
    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self.clock = clock

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.clock.relative(record.getMessage()), ()
        return True


def mask_times(text: str) -> str:
    """``text`` with every ISO 8601 timestamp replaced by ``<time>``."""
    return ISO_DATETIME.sub("<time>", text)
