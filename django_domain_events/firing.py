"""``fire()``: record an event and the deliveries it owes, inside the caller's transaction.

The path of one event: encode the payload, write the event row, resolve each durable
receiver's rows (targets, due time, lifetime) and write them all in one multi-row
insert, run the ``INLINE`` receivers, and register what runs after commit (``ON_COMMIT``
receivers, eager attempts, one relay wake-up). Anything that raises before the caller
commits rolls the whole change back: the event exists if and only if it committed.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial

from django.db import IntegrityError, connections, transaction

from . import clock, conf, tally
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
from .delivery.outcomes import DeliveryContext, receiver_lifetime_end
from .delivery.passes import default_worker_id, deliver_one
from .delivery.run import call_receiver, refuse_awaitable
from .delivery.wake import wake_after_commit
from .models import DeliveryRecord, DeliveryStatus, EventRecord, database_alias
from .scope import Cause, caused_by, current_cause, current_scope, suppression_for

logger = logging.getLogger("django_domain_events.fire")

MAX_TARGET_LENGTH = 255


class OutsideAtomicWarning(RuntimeWarning):
    """``fire()`` was called in autocommit mode: the event commits on its own."""


def fire(
    evt: object, *, occurred_at: datetime | None = None, dedupe_key: str | None = None
) -> int | None:
    """Record ``evt`` and its deliveries in the current transaction; return the event id.

    Returns None only inside ``suppressed(..., record=False)``. With a ``dedupe_key``, a
    second fire of the same event name and key returns the first event's id and writes
    nothing.
    """
    registered = registry.event_for_class(type(evt))
    if registered is None:
        raise TypeError(
            f"fire() takes an instance of an @event class, and {type(evt).__qualname__} is "
            "not one; decorate it with @event."
        )
    _check_dedupe_key(registered, dedupe_key)
    suppression = suppression_for(type(evt))
    if suppression is not None and not suppression[1]:
        return None
    settings = conf.get()
    alias = database_alias()
    if settings.WARN_OUTSIDE_ATOMIC and not connections[alias].in_atomic_block:
        warnings.warn(
            f"fire({registered.name}) outside transaction.atomic(): the event commits on "
            "its own, apart from the change it records. Wrap both in atomic().",
            OutsideAtomicWarning,
            stacklevel=2,
        )
    recorded_at = clock.now()
    occurred = clock.accept(occurred_at, what="fire(occurred_at=)") if occurred_at else recorded_at
    record = _event_row(registered, evt, occurred, recorded_at, dedupe_key, suppression, alias)
    with transaction.atomic(using=alias, savepoint=False):
        existing = _insert_event(alias, record)
        if existing is not None:
            return existing
        if suppression is not None:
            return record.pk
        receivers = registry.receivers_for(type(evt))
        rows = _delivery_rows(record, evt, receivers)
        if rows:
            DeliveryRecord.objects.using(alias).bulk_create(rows)
            tally.record(alias, entered=[(row.receiver_key, row.due_at) for row in rows])
        _run_inline(record, evt, receivers)
        _after_commit(alias, record, evt, receivers, rows)
    return record.pk


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


def _event_row(
    registered: RegisteredEvent,
    evt: object,
    occurred_at: datetime,
    recorded_at: datetime,
    dedupe_key: str | None,
    suppression: tuple[str, bool] | None,
    alias: str,
) -> EventRecord:
    scope = current_scope()
    cause = current_cause()
    retention = registered.retention
    return EventRecord(
        name=registered.name,
        version=registered.version,
        payload=encode_event(evt),
        occurred_at=occurred_at,
        recorded_at=recorded_at,
        actor=scope.actor,
        actor_key=scope.actor_key,
        actor_label=scope.actor_label,
        scope=scope.values,
        correlation_id=_correlation(alias, cause),
        causation_id=cause.event_id if cause else None,
        dedupe_key=dedupe_key,
        suppressed_reason=suppression[0] if suppression else "",
        retention_seconds=int(retention.total_seconds())
        if isinstance(retention, timedelta)
        else None,
        delete_when=retention.value if isinstance(retention, Retention) else "",
        prune_after=recorded_at + retention if isinstance(retention, timedelta) else None,
    )


def _correlation(alias: str, cause: Cause | None) -> str:
    """The chain's correlation id: the cause's, or a new one for a root event."""
    if cause is None:
        return uuid.uuid4().hex
    if cause.correlation_id:
        return cause.correlation_id
    causing = (
        EventRecord.objects.using(alias)
        .filter(pk=cause.event_id)
        .values_list("correlation_id", flat=True)
        .first()
    )
    return causing or str(cause.event_id)


def _insert_event(alias: str, record: EventRecord) -> int | None:
    """Write the event row; the id of the first event when the dedupe key is taken."""
    if record.dedupe_key is None:
        record.save(using=alias, force_insert=True)
        return None
    try:
        with transaction.atomic(using=alias):  # a savepoint: the key may be taken
            record.save(using=alias, force_insert=True)
    except IntegrityError:
        first = (
            EventRecord.objects.using(alias)
            .filter(name=record.name, dedupe_key=record.dedupe_key)
            .values_list("pk", flat=True)
            .first()
        )
        if first is None:
            raise
        return first
    return None


def inline_context(
    record: EventRecord, receiver: RegisteredReceiver, target: str = ""
) -> DeliveryContext:
    """The context of a call with no delivery row: targets=, due=, INLINE, ON_COMMIT."""
    return DeliveryContext(
        event_id=record.pk,
        event_name=record.name,
        attempt=1,
        actor_key=record.actor_key,
        actor_label=record.actor_label,
        scope=record.scope,
        target=target,
        delivery_id=None,
        due_at=None,
        receiver_key=receiver.key,
        occurred_at=record.occurred_at,
        correlation_id=record.correlation_id,
    )


def resolve_targets(record: EventRecord, evt: object, receiver: RegisteredReceiver) -> list[str]:
    """The receiver's distinct targets, in first-seen order; refuses anything but strings."""
    if receiver.targets is None:
        return [""]
    with caused_by(record.pk, record.correlation_id):
        found = receiver.targets(evt, inline_context(record, receiver))
    refuse_awaitable(found, f"targets= of {receiver.key}", "the targets directly")
    if isinstance(found, str) or not isinstance(found, Iterable):
        raise TypeError(
            f"targets= of {receiver.key} must return an iterable of strings, not {found!r}."
        )
    targets: dict[str, None] = {}
    for target in found:
        if not isinstance(target, str) or not target.strip():
            raise ValueError(
                f"targets= of {receiver.key} returned {target!r}; every target must be a "
                "non-empty string (an id or address)."
            )
        if len(target) > MAX_TARGET_LENGTH:
            raise ValueError(
                f"targets= of {receiver.key} returned a target of {len(target)} characters; "
                f"targets are stored in a column of {MAX_TARGET_LENGTH}."
            )
        problem = text_problem(target)
        if problem:
            raise ValueError(f"targets= of {receiver.key} returned {target!r}, which {problem}.")
        targets[target] = None
    return list(targets)


def resolve_due(
    receiver: RegisteredReceiver, evt: object, occurred_at: datetime, recorded_at: datetime
) -> datetime:
    """When the receiver's row becomes owed: never earlier than ``recorded_at``."""
    due = receiver.due
    if due is None:
        return recorded_at
    if isinstance(due, timedelta):
        return max(occurred_at + due, recorded_at)
    value = due(evt)
    refuse_awaitable(value, f"due= of {receiver.key}", "an aware datetime directly")
    when = clock.accept(value, what=f"due= of {receiver.key}")
    return max(when, recorded_at)


def _delivery_rows(
    record: EventRecord, evt: object, receivers: Iterable[RegisteredReceiver]
) -> list[DeliveryRecord]:
    rows = []
    for receiver in receivers:
        if receiver.mode is not DURABLE:
            continue
        due_at = resolve_due(receiver, evt, record.occurred_at, record.recorded_at)
        expires_at = receiver_lifetime_end(receiver, due_at)
        for target in resolve_targets(record, evt, receiver):
            rows.append(
                DeliveryRecord(
                    event_id=record.pk,
                    receiver_key=receiver.key,
                    target=target,
                    status=DeliveryStatus.PENDING,
                    max_attempts=receiver.max_attempts,
                    available_at=due_at,
                    due_at=due_at,
                    expires_at=expires_at,
                )
            )
    return rows


def _run_inline(record: EventRecord, evt: object, receivers: Iterable[RegisteredReceiver]) -> None:
    for receiver in receivers:
        if receiver.mode is INLINE:
            with caused_by(record.pk, record.correlation_id):
                call_receiver(receiver, evt, inline_context(record, receiver))


def _after_commit(
    alias: str,
    record: EventRecord,
    evt: object,
    receivers: Iterable[RegisteredReceiver],
    rows: list[DeliveryRecord],
) -> None:
    for receiver in receivers:
        if receiver.mode is ON_COMMIT:
            transaction.on_commit(partial(_run_on_commit, record, evt, receiver), using=alias)
    eager = [row.pk for row in rows if row.pk is not None and _is_eager(row.receiver_key)]
    if eager:
        transaction.on_commit(lambda: _attempt_eagerly(eager), using=alias)
    if rows:
        wake_after_commit(alias)


def _is_eager(key: str) -> bool:
    receiver = registry.receiver(key)
    return receiver is not None and receiver.eager


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
