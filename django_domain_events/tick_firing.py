"""Firing a schedule's due ticks: each tick's event through ``fire()``, once.

For a schedule that is due, the caller moves its cursor forward by compare-and-set and,
in the same transaction, fires the ticks its catch-up policy chooses and records each
one (``TickRecord``, unique per schedule and tick). A caller that loses the race moves
nothing and fires nothing; a crash rolls back the cursor, the events and the tick rows
together; so each tick fires once.

This is firing, above ``delivery/``: the relay's watch (``delivery/ticks.py``) calls
:func:`fire_schedule` through the seam the app config fills when Django is ready, so
``delivery/`` never imports ``firing.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, transaction

from . import clock
from .declare import registry
from .delivery.outage import is_outage
from .delivery.outcomes import describe_error
from .delivery.run import refuse_awaitable

# The watch's one query and the tick rows' writer, shared with the watch (not public).
from .delivery.ticks import DUE_BATCH, _earliest, _record, record_skipped, sync_schedules
from .firing import fire
from .models import ScheduleRecord, TickRecord, TickStatus, database_alias
from .recurrence import Schedule, aware, schedules

logger = logging.getLogger("django_domain_events.schedules")

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


def _recorded(alias: str, key: str, tick: datetime) -> bool:
    return (
        TickRecord.objects.using(alias)
        .filter(schedule_key=key, tick=clock.normalize(tick))
        .exists()
    )
