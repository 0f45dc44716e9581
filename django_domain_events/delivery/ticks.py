"""The relays' side of recurring schedules: the cursor rows, and the watch for due ticks.

Every declared schedule has a cursor row (``ScheduleRecord``): the newest tick handled
and the next one due. A relay pass reads the earliest ``next_tick_at`` in one indexed
query, at most once a second, and hands each due schedule to the tick firing
(``tick_firing.py``, above ``delivery/``: it fires events) that the app config installs.
Ticks that will not fire are recorded here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from django.db import transaction

from .. import clock
from ..models import ScheduleRecord, TickRecord, TickStatus, database_alias
from ..recurrence import Schedule, aware, schedules

logger = logging.getLogger("django_domain_events.schedules")

CHECK_SECONDS = 1.0  # a relay looks for due ticks at most this often
DUE_BATCH = 20  # schedules one look handles; more due ones are handled on the next pass


def sync_schedules(now: datetime | None = None) -> int:
    """Give each declared schedule a cursor row, and re-time those whose declaration
    changed; returns how many rows were written.

    A new schedule starts at ``now``: ticks before it was declared never fire.
    """
    alias = database_alias()
    moment = aware(now if now is not None else clock.now())
    declared = schedules.all()
    if not declared:
        return 0
    known = dict(
        ScheduleRecord.objects.using(alias)
        .filter(key__in=[s.key for s in declared])
        .values_list("key", "spec")
    )
    missing = [
        ScheduleRecord(
            key=s.key,
            spec=s.spec,
            next_tick_at=clock.normalize(s.next_after(moment)),
            last_tick_at=clock.normalize(moment),
            created_at=clock.normalize(moment),
        )
        for s in declared
        if s.key not in known
    ]
    ScheduleRecord.objects.using(alias).bulk_create(missing, ignore_conflicts=True)
    written = len(missing)
    for s in declared:
        if s.key in known and known[s.key] != s.spec:
            # A new definition takes effect from now, as a new schedule would: its ticks
            # before now never came due, so the cursor moves to now too (else the next
            # look would fire or skip them). A paused one stays paused.
            rows = ScheduleRecord.objects.using(alias).filter(key=s.key, spec=known[s.key])
            written += rows.filter(next_tick_at__isnull=False).update(
                spec=s.spec,
                last_tick_at=clock.normalize(moment),
                next_tick_at=clock.normalize(s.next_after(moment)),
            )
            rows.filter(next_tick_at__isnull=True).update(
                spec=s.spec, last_tick_at=clock.normalize(moment)
            )
            logger.info("Schedule %s changed to %s; it ticks on that from now.", s.key, s.spec)
    return written


def _earliest(alias: str, keys: Sequence[str]) -> list[tuple[str, datetime]]:
    """The schedules whose next tick comes first: the one query of a relay's look."""
    rows = (
        ScheduleRecord.objects.using(alias)
        .filter(key__in=keys, next_tick_at__isnull=False)
        .order_by("next_tick_at")
        .values_list("key", "next_tick_at")[:DUE_BATCH]
    )
    return [(key, at) for key, at in rows if at is not None]


def record_skipped(
    alias: str, schedule: Schedule, run: tuple[datetime, datetime], reason: str, now: datetime
) -> None:
    """Record a run of ticks that will not fire (one row, at the last of them), and say so."""
    first, last = run
    span = f"the tick of {last.isoformat()}"
    if first != last:
        span = f"the ticks from {first.isoformat()} to {last.isoformat()}"
    logger.warning(
        "Schedule %s skipped %s: %s.",
        schedule.key,
        span,
        reason,
        extra={"schedule": schedule.key, "tick": last.isoformat()},
    )
    _record(alias, schedule.key, last, TickStatus.SKIPPED, reason, now, skipped_from=first)


def _record(
    alias: str,
    key: str,
    tick: datetime,
    status: TickStatus,
    reason: str,
    now: datetime,
    *,
    skipped_from: datetime | None = None,
) -> None:
    """Write a tick row that fires nothing; one already there for the tick wins."""
    with transaction.atomic(using=alias):
        TickRecord.objects.using(alias).bulk_create(
            [
                TickRecord(
                    schedule_key=key,
                    tick=clock.normalize(tick),
                    status=status,
                    skipped_from=clock.normalize(skipped_from) if skipped_from else None,
                    reason=reason,
                    recorded_at=clock.normalize(now),
                )
            ],
            ignore_conflicts=True,
        )


#: Fires one schedule's due ticks as of a moment and returns how many fired. Firing is
#: above ``delivery/`` (a tick fires its event with ``fire()``), so the app config
#: installs ``tick_firing.fire_schedule`` here when Django is ready, rather than this
#: module importing upward.
_fire_schedule: Callable[[str, datetime], int] | None = None


def install_firing(fire_schedule: Callable[[str, datetime], int]) -> None:
    """Give the relays' watch the function that fires a schedule's due ticks."""
    global _fire_schedule
    _fire_schedule = fire_schedule


def _firing() -> Callable[[str, datetime], int]:
    if _fire_schedule is None:
        raise RuntimeError(
            "No tick firing is installed: django_domain_events.apps.DomainEventsConfig "
            "installs it when Django is ready; add 'django_domain_events' to INSTALLED_APPS "
            "and call django.setup() before starting a relay."
        )
    return _fire_schedule


class Ticker:
    """A relay's watch on the schedules: at most one query a second, none without any.

    ``look()`` runs in each pass; the first one gives the declared schedules their
    cursor rows. ``seconds_to_next()`` tells an idle relay when the next known tick
    comes due, so it sleeps no longer than that (and no shorter than its poll would).
    """

    def __init__(self) -> None:
        self._keys = schedules.keys()
        self._synced = False
        self._next_look = 0.0  # time.monotonic() before which no look queries
        self._next_tick: float | None = None  # time.monotonic() of the next known tick

    def look(self) -> int:
        """Fire the ticks that came due, if it is time to look; returns how many fired."""
        if not self._keys or time.monotonic() < self._next_look:
            return 0
        alias = database_alias()
        now = clock.now()
        if not self._synced:
            sync_schedules(now)
            self._synced = True
        moment = aware(now)
        earliest = _earliest(alias, self._keys)
        due = [key for key, at in earliest if aware(at) <= moment]
        fired = sum(_firing()(key, now) for key in due)
        looked = time.monotonic()
        self._next_look = looked + CHECK_SECONDS
        self._next_tick = None
        if len(due) == DUE_BATCH:
            self._next_look = self._next_tick = looked  # more may be due: look again now
            return fired
        # The next tick known: the first schedule not due, or the next of one just fired.
        upcoming = [aware(at) for _, at in earliest[len(due) :][:1]]
        upcoming += [s.next_after(moment) for s in map(schedules.get, due) if s is not None]
        if upcoming:
            self._next_tick = looked + max(0.0, (min(upcoming) - moment).total_seconds())
            self._next_look = min(self._next_look, self._next_tick)
        return fired

    def seconds_to_next(self) -> float | None:
        """How long until the next tick known to come due, or None if none is known."""
        if self._next_tick is None:
            return None
        return max(0.0, self._next_tick - time.monotonic())
