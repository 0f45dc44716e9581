"""What an operator (or the application) does to rows: cancel, replay, requeue, dead letters,
and pause or resume a recurring schedule.

Every operation joins the caller's transaction when called inside one, locks the events
it touches in primary-key order on PostgreSQL and MariaDB (so a cancel, a replay and a
prune of the same event serialise), and wakes the relays once the work it made owed is
committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from . import clock, conf, priority, tally
from .declare import RegisteredReceiver, registry
from .delivery import ordering
from .delivery.outcomes import receiver_lifetime_end
from .delivery.ticks import record_skipped, sync_schedules
from .delivery.wake import wake_after_commit
from .fanout import resolve_due, resolve_targets
from .models import DeliveryRecord, DeliveryStatus, EventRecord, ScheduleRecord, database_alias
from .recurrence import Schedule, aware, schedules
from .retention import remember_successes

REOPENABLE = (
    DeliveryStatus.SUCCEEDED,
    DeliveryStatus.DEAD,
    DeliveryStatus.ORPHANED,
    DeliveryStatus.CANCELLED,
)
CANCELLABLE = (DeliveryStatus.PENDING, DeliveryStatus.FAILED)


def _ids(values: Iterable[Any] | None, what: str) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} takes a list of ids, not the string {values!r}.")
    ids = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} takes integer ids; {value!r} is not one.")
        ids.append(value)
    return ids


def lock_events(alias: str, event_ids: Iterable[int]) -> list[int]:
    """Lock the events in primary-key order; returns the ids that exist."""
    events = EventRecord.objects.using(alias).filter(pk__in=list(event_ids)).order_by("pk")
    if connections[alias].features.has_select_for_update:
        events = events.select_for_update()
    return list(events.values_list("pk", flat=True))


def _reopened(row_receiver: RegisteredReceiver | None, due_at: datetime) -> dict[str, Any]:
    """The fields that make a row owed again from ``due_at``, with a fresh budget."""
    return {
        "status": DeliveryStatus.PENDING,
        "attempts": 0,
        "available_at": due_at,
        "due_at": due_at,
        "expires_at": receiver_lifetime_end(row_receiver, due_at),
        "claimed_by": "",
        "claimed_at": None,
        "lease_expires_at": None,
        "last_error": "",
        "completed_at": None,
    }


def _ranked(row_receiver: RegisteredReceiver, due_at: datetime) -> dict[str, Any]:
    """A new row's place in the claim, from its receiver's priority (``priority.py``)."""
    credit = priority.credit(row_receiver.priority)
    return {"priority_credit": credit, "claim_rank": priority.rank(due_at) - credit}


# cancel ------------------------------------------------------------------------


def cancel_deliveries(
    event_ids: Iterable[int],
    *,
    receiver_key: str | None = None,
    delivery_ids: Iterable[int] | None = None,
) -> dict[str, int]:
    """Settle the owed rows of these events as cancelled, so no relay ever claims them.

    Pending and failed rows are cancelled; a claimed row is left to the worker running it
    and counted in ``in_flight``; settled rows keep their outcome.
    """
    events = _ids(event_ids, "cancel_deliveries(event_ids)") or []
    only = _ids(delivery_ids, "cancel_deliveries(delivery_ids=)")
    if receiver_key is not None and not isinstance(receiver_key, str):
        raise TypeError(
            f"cancel_deliveries(receiver_key=) takes a key string, not {receiver_key!r}."
        )
    alias = database_alias()
    with transaction.atomic(using=alias):
        lock_events(alias, events)
        rows = DeliveryRecord.objects.using(alias).filter(event_id__in=events)
        if receiver_key is not None:
            rows = rows.filter(receiver_key=receiver_key)
        if only is not None:
            rows = rows.filter(pk__in=only)
        scheduled = rows.filter(status__in=CANCELLABLE, due_at__gte=tally.horizon())
        if connections[alias].features.has_select_for_update:
            scheduled = scheduled.select_for_update()  # no claim takes them from under us
        leaving = list(scheduled.values_list("receiver_key", "due_at"))
        cancelled = rows.filter(status__in=CANCELLABLE).update(
            status=DeliveryStatus.CANCELLED, completed_at=clock.now(), lease_expires_at=None
        )
        tally.record(alias, left=leaving)
        in_flight = rows.filter(status=DeliveryStatus.CLAIMED).count()
    return {"cancelled": cancelled, "in_flight": in_flight}


def orphan_undeclared(receiver_keys: Iterable[str] | None = None) -> int:
    """Orphan now the owed rows of receivers this process does not declare, instead of
    waiting ``ORPHAN_AFTER_SECONDS`` for a relay of another release to run them.

    For after a deploy that removed a receiver for good. ``receiver_keys`` narrows it to
    those keys, each of which must be undeclared here. Claimed rows are left to the
    worker running them. Returns the number of rows orphaned.
    """
    keys = None if receiver_keys is None else _undeclared_keys(receiver_keys)
    declared = [r.key for r in registry.receivers if r.durable]
    alias = database_alias()
    with transaction.atomic(using=alias):
        rows = DeliveryRecord.objects.using(alias).filter(status__in=CANCELLABLE)
        rows = rows.exclude(receiver_key__in=declared)
        if keys is not None:
            rows = rows.filter(receiver_key__in=keys)
        scheduled = rows.filter(due_at__gte=tally.horizon())
        if connections[alias].features.has_select_for_update:
            scheduled = scheduled.select_for_update()  # no claim takes them from under us
        leaving = list(scheduled.values_list("receiver_key", "due_at"))
        orphaned = rows.update(
            status=DeliveryStatus.ORPHANED,
            completed_at=clock.now(),
            lease_expires_at=None,
            last_error="orphaned by an operator: the receiver is not declared by this "
            "release; restore it and replay the event, or leave the row as a record.",
        )
        tally.record(alias, left=leaving)
    return orphaned


def _undeclared_keys(receiver_keys: Iterable[str]) -> list[str]:
    if isinstance(receiver_keys, str):
        raise TypeError(f"orphan_undeclared() takes a list of keys, not {receiver_keys!r}.")
    keys = list(receiver_keys)
    for key in keys:
        declared = registry.receiver(key)
        if declared is not None and declared.durable:
            raise ValueError(
                f"receiver {key!r} is declared here as a durable receiver: its rows are "
                "owed to it, not orphans. Use cancel_deliveries to withdraw them."
            )
    return keys


# replay ------------------------------------------------------------------------


class EventsNotFound(LookupError):
    """Some of the events asked for are not in the log (pruned, or never fired)."""


def replay_events(
    event_ids: Iterable[int], *, receiver_keys: Iterable[str] | None = None
) -> dict[str, int]:
    """Deliver these events again: reopen settled rows with a fresh budget, add missing ones.

    Claimed rows are left alone, owed ones stay as they are. ``targets=`` are resolved
    again (new targets added, ones no longer returned untouched) and ``due=`` too: a
    reopened or added row is owed from the later of its due time and now.
    """
    events = _ids(event_ids, "replay_events(event_ids)") or []
    keys = _check_keys(receiver_keys)
    alias = database_alias()
    reopened = added = 0
    with transaction.atomic(using=alias):
        found = set(lock_events(alias, events))
        missing = sorted(set(events) - found)
        if missing:
            raise EventsNotFound(
                f"No event {', '.join(map(str, missing))} in the log: pruned, or never "
                "fired. Nothing was replayed."
            )
        for record in EventRecord.objects.using(alias).filter(pk__in=events).order_by("pk"):
            r, a = _replay_event(alias, record, keys)
            reopened, added = reopened + r, added + a
        if reopened or added:
            wake_after_commit(alias)
    return {"reopened": reopened, "added": added}


def _check_keys(receiver_keys: Iterable[str] | None) -> set[str] | None:
    if receiver_keys is None:
        return None
    if isinstance(receiver_keys, str):
        receiver_keys = [receiver_keys]
    keys = set(receiver_keys)
    for key in sorted(keys):
        declared = registry.receiver(key)
        if declared is None or not declared.durable:
            raise ValueError(
                f"{key!r} is not a durable receiver; replay takes the keys of declared "
                "durable receivers (see manage.py export_catalogue)."
            )
    return keys


def _replay_event(alias: str, record: EventRecord, keys: set[str] | None) -> tuple[int, int]:
    registered = registry.event_named(record.name)
    if registered is None:
        raise LookupError(
            f"Event #{record.pk} is a {record.name!r}, which is no longer declared; "
            "declare it again to replay it."
        )
    evt = registry.decode(record.name, record.payload, record.version)
    now = clock.now()
    reopened = added = 0
    entered: list[tuple[str, datetime]] = []
    existing = {
        (row.receiver_key, row.target): row
        for row in DeliveryRecord.objects.using(alias).filter(event_id=record.pk)
    }
    succeeded = {pair: row.succeeded_at for pair, row in existing.items()}
    for declared in registry.receivers_for(registered.event_class):
        if not declared.durable or (keys is not None and declared.key not in keys):
            continue
        due_at = max(resolve_due(declared, evt, record.occurred_at, record.recorded_at), now)
        fresh = []
        for target in resolve_targets(record, evt, declared):
            row = existing.get((declared.key, target))
            if row is not None and declared.ordered_by is not None and row.status in REOPENABLE:
                _moved_to_the_end(alias, row)  # replay appends to the key's order
                row = None
            if row is None:
                fresh.append(
                    DeliveryRecord(
                        event_id=record.pk,
                        receiver_key=declared.key,
                        target=target,
                        max_attempts=declared.max_attempts,
                        **_reopened(declared, due_at),
                        **_ranked(declared, due_at),
                        order_key=ordering.order_key(declared, evt),
                        succeeded_at=succeeded.get((declared.key, target)),
                    )
                )
            elif row.status in REOPENABLE and (
                DeliveryRecord.objects.using(alias)
                .filter(pk=row.pk, status=row.status)
                .update(max_attempts=declared.max_attempts, **_reopened(declared, due_at))
            ):
                reopened += 1
                entered.append((declared.key, due_at))
        DeliveryRecord.objects.using(alias).bulk_create(fresh)
        added += len(fresh)
        entered += [(declared.key, due_at)] * len(fresh)
    tally.record(alias, entered=entered)
    return reopened, added


def _moved_to_the_end(alias: str, row: DeliveryRecord) -> None:
    """Delete a settled row of an ordered receiver, so its replay is written as a new row
    (a larger id: the end of its key's order) rather than reopened at its old place."""
    DeliveryRecord.objects.using(alias).filter(pk=row.pk, status=row.status).delete()


# requeue and dead letters -------------------------------------------------------


def dead_letters(
    *,
    receiver_key: str | None = None,
    event_name: str | None = None,
    older_than: timedelta | None = None,
) -> QuerySet[DeliveryRecord]:
    """Dead rows, oldest death first, with their events; narrowed by the arguments."""
    rows = DeliveryRecord.objects.using(database_alias()).filter(status=DeliveryStatus.DEAD)
    if receiver_key is not None:
        rows = rows.filter(receiver_key=receiver_key)
    if event_name is not None:
        rows = rows.filter(event__name=event_name)
    if older_than is not None:
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise ValueError(f"older_than must be a timedelta >= 0, not {older_than!r}.")
        rows = rows.filter(completed_at__lte=clock.now() - older_than)
    return rows.select_related("event").order_by("completed_at", "pk")


def requeue_dead(
    *,
    receiver_key: str | None = None,
    delivery_ids: Iterable[int] | None = None,
    limit: int | None = None,
) -> int:
    """Make dead rows owed now with a fresh attempt budget; returns how many."""
    only = _ids(delivery_ids, "requeue_dead(delivery_ids=)")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"requeue_dead(limit=) must be an int >= 0 or None, not {limit!r}.")
    if limit == 0:
        return 0
    alias = database_alias()
    with transaction.atomic(using=alias):
        rows = dead_letters(receiver_key=receiver_key)
        if only is not None:
            rows = rows.filter(pk__in=only)
        chosen = list(rows.order_by("pk").values_list("pk", "event_id", "receiver_key")[:limit])
        lock_events(alias, sorted({event_id for _, event_id, _ in chosen}))
        now = clock.now()
        requeued = 0
        for key, ids in _by_key(chosen).items():
            requeued += (
                DeliveryRecord.objects.using(alias)
                .filter(pk__in=ids, status=DeliveryStatus.DEAD)
                .update(**_reopened(registry.receiver(key), now))
            )  # owed now, so never in the scheduled tally (tally.py)
        if requeued:
            wake_after_commit(alias)
    return requeued


def retry_now(delivery_ids: Iterable[int]) -> int:
    """Make failed rows that are waiting out their backoff claimable now; returns how many.

    Sets ``available_at`` to now on the rows that are still ``failed`` with their next
    attempt ahead, checked in the write itself (a compare-and-set): a row claimed,
    settled, cancelled or already due meanwhile is left as it is. The attempt budget,
    the due time and the lifetime are unchanged.
    """
    ids = _ids(delivery_ids, "retry_now(delivery_ids)")
    if ids is None:
        raise TypeError("retry_now() takes a list of delivery ids.")
    alias = database_alias()
    with transaction.atomic(using=alias):
        now = clock.now()
        moved = (
            DeliveryRecord.objects.using(alias)
            .filter(pk__in=ids, status=DeliveryStatus.FAILED, available_at__gt=now)
            .update(available_at=now)
        )  # due_at unchanged: a failed row is due already, so never in the tally
        if moved:
            wake_after_commit(alias)
    return moved


def _by_key(rows: Sequence[tuple[int, int, str]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for pk, _, key in rows:
        grouped.setdefault(key, []).append(pk)
    return grouped


def purge_dead(
    *,
    receiver_key: str | None = None,
    event_name: str | None = None,
    older_than: timedelta | None = None,
    all: bool = False,  # noqa: A002 - the public name
) -> int:
    """Delete dead rows; refuses to delete every dead row unless ``all=True``.

    Works in batches of ``PRUNE_BATCH_ROWS``, each under the lock of its events, and the
    delete repeats the selection: a row a replay or requeue reopened after it was read is
    no longer dead, and stays.
    """
    if receiver_key is None and event_name is None and older_than is None and not all:
        raise ValueError(
            "purge_dead() with no receiver_key, event_name or older_than would delete every "
            "dead letter; narrow it, or pass all=True."
        )
    rows = dead_letters(receiver_key=receiver_key, event_name=event_name, older_than=older_than)
    alias, size = database_alias(), conf.get().PRUNE_BATCH_ROWS
    purged, after = 0, 0
    with transaction.atomic(using=alias):
        while batch := list(
            rows.filter(pk__gt=after).order_by("pk").values_list("pk", "event_id")[:size]
        ):
            lock_events(alias, sorted({event_id for _, event_id in batch}))
            going = rows.filter(pk__in=[pk for pk, _ in batch])
            # A dead row may have succeeded before a replay: keep that for quiet_receivers().
            remember_successes(alias, going)
            count, _ = going.delete()
            purged += count
            after = batch[-1][0]
    return purged


# Schedules ------------------------------------------------------------------


def pause_schedule(key: str, *, now: datetime | None = None) -> bool:
    """Stop a ``@recurring`` schedule firing until it is resumed; False if already paused.

    The pause is a row, so it holds for every relay and across restarts.
    """
    schedule = _declared_schedule(key)
    moment = clock.normalize(now) if now is not None else clock.now()
    alias = database_alias()
    with transaction.atomic(using=alias):
        sync_schedules(moment)
        return bool(
            ScheduleRecord.objects.using(alias)
            .filter(key=schedule.key, paused_at__isnull=True)
            .update(paused_at=moment, next_tick_at=None)
        )


def resume_schedule(key: str, *, now: datetime | None = None) -> bool:
    """Let a paused schedule fire again from its next tick; False if it was not paused.

    The ticks that fell in the pause are recorded as skipped, not fired.
    """
    schedule = _declared_schedule(key)
    moment = clock.normalize(now) if now is not None else clock.now()
    alias = database_alias()
    with transaction.atomic(using=alias):
        rows = ScheduleRecord.objects.using(alias).filter(key=schedule.key, paused_at__isnull=False)
        if connections[alias].features.has_select_for_update:
            rows = rows.select_for_update()
        row = rows.first()
        if row is None:
            return False
        paused_at = aware(row.paused_at or moment)
        after = aware(row.last_tick_at) if row.last_tick_at else paused_at
        paused_ticks = schedule.latest(after, aware(moment), 1)
        if paused_ticks:
            record_skipped(
                alias,
                schedule,
                (schedule.next_after(after), paused_ticks[0]),
                f"the schedule was paused from {paused_at.isoformat()}",
                aware(moment),
            )
            row.last_tick_at = clock.normalize(paused_ticks[0])
        row.paused_at = None
        row.next_tick_at = clock.normalize(schedule.next_after(aware(moment)))
        row.save(using=alias, update_fields=["paused_at", "next_tick_at", "last_tick_at"])
        return True


def forget_schedule(key: str) -> bool:
    """Delete the cursor row of a schedule the code no longer declares; False if none.

    Refused for a declared schedule: remove its ``@recurring`` and deploy first. Its tick
    rows stay, as history, until the prune. Declared again later, the schedule starts
    afresh, as a new one: none of the ticks in between fire.
    """
    if schedules.get(key) is not None:
        raise ValueError(
            f"Schedule {key!r} is still declared with @recurring; remove the declaration and "
            "deploy it to every relay first (or pause it: pause_schedule)."
        )
    deleted, _ = ScheduleRecord.objects.using(database_alias()).filter(key=key).delete()
    return bool(deleted)


def _declared_schedule(key: str) -> Schedule:
    schedule = schedules.get(key)
    if schedule is None:
        known = ", ".join(schedules.keys()) or "none are declared"
        raise ValueError(f"No @recurring schedule has the key {key!r}; the keys are: {known}.")
    return schedule
