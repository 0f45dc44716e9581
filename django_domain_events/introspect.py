"""Answers about the declarations and the rows: who listens, health, quiet receivers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import connections, router
from django.db.models import Case, Count, Min, OuterRef, Subquery, When

from . import clock, conf
from .declare import AnyEvent, RegisteredEvent, RegisteredReceiver, registry
from .delivery import limits, ordering
from .models import (
    OWED_VALUES,
    STATUS_SQL,
    DeliveryRecord,
    DeliveryStatus,
    LanePauseRecord,
    LimitRecord,
    ReceiverMark,
    ScheduleRecord,
    TickRecord,
    TickStatus,
)
from .recurrence import Schedule, aware, schedules
from .tally import horizon, scheduled_from


def what_listens_to(cls: type) -> list[RegisteredReceiver]:
    """The receivers of ``cls``, sorted by key; wildcards only when asked about ``AnyEvent``."""
    if cls is AnyEvent:
        return [r for r in registry.receivers if r.wildcard]
    return [r for r in registry.receivers if r.event_class is cls]


def listens_for(key: str) -> RegisteredEvent | None:
    """The event the receiver ``key`` is declared for; None for an unknown key or a wildcard."""
    declared = registry.receiver(key)
    if declared is None or declared.wildcard:
        return None
    return registry.event_for_class(declared.event_class)


# Schedules -------------------------------------------------------------------

#: How long past its time a schedule's next tick may stay unfired before it is late:
#: a relay looks for due ticks about once a second, so a minute means none is running
#: (or none reaches the database). Twice ``POLL_SECONDS`` when that is longer.
LATE_AFTER_SECONDS = 60.0

#: How many of its coming ticks a schedule's status lists.
NEXT_TICKS = 3


@dataclass(frozen=True)
class ScheduleStatus:
    """A ``@recurring`` schedule as its rows show it: the last ticks handled, the next due.

    Every datetime is aware, in UTC; ``timezone`` names the zone the schedule's ticks
    are read in (``UTC`` for an interval), to show them as its users see them.
    ``declared`` is False for a cursor row whose schedule is no longer in the code; such
    a row has no ``catch_up`` and no next ticks: nothing will fire it. ``late`` says a
    schedule's next tick is more than a minute overdue: no relay is firing it.
    ``failing`` says its newest failed tick is newer than its newest fired one.
    """

    key: str
    spec: str
    timezone: str
    catch_up: str | None
    declared: bool
    paused: bool
    paused_at: datetime | None
    next_tick_at: datetime | None
    last_fired: datetime | None
    last_event_id: int | None
    last_skipped: datetime | None
    skipped_from: datetime | None
    skip_reason: str
    last_failed: datetime | None
    failure: str
    failing: bool
    next_ticks: tuple[datetime, ...]
    late: bool


def late_after() -> timedelta:
    """How overdue a schedule's next tick may be before ``ScheduleStatus.late`` says so."""
    return timedelta(seconds=max(2 * conf.get().POLL_SECONDS, LATE_AFTER_SECONDS))


def schedule_status(*, now: datetime | None = None) -> tuple[ScheduleStatus, ...]:
    """Every schedule, declared or left by a cursor row, sorted by key, in two queries.

    One query reads the cursor rows, each with the id of its newest fired, skipped and
    failed tick (three descents of the ``(schedule_key, status, tick)`` index, read
    newest first); one more reads those tick rows. So the cost follows the schedules,
    never the ticks recorded. Nothing is written: a schedule no relay has seen yet is listed
    without a cursor.
    """
    moment = aware(now if now is not None else clock.now())
    alias = router.db_for_read(ScheduleRecord)
    newest = {
        f"newest_{status.value}": Subquery(
            TickRecord.objects.filter(schedule_key=OuterRef("key"), status=status)
            .order_by("-tick")
            .values("pk")[:1]
        )
        for status in TickStatus
    }
    rows = {
        row.key: row for row in ScheduleRecord.objects.using(alias).annotate(**newest).order_by()
    }
    tick_ids = [pk for row in rows.values() for pk in (getattr(row, name) for name in newest) if pk]
    ticks = TickRecord.objects.using(alias).in_bulk(tick_ids) if tick_ids else {}
    found = []
    for key in sorted(set(rows) | set(schedules.keys())):
        row = rows.get(key)
        last = {
            status: ticks.get(getattr(row, f"newest_{status.value}") or 0) if row else None
            for status in TickStatus
        }
        found.append(_status(key, schedules.get(key), row, last, moment))
    return tuple(found)


def _status(
    key: str,
    schedule: Schedule | None,
    row: ScheduleRecord | None,
    last: dict[TickStatus, TickRecord | None],
    moment: datetime,
) -> ScheduleStatus:
    fired, skipped, failed = (
        last[TickStatus.FIRED],
        last[TickStatus.SKIPPED],
        last[TickStatus.FAILED],
    )
    paused_at = _aware(row.paused_at) if row is not None else None
    next_tick_at = _aware(row.next_tick_at) if row is not None else None
    next_ticks: list[datetime] = []
    if schedule is not None and paused_at is None:
        tick = moment
        for _ in range(NEXT_TICKS):
            tick = schedule.next_after(tick)
            next_ticks.append(tick)
    last_fired = _aware(fired.tick) if fired else None
    last_failed = _aware(failed.tick) if failed else None
    spec = schedule.spec if schedule is not None else row.spec if row is not None else ""
    return ScheduleStatus(
        key=key,
        spec=spec,
        timezone=schedule.zone.key if schedule is not None else _zone_of_spec(spec),
        catch_up=schedule.catch_up if schedule is not None else None,
        declared=schedule is not None,
        paused=paused_at is not None,
        paused_at=paused_at,
        next_tick_at=next_tick_at,
        last_fired=last_fired,
        last_event_id=fired.event_id if fired else None,
        last_skipped=_aware(skipped.tick) if skipped else None,
        skipped_from=_aware(skipped.skipped_from) if skipped else None,
        skip_reason=skipped.reason if skipped else "",
        last_failed=last_failed,
        failure=failed.reason if failed else "",
        failing=last_failed is not None and (last_fired is None or last_failed > last_fired),
        next_ticks=tuple(next_ticks),
        late=(
            schedule is not None
            and next_tick_at is not None
            and moment - next_tick_at > late_after()
        ),
    )


def _zone_of_spec(spec: str) -> str:
    """The zone of a stored spec (``cron EXPR ZONE``), for a schedule no longer declared."""
    if spec.startswith("cron "):
        name = spec.rsplit(" ", 1)[-1]
        try:
            return ZoneInfo(name).key
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return "UTC"


def _aware(value: datetime | None) -> datetime | None:
    return aware(value) if value is not None else None


# Health ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverBacklog:
    """One receiver's rows: owed (due now), scheduled (due later), claimed, dead.

    ``declared`` is False for a key this process does not declare as a durable receiver
    (not declared by this relay): its rows wait for a relay of a release that declares
    it, and are orphaned ``ORPHAN_AFTER_SECONDS`` after they came due.
    """

    key: str
    owed: int
    dead: int
    oldest_owed_at: datetime | None
    scheduled: int = 0
    claimed: int = 0
    declared: bool = True


@dataclass(frozen=True)
class LanePause:
    """A relay holding a lane back after ``RetryAfter(counts=False)``."""

    worker_id: str
    paused_at: datetime
    until: datetime


@dataclass(frozen=True)
class LaneBacklog:
    """A lane's rows, summed over its receivers, with the pauses relays recorded."""

    lane: str
    owed: int
    dead: int
    oldest_owed_at: datetime | None
    scheduled: int = 0
    claimed: int = 0
    pauses: tuple[LanePause, ...] = ()


@dataclass(frozen=True)
class OutboxHealth:
    """Is delivery keeping up? Owed work is due now; scheduled work is not due yet.

    ``schedules`` has the declared ``@recurring`` schedules (``schedule_status()``): one
    that is ``late`` has no relay firing it, one that is ``failing`` raised on its tick.
    """

    owed: int
    claimed: int
    dead: int
    oldest_owed_at: datetime | None
    lapsed_leases: int
    receivers: tuple[ReceiverBacklog, ...] = ()
    scheduled: int = 0
    lanes: tuple[LaneBacklog, ...] = ()
    schedules: tuple[ScheduleStatus, ...] = ()
    undeclared: int = 0  # owed rows of receivers not declared by this relay (see above)
    limits: tuple[LimitStatus, ...] = ()  # the declared rate and concurrency limits
    # Ordered keys whose later rows wait behind a head that cannot run now (ordering.py).
    held_keys: tuple[ordering.HeldKey, ...] = ()


@dataclass(frozen=True)
class LimitStatus:
    """A declared limit (a receiver's ``rate_limit=`` / ``concurrency_limit=``, a group's
    of ``LIMIT_GROUPS`` or a lane's of ``LANE_LIMITS``), its use now, and the rows waiting
    for it (owed, due and not claimed)."""

    key: str  # the receiver's key, "group:<name>" or "lane:<name>"
    rate_limit: str | None
    concurrency_limit: int | None
    running: int  # rows under a live lease, across every relay
    tokens: float | None  # the rate's bucket now; None without a rate
    waiting: int
    paused_until: datetime | None = None  # RetryAfter from the receiver: no relay claims
    kind: str = "receiver"  # "receiver", "group" or "lane"
    members: tuple[str, ...] = ()  # the receivers the limit holds


def limit_status(alias: str, moment: datetime, waiting: dict[str, int]) -> tuple[LimitStatus, ...]:
    """Every declared limit's status (one query each for the buckets and the running rows)."""
    declared = limits.every_declared()
    if not declared:
        return ()
    keys = [limit.key for limit in declared]
    buckets = {row.key: row for row in LimitRecord.objects.using(alias).filter(key__in=keys)}
    running = limits.running_counts(alias, {k for lm in declared for k in lm.members}, moment)
    found = []
    for limit in declared:
        bucket = buckets.get(limit.key)
        tokens: float | None = None
        if limit.rate is not None:
            tokens = limit.burst
            if bucket is not None:
                elapsed = max(0.0, (moment - bucket.refilled_at).total_seconds())
                tokens = min(limit.burst, bucket.tokens + elapsed * limit.rate)
        paused = bucket.paused_until if bucket is not None else None
        found.append(
            LimitStatus(
                key=limit.key,
                rate_limit=limit.rate_text,
                concurrency_limit=limit.concurrency,
                running=sum(running.get(key, 0) for key in limit.members),
                tokens=tokens,
                waiting=sum(waiting.get(key, 0) for key in limit.members),
                paused_until=paused if paused is not None and paused > moment else None,
                kind=limit.kind,
                members=limit.members,
            )
        )
    return tuple(found)


@dataclass
class _Tally:
    owed: int = 0
    dead: int = 0
    oldest: datetime | None = None
    scheduled: int = 0
    claimed: int = 0

    def add_owed(self, count: int, oldest: datetime | None) -> None:
        self.owed += count
        if oldest is not None and (self.oldest is None or oldest < self.oldest):
            self.oldest = oldest

    def merge(self, other: _Tally) -> None:
        self.add_owed(other.owed, other.oldest)
        self.dead += other.dead
        self.scheduled += other.scheduled
        self.claimed += other.claimed


def outbox_health(*, now: datetime | None = None) -> OutboxHealth:
    """The backlog, per receiver and per lane, worst first, in four queries; and the
    ``@recurring`` schedules' status, in two more when any is declared.

    Read from the partial indexes over owed and dead rows, so the cost follows the work
    outstanding, never the settled history; work due in a later hour is read from the
    scheduled tally (``tally.py``), so it costs a row per receiver and hour, never one
    per scheduled row. A row whose due time is ahead is scheduled, not owed, and never
    ages the backlog; once due, its age runs from ``due_at``. A row still owed past its
    lifetime is counted dead: it will be dead-lettered unrun.
    """
    moment = clock.normalize(now) if now is not None else clock.now()
    alias = router.db_for_read(DeliveryRecord)
    tallies: dict[str, _Tally] = {r.key: _Tally() for r in registry.receivers if r.durable}
    lapsed = 0
    later = horizon(moment)
    for row in _owed_before(alias, moment, later):
        tally = tallies.setdefault(row["receiver_key"], _Tally())
        if row["ahead"] and row["status"] == DeliveryStatus.PENDING:
            tally.scheduled += row["n"]
        elif row["expired"] and not row["ahead"]:
            tally.dead += row["n"]
        else:
            # A claimed or failed row ahead of its due time exists only when ``now`` is in
            # the past: it still counts owed (and claimed).
            if row["status"] == DeliveryStatus.CLAIMED:
                tally.claimed += row["n"]
                lapsed += row["n"] if row["lapsed"] and not row["ahead"] else 0
            tally.add_owed(row["n"], row["oldest"])
    for key, n in scheduled_from(alias, later).items():
        tallies.setdefault(key, _Tally()).scheduled += n
    dead_rows = (
        DeliveryRecord.objects.using(alias)
        .filter(status=DeliveryStatus.DEAD)
        .values("receiver_key")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for row in dead_rows:
        tallies.setdefault(row["receiver_key"], _Tally()).dead += row["n"]
    pauses: dict[str, list[LanePause]] = {}
    for pause in (
        LanePauseRecord.objects.using(alias).filter(until__gt=moment).order_by("lane", "worker_id")
    ):
        pauses.setdefault(pause.lane, []).append(
            LanePause(worker_id=pause.worker_id, paused_at=pause.paused_at, until=pause.until)
        )
    # Two more queries, only when schedules are declared (schedule_status()).
    ticking = schedule_status(now=moment) if schedules.keys() else ()
    health = _assemble(tallies, pauses, lapsed, ticking)
    waiting = {key: t.owed - t.claimed for key, t in tallies.items()}
    return replace(
        health,
        limits=limit_status(alias, moment, waiting),
        held_keys=ordering.held_keys(alias, moment),
    )


_OWED_BEFORE_SQL = """
SELECT receiver_key, status, due_at > %(now)s AS ahead, expires_at <= %(now)s AS expired,
       available_at <= %(now)s AS lapsed, count(*) AS n, min(due_at) AS oldest
FROM (
    SELECT receiver_key, status, expires_at, available_at, due_at
    FROM {table}
    WHERE status IN {owed} AND due_at < %(later)s
    ORDER BY due_at
) AS owed
GROUP BY 1, 2, 3, 4, 5
"""


def _owed_before(alias: str, moment: datetime, later: datetime) -> list[dict[str, Any]]:
    """Owed rows due before ``later`` (the tally's horizon), grouped: a range of the due_at
    index, never the table; those due after ``moment`` are marked ``ahead``.

    On PostgreSQL the range is read in index order inside a sub-select: the planner
    cannot know that settled rows (all due long ago) are not in the partial index, and
    without the order it may scan the whole table instead.
    """
    connection = connections[alias]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                _OWED_BEFORE_SQL.format(table=table, owed=STATUS_SQL["owed"]),
                {"now": moment, "later": later},
            )
            names = [column[0] for column in cursor.description]
            return [
                {**dict(zip(names, row, strict=True)), "oldest": clock.normalize(row[6])}
                for row in cursor.fetchall()
            ]
    return list(
        DeliveryRecord.objects.using(alias)
        .filter(status__in=OWED_VALUES, due_at__lt=later)
        .annotate(
            ahead=Case(When(due_at__gt=moment, then=True), default=False),
            expired=Case(When(expires_at__lte=moment, then=True), default=False),
            lapsed=Case(When(available_at__lte=moment, then=True), default=False),
        )
        .values("receiver_key", "status", "ahead", "expired", "lapsed")
        .annotate(n=Count("pk"), oldest=Min("due_at"))
        .order_by()
    )


def _worst_first(tally: _Tally, name: str) -> tuple[Any, ...]:
    oldest = tally.oldest.timestamp() if tally.oldest is not None else float("inf")
    return (oldest, -tally.owed, -tally.dead, -tally.scheduled, name)


def _assemble(
    tallies: dict[str, _Tally],
    pauses: dict[str, list[LanePause]],
    lapsed: int,
    ticking: tuple[ScheduleStatus, ...],
) -> OutboxHealth:
    lane_of = {key: lane for lane, keys in registry.lanes().items() for key in keys}
    lanes: dict[str, _Tally] = {lane: _Tally() for lane in registry.lanes()}
    lanes.update({lane: _Tally() for lane in pauses if lane not in lanes})
    total = _Tally()
    for key, tally in tallies.items():
        lanes[lane_of.get(key, "default")].merge(tally)
        total.merge(tally)
    receivers = tuple(
        ReceiverBacklog(key, t.owed, t.dead, t.oldest, t.scheduled, t.claimed, key in lane_of)
        for key, t in sorted(tallies.items(), key=lambda item: _worst_first(item[1], item[0]))
    )
    lane_backlogs = tuple(
        LaneBacklog(
            name, t.owed, t.dead, t.oldest, t.scheduled, t.claimed, tuple(pauses.get(name, ()))
        )
        for name, t in sorted(lanes.items(), key=lambda item: _worst_first(item[1], item[0]))
    )
    return OutboxHealth(
        owed=total.owed,
        claimed=total.claimed,
        dead=total.dead,
        oldest_owed_at=total.oldest,
        lapsed_leases=lapsed,
        receivers=receivers,
        scheduled=total.scheduled,
        lanes=lane_backlogs,
        schedules=ticking,
        undeclared=sum(r.owed for r in receivers if not r.declared),
    )


# Quiet receivers ---------------------------------------------------------------


@dataclass(frozen=True)
class QuietReceiver:
    """A durable receiver with no success inside the window (None: it never succeeded)."""

    key: str
    event_name: str
    last_succeeded_at: datetime | None


def quiet_receivers(
    *, within: timedelta | None = None, now: datetime | None = None
) -> list[QuietReceiver]:
    """Durable receivers with no success inside ``within`` (default ``RETENTION_DAYS``).

    One index probe per receiver, and the marks the prune leaves, so the answer survives
    the prune and does not walk history.
    """
    if within is None:
        within = timedelta(days=conf.get().RETENTION_DAYS)
    if not isinstance(within, timedelta) or within <= timedelta(0):
        raise ValueError(f"quiet_receivers(within=) must be a positive timedelta, not {within!r}.")
    moment = clock.normalize(now) if now is not None else clock.now()
    alias = router.db_for_read(DeliveryRecord)
    marks = dict(ReceiverMark.objects.using(alias).values_list("receiver_key", "last_succeeded_at"))
    quiet = []
    for declared in registry.receivers:
        if not declared.durable:
            continue
        last = (
            DeliveryRecord.objects.using(alias)
            .filter(receiver_key=declared.key, succeeded_at__isnull=False)
            .order_by("-succeeded_at")
            .values_list("succeeded_at", flat=True)
            .first()
        )
        mark = marks.get(declared.key)
        if mark is not None and (last is None or mark > last):
            last = mark
        if last is None or last < moment - within:
            event = listens_for(declared.key)
            name = event.name if event is not None else "*"
            quiet.append(QuietReceiver(declared.key, name, last))
    return quiet
