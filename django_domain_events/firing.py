"""``fire()``: record an event and the deliveries it owes, inside the caller's transaction.

The path of one event: encode the payload, resolve each durable receiver's rows (due
time, lifetime, targets) as plain tuples, write the event row and all its delivery rows,
run the ``INLINE`` receivers, and register what runs after commit (``ON_COMMIT``
receivers, eager attempts, one relay wake-up). Anything that raises before the caller
commits rolls the whole change back: the event exists if and only if it committed.

On PostgreSQL the event row and its delivery rows are one statement, one round trip
(``PgInsert``). Elsewhere the ORM writes them: one ``INSERT`` for the event, one
multi-row ``INSERT`` for the deliveries. What the registry can answer about an event
class (its receivers by mode, the eager ones, whether rows need user code) is worked
out once per class (``_Plan``), not on every call.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import IntegrityError, connections, transaction

from . import clock, conf, signals, tally, tracing
from .codec import encode_event, text_problem
from .declare import (
    DURABLE,
    INLINE,
    ON_COMMIT,
    RegisteredEvent,
    RegisteredReceiver,
    Retention,
    registry,
)
from .delivery import ordering
from .delivery.passes import default_worker_id, deliver_one
from .delivery.run import call_receiver
from .delivery.wake import wake_after_commit
from .fanout import delivery_record, delivery_rows, inline_context, rows_for
from .ids import new_id
from .models import DeliveryRecord, EventRecord, database_alias
from .pg_insert import PgInsert, Row
from .scope import Cause, Scope, caused_by, current_cause, current_scope, suppression_for

logger = logging.getLogger("django_domain_events.fire")


class OutsideAtomicWarning(RuntimeWarning):
    """``fire()`` was called in autocommit mode: the event commits on its own."""


def fire(
    evt: object,
    *,
    occurred_at: datetime | None = None,
    dedupe_key: str | None = None,
    priority: int | None = None,
) -> int | None:
    """Record ``evt`` and its deliveries in the current transaction; return the event id.

    Returns None only inside ``suppressed(..., record=False)``. With a ``dedupe_key``, a
    second fire of the same event name and key returns the first event's id and writes
    nothing. A ``priority`` stands for every receiver's declared ``priority=`` on this
    event's rows (one urgent order among bulk ones).
    """
    plan = _plan_for(type(evt))
    _check_dedupe_key(plan.event, dedupe_key)
    _check_priority(priority)
    suppression = suppression_for(type(evt))
    if suppression is not None and not suppression[1]:
        return None
    alias = database_alias()
    if conf.get().WARN_OUTSIDE_ATOMIC and not connections[alias].in_atomic_block:
        warnings.warn(
            f"fire({plan.event.name}) outside transaction.atomic(): the event commits on "
            "its own, apart from the change it records. Wrap both in atomic().",
            OutsideAtomicWarning,
            stacklevel=2,
        )
    occurred = clock.accept(occurred_at, what="fire(occurred_at=)") if occurred_at else None
    return _record(plan, evt, occurred, dedupe_key, alias, None, priority)[0]


@dataclass(frozen=True)
class Received:
    """What a consumed message sets on its event row in place of the firing context.

    The inbox (``inbox.py``) records a message through ``record_received``: the row is
    attributed to the other service (``source``), continues its correlation chain and
    trace, remembers the message (``origin``, stored as ``EventRecord.received``) and
    gives every delivery row at most the message's lifetime (``expires_at``).
    """

    source: str
    origin: dict[str, str]
    correlation_id: str = ""
    trace_context: str = ""
    expires_at: datetime | None = None


def record_received(
    evt: object, *, occurred_at: datetime, dedupe_key: str, received: Received
) -> tuple[int, bool]:
    """Record a consumed message's event exactly as ``fire()`` records a local one.

    Returns ``(event id, created)``: ``created`` is False when ``dedupe_key`` (the inbox
    key of the message's source and id) is already held, and then nothing is written.
    """
    found, created = _record(
        _plan_for(type(evt)), evt, occurred_at, dedupe_key, database_alias(), received
    )
    assert found is not None  # a suppression with record=False is the only None
    return found, created


def _record(
    plan: _Plan,
    evt: object,
    occurred_at: datetime | None,
    dedupe_key: str | None,
    alias: str,
    received: Received | None,
    priority_of: int | None = None,
) -> tuple[int | None, bool]:
    """The one path of ``fire()`` and the inbox: ``(event id, whether it was written)``.

    ``priority_of``, when given, is every row's priority instead of its receiver's."""
    suppression = suppression_for(type(evt))
    if suppression is not None and not suppression[1]:
        return None, False
    recorded_at = clock.now()
    occurred = occurred_at or recorded_at
    record = _event_row(
        plan.event, evt, occurred, recorded_at, dedupe_key, suppression, alias, received
    )
    durable = () if suppression is not None else plan.durable
    expires_at = received.expires_at if received is not None else None
    # Rows that need no user code are known now, and go out with the event row: one
    # statement on PostgreSQL. targets= and due= callables run once the event row exists,
    # as they always have: they are given its id, and a duplicate must not run them.
    rows = (
        [] if plan.calls_user_code else delivery_rows(record, evt, durable, expires_at, priority_of)
    )
    if plan.calls_user_code:  # the keys' errors before anything is written
        for receiver in durable:
            ordering.order_key(receiver, evt)
    with transaction.atomic(using=alias, savepoint=False):
        existing, eager_ids = _insert_event(alias, record, rows, plan.eager_keys)
        if existing is not None:
            return existing, False
        if suppression is None:
            _after_insert(
                plan, evt, record, rows, eager_ids, alias, durable, expires_at, priority_of
            )
    return record.pk, True


def _after_insert(
    plan: _Plan,
    evt: object,
    record: EventRecord,
    rows: list[Row],
    eager_ids: list[int],
    alias: str,
    durable: Sequence[RegisteredReceiver],
    expires_at: datetime | None,
    priority_of: int | None = None,
) -> None:
    """Once the event row is written: the rows needing user code, the tally, ``INLINE``
    receivers, and what runs after commit."""
    if plan.calls_user_code:
        rows = delivery_rows(record, evt, durable, expires_at, priority_of)
        eager_ids = _insert_deliveries(alias, record.pk, rows, plan.eager_keys)
    _count_scheduled(plan, rows, alias)
    for receiver in plan.inline:
        with caused_by(record.pk, record.correlation_id):
            call_receiver(receiver, evt, inline_context(record, receiver))
    for receiver in plan.on_commit:
        transaction.on_commit(partial(_run_on_commit, record, evt, receiver), using=alias)
    _after_commit(rows, eager_ids, alias)
    if signals.event_recorded.has_listeners(type(evt)):
        recorded = partial(_send_recorded, record, evt, len(rows))
        transaction.on_commit(recorded, using=alias)


def _reads_record(plan: _Plan, cls: type) -> bool:
    """Whether ``_after_insert`` hands the event row to anything: user code computing
    rows, ``INLINE`` or ``ON_COMMIT`` receivers, ``event_recorded`` listeners. When not,
    it is ``_count_scheduled`` and ``_after_commit`` alone, and needs no model instance."""
    return (
        plan.calls_user_code
        or bool(plan.inline or plan.on_commit)
        or signals.event_recorded.has_listeners(cls)
    )


def _count_scheduled(plan: _Plan, rows: Sequence[Row], alias: str) -> None:
    if plan.scheduled and rows:
        tally.record(alias, entered=[(row.receiver_key, row.due_at) for row in rows])


def _after_commit(rows: Sequence[Row], eager_ids: list[int], alias: str) -> None:
    """The eager attempts and the relays' wake-up, once the transaction commits."""
    if eager_ids:
        transaction.on_commit(partial(_attempt_eagerly, eager_ids), using=alias)
    if rows:
        wake_after_commit(alias)


def record_received_many(
    items: Sequence[tuple[object, datetime, str, Received]],
) -> list[tuple[int, bool]]:
    """``record_received`` for a batch of ``(event, occurred_at, dedupe_key, received)``,
    in the caller's transaction, as ``(event id, created)`` in order. On PostgreSQL, when
    no row needs user code, the whole batch is one statement (``PgInsert.batch``): every
    event row, every delivery row; a key seen twice in the batch is written once.
    Everything after the insert is ``fire()``'s own."""
    alias = database_alias()
    connection = connections[alias]
    plans = [_plan_for(type(item[0])) for item in items]
    if (
        connection.vendor != "postgresql"
        or any(plan.calls_user_code for plan in plans)
        or any(suppression_for(type(item[0])) is not None for item in items)
    ):
        return [
            record_received(evt, occurred_at=at, dedupe_key=key, received=got)
            for evt, at, key, got in items
        ]
    prepared: dict[tuple[str, str], tuple[_Plan, object, dict[str, Any], list[Row]]] = {}
    for plan, (evt, occurred_at, key, got) in zip(plans, items, strict=True):
        if (plan.event.name, key) not in prepared:
            now = clock.now()
            values = _event_values(plan.event, evt, occurred_at, now, key, None, alias, got)
            rows = rows_for(evt, plan.durable, occurred_at, now, got.expires_at, None)
            prepared[(plan.event.name, key)] = (plan, evt, values, rows)
    eager_keys = sorted({key for plan in plans for key in plan.eager_keys})
    with transaction.atomic(using=alias, savepoint=False):
        written = PgInsert.get(connection).batch(
            connection, [(values, rows) for _, _, values, rows in prepared.values()], eager_keys
        )
        for pair, (plan, evt, values, rows) in prepared.items():
            if pair not in written:
                continue
            pk, eager_ids = written[pair]
            if _reads_record(plan, type(evt)):
                record = EventRecord(id=pk, **values)
                record._state.adding, record._state.db = False, alias
                _after_insert(plan, evt, record, rows, eager_ids, alias, plan.durable, None)
            else:  # what _after_insert does with no one to hand the row to
                _count_scheduled(plan, rows, alias)
                _after_commit(rows, eager_ids, alias)
        holding = _events_holding(alias, [pair for pair in prepared if pair not in written])
    results: list[tuple[int, bool]] = []
    created: set[tuple[str, str]] = set()
    for plan, (_, _, key, _) in zip(plans, items, strict=True):
        pair = (plan.event.name, key)
        if pair in written and pair not in created:
            created.add(pair)
            results.append((written[pair][0], True))
        else:
            results.append((written[pair][0] if pair in written else holding[pair], False))
    return results


def _events_holding(alias: str, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The ids of the events already holding each ``(name, dedupe_key)``: one query."""
    if not pairs:
        return {}
    found = EventRecord.objects.using(alias).filter(dedupe_key__in={key for _, key in pairs})
    held: dict[tuple[str, str], int] = {}
    for name, key, pk in found.values_list("name", "dedupe_key", "pk").order_by("pk"):
        held.setdefault((name, key or ""), pk)
    missing = [pair for pair in pairs if pair not in held]
    if missing:  # taken by a transaction this one cannot see: let the caller retry
        name, key = missing[0]
        raise IntegrityError(
            f"fire({name}, dedupe_key={key!r}): the key is taken by an event this "
            "transaction cannot see."
        )
    return held


def _send_recorded(record: EventRecord, evt: object, deliveries: int) -> None:
    signals.event_recorded.send(
        sender=type(evt),
        event_id=record.pk,
        event_name=record.name,
        event=evt,
        deliveries=deliveries,
    )


@dataclass(frozen=True)
class _Plan:
    """What ``fire()`` needs to know about an event class's receivers, worked out once.

    Rebuilt when the registry's answer for the class changes (a receiver declared or
    forgotten), which ``_plan_for`` notices by identity.
    """

    event: RegisteredEvent
    receivers: tuple[RegisteredReceiver, ...]
    durable: tuple[RegisteredReceiver, ...]
    inline: tuple[RegisteredReceiver, ...]
    on_commit: tuple[RegisteredReceiver, ...]
    eager_keys: tuple[str, ...]
    calls_user_code: bool  # a durable receiver's rows need a targets= or due= callable
    scheduled: bool  # a due= receiver: rows may fall in a later hour, for the tally


_plans: dict[type, _Plan] = {}


def _plan_for(cls: type) -> _Plan:
    registered = registry.event_for_class(cls)
    if registered is None:
        raise TypeError(
            f"fire() takes an instance of an @event class, and {cls.__qualname__} is "
            "not one; decorate it with @event."
        )
    receivers = registry.receivers_for(cls)
    plan = _plans.get(cls)
    if plan is not None and plan.receivers is receivers and plan.event is registered:
        return plan
    durable = tuple(r for r in receivers if r.mode is DURABLE)
    plan = _Plan(
        event=registered,
        receivers=receivers,
        durable=durable,
        inline=tuple(r for r in receivers if r.mode is INLINE),
        on_commit=tuple(r for r in receivers if r.mode is ON_COMMIT),
        eager_keys=tuple(r.key for r in durable if r.eager),
        calls_user_code=any(
            r.targets is not None or (r.due is not None and not isinstance(r.due, timedelta))
            for r in durable
        ),
        scheduled=any(r.due is not None for r in durable),
    )
    _plans[cls] = plan
    return plan


def _check_dedupe_key(registered: RegisteredEvent, dedupe_key: str | None) -> None:
    if dedupe_key is None:
        return
    if not isinstance(dedupe_key, str) or not dedupe_key or len(dedupe_key) > 255:
        raise ValueError(
            f"fire(dedupe_key=) must be a non-empty string of at most 255 characters, "
            f"not {dedupe_key!r}."
        )
    problem = text_problem(dedupe_key)
    if problem:
        raise ValueError(f"fire(dedupe_key={dedupe_key!r}) {problem}.")
    if isinstance(registered.retention, Retention):
        raise ValueError(
            f"fire(dedupe_key=) on {registered.name}, declared with retention="
            f"{registered.retention}: its rows are deleted as soon as they settle, so the "
            "key would guard nothing. Use a timedelta retention, or drop the dedupe_key."
        )


def _check_priority(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(
            f"fire(priority=) must be an int (higher runs first; it replaces the "
            f"receivers' declared priority= for this event's rows) or None, not {value!r}."
        )


def _event_row(
    registered: RegisteredEvent,
    evt: object,
    occurred_at: datetime,
    recorded_at: datetime,
    dedupe_key: str | None,
    suppression: tuple[str, bool] | None,
    alias: str,
    received: Received | None = None,
) -> EventRecord:
    values = _event_values(
        registered, evt, occurred_at, recorded_at, dedupe_key, suppression, alias, received
    )
    return EventRecord(**values)


def _event_values(
    registered: RegisteredEvent,
    evt: object,
    occurred_at: datetime,
    recorded_at: datetime,
    dedupe_key: str | None,
    suppression: tuple[str, bool] | None,
    alias: str,
    received: Received | None = None,
) -> dict[str, Any]:
    """The event row's values by field name: what ``fire()`` writes, with or without a
    model instance (a consumed batch goes without: ``PgInsert.batch``)."""
    retention = registered.retention
    if received is None:
        scope, cause = current_scope(), current_cause()
        correlation_id, trace_context = _correlation(alias, cause), tracing.current()
    else:  # attributed to the other service, continuing its chain and trace
        scope, cause = Scope(actor_key=received.source, actor_label=received.source), None
        correlation_id = received.correlation_id or new_id()
        trace_context = received.trace_context
    return dict(
        name=registered.name,
        version=registered.version,
        payload=encode_event(evt),
        occurred_at=occurred_at,
        recorded_at=recorded_at,
        actor=scope.actor,
        actor_key=scope.actor_key,
        actor_label=scope.actor_label,
        scope=scope.values,
        correlation_id=correlation_id,
        causation_id=cause.event_id if cause else None,
        dedupe_key=dedupe_key,
        suppressed_reason=suppression[0] if suppression else "",
        retention_seconds=int(retention.total_seconds())
        if isinstance(retention, timedelta)
        else None,
        delete_when=retention.value if isinstance(retention, Retention) else "",
        prune_after=recorded_at + retention if isinstance(retention, timedelta) else None,
        trace_context=trace_context,
        received=received.origin if received is not None else None,
    )


def _correlation(alias: str, cause: Cause | None) -> str:
    """The chain's correlation id: the cause's, or a new one for a root event."""
    if cause is None:
        return new_id()
    if cause.correlation_id:
        return cause.correlation_id
    causing = (
        EventRecord.objects.using(alias)
        .filter(pk=cause.event_id)
        .values_list("correlation_id", flat=True)
        .first()
    )
    return causing or str(cause.event_id)


def _insert_event(
    alias: str, record: EventRecord, rows: Sequence[Row], eager_keys: Sequence[str]
) -> tuple[int | None, list[int]]:
    """Write the event row and ``rows``; return ``(first event's id, None)`` when the dedupe
    key is taken (nothing written), else ``(None, the ids of the eager rows)``."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        written = PgInsert.get(connection).event(connection, record, rows, eager_keys)
        if written is None:
            return _first_with_key(alias, record), []
        record.pk, eager_ids = written
        record._state.adding, record._state.db = False, alias
        return None, eager_ids
    if record.dedupe_key is None:
        record.save(using=alias, force_insert=True)
    else:
        try:
            with transaction.atomic(using=alias):  # a savepoint: the key may be taken
                record.save(using=alias, force_insert=True)
        except IntegrityError:
            return _first_with_key(alias, record), []
    return None, _insert_deliveries(alias, record.pk, rows, eager_keys)


def _first_with_key(alias: str, record: EventRecord) -> int:
    """The id of the event that already holds ``record``'s name and dedupe key."""
    pair = (record.name, record.dedupe_key or "")
    return _events_holding(alias, [pair])[pair]


def _insert_deliveries(
    alias: str, event_id: int, rows: Sequence[Row], eager_keys: Sequence[str]
) -> list[int]:
    """Write ``rows`` for the event in one statement; the ids of the eager ones, in order."""
    if not rows:
        return []
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return PgInsert.get(connection).deliveries(connection, event_id, rows, eager_keys)
    created = DeliveryRecord.objects.using(alias).bulk_create(
        [delivery_record(event_id, row) for row in rows]
    )
    # MySQL cannot return the ids of a multi-row insert: no eager attempt there.
    return [d.pk for d in created if d.pk is not None and d.receiver_key in eager_keys]


def _run_on_commit(record: EventRecord, evt: object, receiver: RegisteredReceiver) -> None:
    """Best effort after commit: errors are logged, never raised to the committer."""
    try:
        with caused_by(record.pk, record.correlation_id):
            call_receiver(receiver, evt, inline_context(record, receiver))
    except Exception:
        logger.exception(
            "ON_COMMIT receiver %s failed for %s #%s; it is not retried.",
            receiver.key,
            record.name,
            record.pk,
        )


def _attempt_eagerly(delivery_ids: list[int]) -> None:
    """Attempt eager rows in the firing process; the relay is the fallback for any left."""
    for delivery_id in delivery_ids:
        try:
            deliver_one(delivery_id, worker_id=f"eager:{default_worker_id()}")
        except Exception:
            logger.exception(
                "Eager attempt of delivery %s failed to run; the relay will deliver it.",
                delivery_id,
            )
