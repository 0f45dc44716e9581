"""The relays' side of recurring schedules: find the ticks that came due, fire each once.

Every declared schedule has a cursor row (``ScheduleRecord``): the newest tick handled
and the next one due. A relay pass reads the earliest ``next_tick_at`` in one indexed
query, at most once a second. For a schedule that is due, the relay moves its cursor
forward by compare-and-set and, in the same transaction, fires the ticks its catch-up
policy chooses and records each one (``TickRecord``, unique per schedule and tick). A
relay that loses the race moves nothing and fires nothing; a crash rolls back the
cursor, the events and the tick rows together; so each tick fires once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, transaction

from .. import clock
from ..declare import registry
from ..firing import fire
from ..models import ScheduleRecord, TickRecord, TickStatus, database_alias
from ..recurrence import Schedule, aware, schedules
from .outage import is_outage
from .outcomes import describe_error
from .run import refuse_awaitable

logger = logging.getLogger("django_domain_events.schedules")

CHECK_SECONDS = 1.0  # a relay looks for due ticks at most this often
DUE_BATCH = 20  # schedules one look handles; more due ones are handled on the next pass
_JUST_BEFORE = timedelta(microseconds=1)


@dataclass(frozen=True)
class TickPlan:
    """What to do with the ticks due for one schedule: fire some, skip the run before."""

    fire: tuple[datetime, ...]  # oldest first
    skipped: tuple[datetime, datetime] | None  # the first and last tick skipped
    skip_reason: str
    cursor: datetime | None  # the newest tick due, None when none is
    next_tick: datetime


def plan_ticks(schedule: Schedule, after: datetime, now: datetime) -> TickPlan:
    """Which ticks in ``(after, now]`` fire under the schedule's policy, and which are skipped.

    The ticks that fire are always the newest: ``catch_up="all"`` up to its limit, the
    others one. A tick later than the schedule's tolerance is skipped instead.
    """
    count = schedule.catch_up_limit if schedule.catch_up == "all" else 1
    newest = schedule.latest(after, now, count + 1)  # one more: is anything skipped?
    next_tick = schedule.next_after(now)
    if not newest:
        return TickPlan((), None, "", None, next_tick)
    late_limit = schedule.late_limit
    chosen = [t for t in newest[:count] if late_limit is None or now - t <= late_limit]
    skipped = None
    reason = ""
    if len(newest) > len(chosen):
        last_skipped = newest[len(chosen)]
        skipped = (schedule.next_after(after), last_skipped)
        reason = _skip_reason(schedule, now - last_skipped)
    return TickPlan(tuple(reversed(chosen)), skipped, reason, newest[0], next_tick)


def _skip_reason(schedule: Schedule, late: timedelta) -> str:
    limit = schedule.late_limit
    if limit is not None and late > limit:
        return (
            f"no relay reached them within the tolerance ({limit}) [catch_up={schedule.catch_up!r}]"
        )
    if schedule.catch_up == "all":
        return f"more ticks were missed than catch_up_limit={schedule.catch_up_limit} fires"
    return "missed while no relay ran; catch_up='latest' fires the newest only"


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


def fire_due_ticks(now: datetime | None = None) -> int:
    """Fire every tick that has come due, once; returns how many ticks fired.

    What the relays do on their own: call it yourself only to fire ticks without a
    relay, e.g. in tests with ``now=`` to drive the clock.
    """
    moment = now if now is not None else clock.now()
    sync_schedules(moment)
    fired = 0
    while True:
        due = _due_keys(database_alias(), moment)
        for key in due:
            fired += fire_schedule(key, moment)
        if len(due) < DUE_BATCH:
            return fired


def _earliest(alias: str, keys: Sequence[str]) -> list[tuple[str, datetime]]:
    """The schedules whose next tick comes first: the one query of a relay's look."""
    rows = (
        ScheduleRecord.objects.using(alias)
        .filter(key__in=keys, next_tick_at__isnull=False)
        .order_by("next_tick_at")
        .values_list("key", "next_tick_at")[:DUE_BATCH]
    )
    return [(key, at) for key, at in rows if at is not None]


def _due_keys(alias: str, now: datetime) -> list[str]:
    moment = aware(now)
    return [key for key, at in _earliest(alias, schedules.keys()) if aware(at) <= moment]


def fire_schedule(key: str, now: datetime) -> int:
    """Fire the due ticks of one schedule, if this caller wins its cursor; returns how
    many fired."""
    schedule = schedules.get(key)
    if schedule is None:
        return 0
    alias = database_alias()
    moment = aware(now)
    with transaction.atomic(using=alias):
        rows = ScheduleRecord.objects.using(alias).filter(
            key=key, next_tick_at__lte=clock.normalize(moment)
        )
        if connections[alias].features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True)  # another relay has it: go on
        found = rows.values_list("last_tick_at", "next_tick_at").first()
        if found is None:
            return 0
        last, next_at = found
        assert next_at is not None  # the filter above
        after = aware(last) if last is not None else aware(next_at) - _JUST_BEFORE
        plan = plan_ticks(schedule, after, moment)
        cursor = clock.normalize(plan.cursor) if plan.cursor is not None else last
        moved = (
            ScheduleRecord.objects.using(alias)
            .filter(key=key, last_tick_at=last, next_tick_at=next_at)
            .update(last_tick_at=cursor, next_tick_at=clock.normalize(plan.next_tick))
        )
        if not moved:  # another relay moved it first: its ticks are its to fire
            return 0
        if plan.skipped is not None:
            record_skipped(alias, schedule, plan.skipped, plan.skip_reason, moment)
        return sum(_fire_tick(alias, schedule, tick, moment) for tick in plan.fire)


def _fire_tick(alias: str, schedule: Schedule, tick: datetime, now: datetime) -> int:
    """Fire one tick and record it, in a savepoint: a function that raises, or returns
    no event, records the tick failed and the schedule goes on."""
    try:
        with transaction.atomic(using=alias):
            evt = schedule.build(tick)
            refuse_awaitable(evt, f"schedule {schedule.key}'s function", "the event to fire")
            if registry.event_for_class(type(evt)) is None:
                raise TypeError(
                    f"schedule {schedule.key} returned {evt!r}, not an instance of an "
                    "@event class; return the event to fire."
                )
            event_id = fire(evt, occurred_at=tick)
            TickRecord.objects.using(alias).create(
                schedule_key=schedule.key,
                tick=clock.normalize(tick),
                status=TickStatus.FIRED,
                event_id=event_id,
                recorded_at=clock.normalize(now),
            )
    except Exception as error:
        if is_outage(error, alias):
            raise
        if _recorded(alias, schedule.key, tick):
            logger.info("Schedule %s: tick %s was already recorded.", schedule.key, tick)
            return 0
        reason = describe_error(error)
        logger.error(
            "Schedule %s: the tick of %s failed and will not be retried: %s",
            schedule.key,
            tick.isoformat(),
            reason,
            exc_info=error,
            extra={"schedule": schedule.key, "tick": tick.isoformat()},
        )
        _record(alias, schedule.key, tick, TickStatus.FAILED, reason, now)
        return 0
    logger.info(
        "Schedule %s fired the tick of %s: event #%s.",
        schedule.key,
        tick.isoformat(),
        event_id,
        extra={"schedule": schedule.key, "tick": tick.isoformat(), "event_id": event_id},
    )
    return 1


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


def _recorded(alias: str, key: str, tick: datetime) -> bool:
    return (
        TickRecord.objects.using(alias)
        .filter(schedule_key=key, tick=clock.normalize(tick))
        .exists()
    )


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
        fired = sum(fire_schedule(key, now) for key in due)
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
