"""The figures behind the admin dashboard, in one call and a fixed number of queries.

``outbox_dashboard()`` returns ``outbox_health()`` and the series the dashboard draws:
settlements per minute over the last hour, the owed backlog by age, the work scheduled
for each of the next seven days and the dead letters by receiver and by error type.
Every series is read from an index over the rows it counts (or from the scheduled
tally), so the cost follows the last hour's traffic, the work outstanding and the dead
letters, never the settled history; and the number of queries is the same for an empty
table and a full one.

Each bar carries the bounds of the rows it counts, so a page can link it to exactly
those rows (``admin/dashboard.py`` turns them into changelist filters).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncMinute

from . import clock
from .introspect import OutboxHealth, outbox_health
from .models import OWED_VALUES, STATUS_SQL, DeliveryRecord, DeliveryStatus, ScheduledTally
from .tally import HOUR, horizon

Rows = QuerySet[DeliveryRecord]

MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)

#: Bars of the per-minute chart: the last hour, the minute under way last.
MINUTES = 60
#: Bars of the scheduled chart: a day each.
DAYS = 7
#: The owed backlog's age buckets: (label, youngest age, oldest age); None is open.
AGE_BUCKETS: tuple[tuple[str, timedelta, timedelta | None], ...] = (
    ("< 1 min", timedelta(0), MINUTE),
    ("1-10 min", MINUTE, timedelta(minutes=10)),
    ("10-60 min", timedelta(minutes=10), HOUR),
    ("1-24 h", HOUR, DAY),
    ("> 1 day", DAY, None),
)


@dataclass(frozen=True)
class MinuteBar:
    """Rows settled or failed in ``[start, end)``, by their current status.

    ``succeeded`` and ``dead`` are counted by ``completed_at``; ``failed`` (waiting out
    a backoff) by ``claimed_at``, the start of the attempt that failed.
    """

    start: datetime
    end: datetime
    succeeded: int
    failed: int
    dead: int


@dataclass(frozen=True)
class AgeBar:
    """Owed rows that came due in ``(due_after, due_until]``; ``due_after`` None: any time."""

    label: str
    due_after: datetime | None
    due_until: datetime
    owed: int


@dataclass(frozen=True)
class DayBar:
    """Rows scheduled to come due in ``[start, end)`` (the first bar: after ``start``)."""

    start: datetime
    end: datetime
    scheduled: int


@dataclass(frozen=True)
class DeadCount:
    """Dead letters of one receiver, or of one error type."""

    name: str
    dead: int


@dataclass(frozen=True)
class Dashboard:
    """Everything the admin dashboard shows, read at ``now``."""

    now: datetime
    health: OutboxHealth
    minutes: tuple[MinuteBar, ...]
    ages: tuple[AgeBar, ...]
    days: tuple[DayBar, ...]
    scheduled_later: int  # scheduled past the last day bar
    dead_by_receiver: tuple[DeadCount, ...]  # most first
    dead_by_error_type: tuple[DeadCount, ...]  # most first; "" is an empty last_error


def outbox_dashboard(*, now: datetime | None = None) -> Dashboard:
    """The dashboard's figures at ``now`` (default: the current time), in ten queries:
    ``outbox_health()``'s four, two for the minutes, one for the ages, two for the days
    and one for the dead letters."""
    moment = clock.normalize(now) if now is not None else clock.now()
    alias = router.db_for_read(DeliveryRecord)
    health = outbox_health(now=moment)
    rows = DeliveryRecord.objects.using(alias)
    minutes = _minutes(rows, moment)
    ages = _ages(rows, moment)
    days = _days(alias, rows, moment)
    later = max(health.scheduled - sum(d.scheduled for d in days), 0)
    by_receiver, by_type = _dead(rows)
    return Dashboard(
        now=moment,
        health=health,
        minutes=minutes,
        ages=ages,
        days=days,
        scheduled_later=later,
        dead_by_receiver=by_receiver,
        dead_by_error_type=by_type,
    )


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _truncated(field: str) -> TruncMinute:
    # Minutes are the same in every zone that is whole minutes from UTC; truncating in
    # UTC needs no time zone tables (MariaDB) and no conversion per row.
    return TruncMinute(field, tzinfo=UTC if settings.USE_TZ else None)


def _minutes(rows: Rows, moment: datetime) -> tuple[MinuteBar, ...]:
    """Two range reads: settled rows by ``completed_at`` (the dde_delivery_completed
    index), failed ones by ``claimed_at`` among the owed rows due by now."""
    end = _minute(moment) + MINUTE
    start = end - MINUTES * MINUTE
    counts: dict[tuple[datetime, str], int] = {}
    settled = (
        rows.filter(
            completed_at__gte=start,
            completed_at__lt=end,
            status__in=[DeliveryStatus.SUCCEEDED, DeliveryStatus.DEAD],
        )
        .annotate(minute=_truncated("completed_at"))
        .values("minute", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    failed = (
        # A failed row is due (its due time has passed): the range of the due index
        # keeps rows scheduled for later out of the read.
        rows.filter(
            status=DeliveryStatus.FAILED,
            due_at__lte=moment,
            claimed_at__gte=start,
            claimed_at__lt=end,
        )
        .annotate(minute=_truncated("claimed_at"))
        .values("minute", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    for row in [*settled, *failed]:
        key = (clock.normalize(row["minute"]), row["status"])
        counts[key] = counts.get(key, 0) + row["n"]
    bars = []
    for index in range(MINUTES):
        at = start + index * MINUTE
        bars.append(
            MinuteBar(
                start=at,
                end=at + MINUTE,
                succeeded=counts.get((at, DeliveryStatus.SUCCEEDED), 0),
                failed=counts.get((at, DeliveryStatus.FAILED), 0),
                dead=counts.get((at, DeliveryStatus.DEAD), 0),
            )
        )
    return tuple(bars)


def _ages(rows: Rows, moment: datetime) -> tuple[AgeBar, ...]:
    """One read of the owed rows due by ``moment`` (a range of the dde_delivery_due
    index), counted into each bucket; rows past their lifetime are left out, as
    ``outbox_health()`` counts them dead."""
    bounds = []
    for label, youngest, oldest in AGE_BUCKETS:
        due_after = None if oldest is None else moment - oldest
        bounds.append((label, due_after, moment - youngest))
    connection = connections[rows.db]
    if connection.vendor == "postgresql":
        counts = _ages_postgresql(connection, moment, bounds)
    else:
        aggregates = {}
        for index, (_, due_after, due_until) in enumerate(bounds):
            within = Q(due_at__lte=due_until)
            if due_after is not None:
                within &= Q(due_at__gt=due_after)
            aggregates[f"b{index}"] = Count("pk", filter=within)
        found = (
            rows.filter(status__in=OWED_VALUES, due_at__lte=moment)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=moment))
            .aggregate(**aggregates)
        )
        counts = [found[f"b{index}"] or 0 for index in range(len(bounds))]
    return tuple(
        AgeBar(label=label, due_after=due_after, due_until=due_until, owed=counts[i])
        for i, (label, due_after, due_until) in enumerate(bounds)
    )


_AGES_SQL = """
SELECT {buckets}
FROM (
    SELECT due_at FROM {table}
    WHERE status IN {owed} AND due_at <= %(now)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
    ORDER BY due_at
) AS owed
"""


def _ages_postgresql(
    connection: Any, moment: datetime, bounds: list[tuple[str, datetime | None, datetime]]
) -> list[int]:
    """The ages in index order inside a sub-select, as ``introspect._owed_before()`` reads
    them: without the order the planner may read every owed row, scheduled ones too."""
    params: dict[str, Any] = {"now": moment}
    buckets = []
    for index, (_, due_after, due_until) in enumerate(bounds):
        params[f"until{index}"] = due_until
        test = f"due_at <= %(until{index})s"
        if due_after is not None:
            params[f"after{index}"] = due_after
            test += f" AND due_at > %(after{index})s"
        buckets.append(f"count(*) FILTER (WHERE {test})")
    sql = _AGES_SQL.format(
        buckets=", ".join(buckets),
        table=connection.ops.quote_name(DeliveryRecord._meta.db_table),
        owed=STATUS_SQL["owed"],
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return [int(n) for n in row]


def _days(alias: str, rows: Rows, moment: datetime) -> tuple[DayBar, ...]:
    """Day bars from the start of this hour: the rest of this hour from the rows (a short
    range of the due index), every later hour from the scheduled tally (``tally.py``),
    never a row per scheduled delivery."""
    later = horizon(moment)
    hour = later - HOUR
    this_hour = rows.filter(
        status=DeliveryStatus.PENDING, due_at__gt=moment, due_at__lt=later
    ).count()
    sums = (
        ScheduledTally.objects.using(alias)
        .filter(due_hour__gte=later, due_hour__lt=hour + DAYS * DAY)
        .values("due_hour")
        .annotate(n=Sum("rows"))
        .order_by()
    )
    per_day = [0] * DAYS
    per_day[0] = this_hour
    for row in sums:
        index = (clock.normalize(row["due_hour"]) - hour) // DAY
        if 0 <= index < DAYS:
            per_day[index] += row["n"] or 0
    return tuple(
        DayBar(start=hour + i * DAY, end=hour + (i + 1) * DAY, scheduled=max(n, 0))
        for i, n in enumerate(per_day)
    )


def _dead(rows: Rows) -> tuple[tuple[DeadCount, ...], tuple[DeadCount, ...]]:
    """Dead letters by receiver and error type: one read of dde_delivery_dead_type."""
    by_receiver: dict[str, int] = {}
    by_type: dict[str, int] = {}
    grouped = (
        rows.filter(status=DeliveryStatus.DEAD)
        .values("receiver_key", "error_type")
        .annotate(n=Count("*"))
        .order_by()
    )
    for row in grouped:
        by_receiver[row["receiver_key"]] = by_receiver.get(row["receiver_key"], 0) + row["n"]
        kind = row["error_type"] or ""
        by_type[kind] = by_type.get(kind, 0) + row["n"]

    def ranked(counts: dict[str, int]) -> tuple[DeadCount, ...]:
        return tuple(DeadCount(name, n) for name, n in sorted(counts.items(), key=_most_first))

    return ranked(by_receiver), ranked(by_type)


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


__all__ = [
    "AGE_BUCKETS",
    "AgeBar",
    "Dashboard",
    "DayBar",
    "DeadCount",
    "MinuteBar",
    "outbox_dashboard",
]
