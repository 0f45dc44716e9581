"""The rows an event owes its durable receivers: due time, lifetime, targets, priority.

``fire()`` (``firing.py``) and a consumed message (``record_received``) turn an event
into one ``Row`` per durable receiver and target here, as plain tuples; ``operations.py``
asks the same questions when it replays an event (``resolve_due``, ``resolve_targets``).
A ``targets=`` or ``due=`` callable is the user's code: it runs here, under the event's
cause, and anything it returns that cannot be stored is refused naming the receiver.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from . import clock, priority
from .codec import text_problem
from .declare import RegisteredReceiver
from .delivery import ordering
from .delivery.outcomes import DeliveryContext, receiver_lifetime_end
from .delivery.run import refuse_awaitable
from .models import DeliveryRecord, DeliveryStatus, EventRecord
from .pg_insert import Row
from .scope import caused_by

MAX_TARGET_LENGTH = 255  # the target column's width


def delivery_record(event_id: int, row: Row) -> DeliveryRecord:
    """``row`` as an unsaved model instance: the ORM path, and the benchmark's seeding."""
    return DeliveryRecord(
        event_id=event_id,
        receiver_key=row.receiver_key,
        target=row.target,
        status=DeliveryStatus.PENDING,
        max_attempts=row.max_attempts,
        available_at=row.due_at,
        due_at=row.due_at,
        expires_at=row.expires_at,
        priority_credit=row.priority_credit,
        claim_rank=row.claim_rank,
        order_key=row.order_key,
    )


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


def delivery_rows(
    record: EventRecord,
    evt: object,
    receivers: Iterable[RegisteredReceiver],
    message_expiry: datetime | None = None,
    priority_of: int | None = None,
) -> list[Row]:
    """The rows the durable ``receivers`` are owed, as plain tuples (no model instances)."""
    return rows_for(
        evt, receivers, record.occurred_at, record.recorded_at, message_expiry, record, priority_of
    )


def rows_for(
    evt: object,
    receivers: Iterable[RegisteredReceiver],
    occurred_at: datetime,
    recorded_at: datetime,
    message_expiry: datetime | None,
    record: EventRecord | None,
    priority_of: int | None = None,
) -> list[Row]:
    """``delivery_rows`` from the event's times; ``record`` is read only by a
    ``targets=`` callable (None where no receiver has one).

    A consumed message's expiry caps each row's lifetime: the earlier end wins; a fire's
    ``priority_of`` stands for each receiver's own.
    """
    rows = []
    for receiver in receivers:
        due_at = resolve_due(receiver, evt, occurred_at, recorded_at)
        expires_at = receiver_lifetime_end(receiver, due_at)
        if message_expiry is not None:
            expires_at = message_expiry if expires_at is None else min(expires_at, message_expiry)
        credit = priority.credit(receiver.priority if priority_of is None else priority_of)
        key = ordering.order_key(receiver, evt)
        targets = [""] if receiver.targets is None else None
        if targets is None:
            assert record is not None, "a targets= callable is given the event row"
            targets = resolve_targets(record, evt, receiver)
        for target in targets:
            rows.append(
                Row(
                    receiver.key,
                    target,
                    receiver.max_attempts,
                    due_at,
                    expires_at,
                    credit,
                    priority.rank(due_at) - credit,
                    key,
                )
            )
    return rows
