"""The scheduled tally: how many owed rows each receiver has due in each later hour.

``outbox_health()`` reports the work scheduled for later, and a reminder service can
hold millions of such rows; counting them one index entry at a time would make the
health check as slow as the schedule is long. So every write that puts an owed row due
in a later hour into the table, or takes one out of the owed set, appends a delta here
in the same transaction: ``fire()``, a replay, ``NotYet``, a settlement, a cancellation.

Only the hours after the current one are kept exact. A row comes due without any
write, so the hour under way is read from the rows themselves (a short index range)
and the tally rows of hours that have begun are dropped when the relay merges the
deltas. Deltas are appended, never added to a shared counter, so concurrent writers
never queue on one hot row; ``compact()`` folds them into one row per receiver and hour.

Rows deleted or edited by hand bypass the tally: their hours stay miscounted until they
begin, or until ``recount()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Sum
from django.utils import timezone

from . import clock
from .models import OWED_VALUES, DeliveryRecord, ScheduledTally, database_alias

HOUR = timedelta(hours=1)

Deltas = Counter[tuple[str, datetime]]


def hour_of(moment: datetime) -> datetime:
    """The start of the hour ``moment`` falls in (UTC when aware, local when naive)."""
    if timezone.is_aware(moment):
        moment = moment.astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)


def horizon(moment: datetime | None = None) -> datetime:
    """The first due time the tally answers for, read at ``moment``: the next hour's start.

    Never before the hour after the real clock's, since writes are tallied against it.
    """
    real = clock.now()
    later = real if moment is None else max(clock.normalize(moment), real)
    return hour_of(later) + HOUR


def deltas(
    *,
    entered: Iterable[tuple[str, datetime]] = (),
    left: Iterable[tuple[str, datetime]] = (),
) -> Deltas:
    """The tally changes for rows (``(receiver_key, due_at)``) entering or leaving the owed
    set, keeping only those due from the next hour on; empty for the common case."""
    start = horizon()
    changes: Deltas = Counter()
    for key, due in entered:
        if is_tallied(due, start):
            changes[key, hour_of(due)] += 1
    for key, due in left:
        if is_tallied(due, start):
            changes[key, hour_of(due)] -= 1
    return changes


def is_tallied(due: datetime, start: datetime) -> bool:
    """Whether a row due at ``due`` is counted in the tally whose horizon is ``start``."""
    return due >= start


def write(alias: str, changes: Deltas, model: Any = ScheduledTally) -> None:
    """Append ``changes``; call it in the transaction that changed the rows."""
    rows = [
        model(receiver_key=key, due_hour=hour, rows=n)
        for (key, hour), n in sorted(changes.items())
        if n
    ]
    if rows:
        model.objects.using(alias).bulk_create(rows)


def record(
    alias: str,
    *,
    entered: Iterable[tuple[str, datetime]] = (),
    left: Iterable[tuple[str, datetime]] = (),
) -> None:
    """``write(deltas(...))``: tally rows that entered or left the owed set."""
    write(alias, deltas(entered=entered, left=left))


def scheduled_from(alias: str, start: datetime) -> dict[str, int]:
    """Owed rows per receiver due from ``start`` (a ``horizon()``) on: one small query."""
    sums = (
        ScheduledTally.objects.using(alias)
        .filter(due_hour__gte=start)
        .values("receiver_key")
        .annotate(n=Sum("rows"))
        .order_by()
    )
    return {row["receiver_key"]: row["n"] for row in sums if row["n"]}


def compact(using: str | None = None) -> int:
    """Fold the deltas into one row per receiver and hour; drop hours that have begun.

    Replaces exactly the rows it read and locked, so a delta appended meanwhile is kept.
    The relay calls it about once a minute. Returns how many rows it removed.
    """
    alias = using or database_alias()
    start = horizon()
    with transaction.atomic(using=alias):
        rows = ScheduledTally.objects.using(alias).order_by("pk")
        if connections[alias].features.has_select_for_update:
            rows = rows.select_for_update()
        read = list(rows.values_list("pk", "receiver_key", "due_hour", "rows"))
        sums: Deltas = Counter()
        for _, key, hour, n in read:
            if clock.normalize(hour) >= start:
                sums[key, clock.normalize(hour)] += n
        kept = sum(1 for n in sums.values() if n)
        if kept == len(read):
            return 0
        _delete(alias, [pk for pk, *_ in read])
        write(alias, sums)
    return len(read) - kept


def recount(using: str | None = None) -> int:
    """Rebuild the tally from the delivery rows; returns the rows it counted.

    For after rows were written or deleted behind the package's back. On PostgreSQL it
    holds writers of the tally off while it counts; elsewhere run it while nothing fires.
    """
    alias = using or database_alias()
    with transaction.atomic(using=alias):
        return rebuild(alias, DeliveryRecord, ScheduledTally)


def rebuild(alias: str, delivery: Any, tally: Any) -> int:
    """``recount()`` with the given models (a migration passes its historical ones)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            table = connection.ops.quote_name(tally._meta.db_table)
            cursor.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    tally.objects.using(alias).all().delete()  # first: on SQLite, takes the write lock
    start = horizon()
    sums: Deltas = Counter()
    owed = delivery.objects.using(alias).filter(status__in=OWED_VALUES, due_at__gte=start)
    for key, due in owed.values_list("receiver_key", "due_at").iterator(chunk_size=5000):
        sums[key, hour_of(clock.normalize(due))] += 1
    write(alias, sums, tally)
    return sum(sums.values())


def _delete(alias: str, pks: list[int], chunk: int = 900) -> None:
    for index in range(0, len(pks), chunk):
        ScheduledTally.objects.using(alias).filter(pk__in=pks[index : index + chunk]).delete()
