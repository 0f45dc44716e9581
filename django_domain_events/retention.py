"""Pruning the log: settled events go once their retention says so, in bounded batches.

An event is deleted only when none of its deliveries is owed (pending, failed, claimed),
checked once to choose candidates and again under a lock at the delete, so a replay
that reopens a row between the two is never cascaded away. Each receiver's newest
success is recorded before its rows go, so ``quiet_receivers`` survives the prune.

A ``@recurring`` schedule's tick rows go too: a fired tick's row with its event, a
skipped or failed one (no event) once it is older than the window. The schedules'
cursors stay, and they alone decide which ticks fire (see ``_delete_old_ticks``).

Dead inbox entries (``DeadMessage``) go by the dead letters' bound, having no event.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.db.models.expressions import Combinable

from . import clock, conf
from .models import (
    OWED_VALUES,
    DeadMessage,
    DeliveryRecord,
    DeliveryStatus,
    EventRecord,
    ReceiverMark,
    TickRecord,
    TickStatus,
    database_alias,
)

CONSUMED = (DeliveryStatus.SUCCEEDED, DeliveryStatus.CANCELLED)


def prune_events(
    older_than: timedelta | None = None,
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    limit: int | None = None,
) -> int:
    """Delete settled events whose retention has run out; returns how many events went.

    ``older_than`` replaces the ``RETENTION_DAYS`` window for events that declared no
    retention of their own. Works in batches of ``PRUNE_BATCH_ROWS`` rows (events and
    deliveries counted alike), at most ``limit`` events in all. A schedule's tick rows
    go with their events; its skipped and failed ones, which have none, once recorded
    longer ago than the window, in batches of as many rows. Dead inbox entries go once
    dead longer than ``DEAD_LETTER_TTL_SECONDS`` or the window, whichever is shorter.
    """
    settings = conf.get()
    if older_than is not None and (
        not isinstance(older_than, timedelta) or older_than < timedelta(0)
    ):
        raise ValueError(f"prune_events(older_than=) must be a timedelta >= 0, not {older_than!r}.")
    rows_per_batch = batch_size or settings.PRUNE_BATCH_ROWS
    if rows_per_batch < 1:
        raise ValueError(f"prune_events(batch_size=) must be >= 1, not {batch_size!r}.")
    if limit is not None and limit < 0:
        raise ValueError(f"prune_events(limit=) must be >= 0 or None, not {limit!r}.")
    moment = clock.normalize(now) if now is not None else clock.now()
    window = older_than if older_than is not None else timedelta(days=settings.RETENTION_DAYS)
    dead_cutoff = moment - window
    if settings.DEAD_LETTER_TTL_SECONDS is not None:
        cutoff = moment - timedelta(seconds=settings.DEAD_LETTER_TTL_SECONDS)
        _delete_old_dead_letters(cutoff, rows_per_batch)
        dead_cutoff = max(dead_cutoff, cutoff)
    _delete_old_dead_messages(dead_cutoff, rows_per_batch)
    deleted = 0
    while limit is None or deleted < limit:
        room = rows_per_batch if limit is None else min(rows_per_batch, limit - deleted)
        batch = _next_batch(moment, window, rows_per_batch, room)
        if not batch:
            break
        deleted += _delete_batch(batch, moment, window)
    _delete_old_ticks(moment - window, rows_per_batch)
    return deleted


def _prunable(moment: datetime, window: timedelta) -> Combinable:
    """Events whose own retention (or the window) allows deletion, settled or not."""
    owed = DeliveryRecord.objects.filter(event=OuterRef("pk"), status__in=OWED_VALUES)
    unconsumed = DeliveryRecord.objects.filter(event=OuterRef("pk")).exclude(status__in=CONSUMED)
    by_age = Q(delete_when="") & (
        Q(prune_after__isnull=True, recorded_at__lte=moment - window) | Q(prune_after__lte=moment)
    )
    return (
        (by_age & ~Exists(owed))
        | (Q(delete_when="settled") & ~Exists(owed))
        | (Q(delete_when="succeeded") & ~Exists(unconsumed))
    )


def _next_batch(moment: datetime, window: timedelta, rows: int, events: int) -> list[int]:
    alias = database_alias()
    chosen = list(
        EventRecord.objects.using(alias)
        .filter(_prunable(moment, window))
        .order_by("pk")
        .values_list("pk", flat=True)[: max(events, 1)]
    )
    if not chosen:
        return []
    sizes = dict(
        DeliveryRecord.objects.using(alias)
        .filter(event_id__in=chosen)
        .values("event_id")
        .annotate(n=Count("pk"))
        .values_list("event_id", "n")
    )
    batch: list[int] = []
    total = 0
    for pk in chosen:
        cost = 1 + sizes.get(pk, 0)
        if batch and total + cost > rows:
            break
        batch.append(pk)
        total += cost
    return batch


def _delete_batch(batch: Sequence[int], moment: datetime, window: timedelta) -> int:
    alias = database_alias()
    with transaction.atomic(using=alias):
        events = EventRecord.objects.using(alias).filter(pk__in=batch).order_by("pk")
        if connections[alias].features.has_select_for_update:
            # The same lock a replay or cancel takes: whoever comes second sees the first.
            list(events.select_for_update().values_list("pk", flat=True))
        still = list(events.filter(_prunable(moment, window)).values_list("pk", flat=True))
        if not still:
            return 0
        going = DeliveryRecord.objects.using(alias).filter(event_id__in=still)
        remember_successes(alias, going)
        going.delete()
        # A fired tick's row goes with its event (the foreign key cascades too; said here
        # so the batch visibly stays bounded: one tick row at most per event).
        TickRecord.objects.using(alias).filter(event_id__in=still).delete()
        EventRecord.objects.using(alias).filter(pk__in=still).delete()
    return len(still)


def _delete_old_ticks(cutoff: datetime, rows_per_batch: int) -> int:
    """Delete skipped and failed tick rows recorded before ``cutoff``, in batches.

    This cannot make a tick fire twice: a relay fires only the ticks after its
    schedule's cursor (``ScheduleRecord.last_tick_at``), which only ever moves forward
    and is never deleted here, so a tick at or before it is never considered again,
    row or no row. Every tick row is at or before its cursor (it is written in the
    transaction that moves the cursor past it), so the unique ``(schedule_key, tick)``
    guard never needs one that is gone: the rows are the history an operator reads.
    """
    alias = database_alias()
    old = TickRecord.objects.using(alias).filter(
        status__in=[TickStatus.SKIPPED, TickStatus.FAILED], recorded_at__lte=cutoff
    )
    deleted = 0
    while batch := list(old.order_by().values_list("pk", flat=True)[:rows_per_batch]):
        count, _ = TickRecord.objects.using(alias).filter(pk__in=batch).delete()
        deleted += count
    return deleted


def remember_successes(alias: str, rows: QuerySet[DeliveryRecord]) -> None:
    """Keep each receiver's newest success among ``rows`` before they are deleted.

    Any row may carry one: ``succeeded_at`` stays through a replay, so a row that succeeded,
    was replayed and then died still shows when its receiver last succeeded.
    """
    newest = (
        rows.filter(succeeded_at__isnull=False)
        .order_by()
        .values("receiver_key")
        .annotate(last=Max("succeeded_at"))
    )
    for row in newest:
        mark, created = ReceiverMark.objects.using(alias).get_or_create(
            receiver_key=row["receiver_key"], defaults={"last_succeeded_at": row["last"]}
        )
        if not created and mark.last_succeeded_at < row["last"]:
            # Another prune may have moved the mark on since it was read: only forward.
            ReceiverMark.objects.using(alias).filter(
                pk=mark.pk, last_succeeded_at__lt=row["last"]
            ).update(last_succeeded_at=row["last"])


def _delete_old_dead_letters(cutoff: datetime, rows_per_batch: int) -> int:
    """Delete dead rows that died before ``cutoff`` (``DEAD_LETTER_TTL_SECONDS``)."""
    alias = database_alias()
    dead = DeliveryRecord.objects.using(alias).filter(
        status=DeliveryStatus.DEAD, completed_at__lte=cutoff
    )
    deleted = 0
    while True:
        batch = list(dead.order_by("pk").values_list("pk", "event_id")[:rows_per_batch])
        if not batch:
            return deleted
        with transaction.atomic(using=alias):
            events = EventRecord.objects.using(alias).filter(pk__in={e for _, e in batch})
            if connections[alias].features.has_select_for_update:
                list(events.order_by("pk").select_for_update().values_list("pk", flat=True))
            going = dead.filter(pk__in=[pk for pk, _ in batch])
            remember_successes(alias, going)
            count, _ = going.delete()
        deleted += count


def _delete_old_dead_messages(cutoff: datetime, rows_per_batch: int) -> int:
    """Delete dead inbox entries dead since before ``cutoff``: received then, and not
    retried (and refused again) since. They have no event to go with, so they keep the
    shorter of a dead letter's two bounds: ``DEAD_LETTER_TTL_SECONDS`` and the window."""
    alias = database_alias()
    old = DeadMessage.objects.using(alias).filter(
        Q(retried_at__isnull=True) | Q(retried_at__lte=cutoff), received_at__lte=cutoff
    )
    deleted = 0
    while batch := list(old.order_by().values_list("pk", flat=True)[:rows_per_batch]):
        count, _ = DeadMessage.objects.using(alias).filter(pk__in=batch).delete()
        deleted += count
    return deleted
