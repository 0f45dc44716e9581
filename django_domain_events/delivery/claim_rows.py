"""The rows a claim reads: the owed rows it may take, and the held rows it took.

``Claim`` is what a relay holds of one row: enough to run it and to acknowledge it. A
claim carries each event's payload only up to ``INLINE_PAYLOAD_BYTES``; a larger one is
read when its row runs (``event_payload``), so a relay holds at most one large payload
at a time however large its batch. Payload and scope travel as the stored JSON text and
are parsed when the row runs, where a row that cannot be read becomes a dead letter
instead of crashing the claim. Both claims (``claim_postgresql.py``,
``claim_portable.py``) build their claims here (``as_claims``), from one column order.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Case, Q, TextField, Value, When
from django.db.models.functions import Cast, Length
from django.utils import timezone

from .. import clock, priority
from ..models import (
    OWED_VALUES,
    DeliveryRecord,
    DeliveryStatus,
    EventRecord,
    database_alias,
)
from . import ordering


@dataclass(frozen=True)
class Claim:
    """A row this worker holds, with what it needs to run it and to acknowledge it."""

    id: int
    event_id: int
    receiver_key: str
    target: str
    attempts: int
    max_attempts: int | None
    due_at: datetime
    expires_at: datetime | None
    claimed_by: str
    claimed_at: datetime
    lease_expires_at: datetime
    event_name: str
    event_version: int
    payload: str | dict[str, Any] | None  # as stored; None: too large to carry, read at run
    occurred_at: datetime
    actor_key: str
    actor_label: str
    scope: str | dict[str, Any]  # as stored
    correlation_id: str
    last_error: str = ""  # the error of the attempt before this one
    trace_context: str = ""  # the event's, for a tracing integration
    causation_id: int | None = None  # the event's (a publish's ``causationid``)
    alone: bool = False  # charged for a lapse: run with nothing beside it (lapse.py)


# The largest payload (bytes of its JSON text) a claim carries; larger ones are read
# one at a time, when their row runs.
INLINE_PAYLOAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class ClaimArgs:
    worker_id: str
    now: datetime
    lease_end: datetime
    limit: int
    only: tuple[str, ...] | None
    # Also the rows of keys not declared here (the second) due by the first: orphans.
    orphans: tuple[datetime, tuple[str, ...]] | None
    exclude: tuple[int, ...]
    ids: tuple[int, ...] | None
    ignore_backoff: bool
    task_keys: tuple[str, ...] = ()
    at_once: bool = False
    alone_ok: bool = True
    skip: tuple[str, ...] = ()  # keys left out: limited receivers, claimed on their own
    first: int = 1  # the claim_position of the first row (after the limited ones)


def table(model: type[Any]) -> str:
    return str(model._meta.db_table)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _moment(value: datetime | int, use_tz: bool) -> datetime:
    """A timestamp a claim read (a datetime, or microseconds since the epoch: ``_micros``)
    in the project's convention (``use_tz``, read once per claim: ``USE_TZ``): naive
    ``TIME_ZONE`` time under ``USE_TZ = False``, as the driver would have read it."""
    if not isinstance(value, int):
        return clock.normalize(value)
    moment = _EPOCH + timedelta(microseconds=value)
    if use_tz:
        return moment
    return timezone.make_naive(moment, timezone.get_default_timezone())


def as_claims(
    rows: Sequence[Sequence[Any]], args: ClaimArgs, alone_ids: Collection[int] = ()
) -> list[Claim]:
    """Claims from the rows both claims select, in one column order: the delivery's id,
    event_id, receiver_key, target, attempts, max_attempts, due_at, expires_at, the
    event's name, version, payload (None when too large), occurred_at, actor_key,
    actor_label, scope, correlation_id, the delivery's last_error, and the event's
    trace_context and causation_id, and whether it runs alone (a missing column:
    ``alone_ids``). Timestamps come as datetimes or epoch microseconds (``_moment``)."""
    use_tz = settings.USE_TZ
    return [
        Claim(
            id=row[0],
            event_id=row[1],
            receiver_key=row[2],
            target=row[3],
            attempts=row[4],
            max_attempts=row[5],
            due_at=_moment(row[6], use_tz),
            expires_at=_moment(row[7], use_tz) if row[7] is not None else None,
            claimed_by=args.worker_id,
            claimed_at=args.now,
            lease_expires_at=args.lease_end,
            event_name=row[8],
            event_version=row[9],
            payload=row[10],
            occurred_at=_moment(row[11], use_tz),
            actor_key=row[12],
            actor_label=row[13],
            scope=row[14],
            correlation_id=row[15],
            last_error=row[16],
            trace_context=row[17],
            causation_id=row[18],
            alone=bool(row[19]) if len(row) > 19 else row[0] in alone_ids,
        )
        for row in rows
    ]


def parse_json(value: str | bytes | dict[str, Any]) -> Any:
    """A stored JSON value as Python; raises (``ValueError``, ``RecursionError``) on one
    that cannot be read, for the caller to record."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def event_payload(claim: Claim) -> Any:
    """The claim's payload, parsed; read from the event row when the claim did not carry it."""
    if claim.payload is not None:
        return parse_json(claim.payload)
    return parse_json(stored_payload(claim.event_id))


def stored_payload(event_id: int) -> str:
    """An event's payload as its row stores it (JSON text), read on its own: a claim does
    not carry one larger than ``INLINE_PAYLOAD_BYTES``."""
    text = (
        EventRecord.objects.using(database_alias())
        .filter(pk=event_id)
        .values_list(Cast("payload", TextField()), flat=True)
        .first()
    )
    if text is None:
        raise LookupError(f"event #{event_id} is no longer in the log")
    return str(text)


def owed_rows(alias: str, args: ClaimArgs, *, heads: bool = True) -> Any:
    due = Q(available_at__lte=args.now)
    if args.ignore_backoff:
        due |= Q(status=DeliveryStatus.FAILED, due_at__lte=args.now)
    else:  # the index's range: nothing past the next PRIORITY_AGING_SECONDS is read
        due &= Q(claim_rank__lte=priority.window(args.now))
    rows = DeliveryRecord.objects.using(alias).filter(due, status__in=OWED_VALUES)
    if args.only is not None:
        mine = Q(receiver_key__in=args.only)
        if args.orphans is not None:
            due_by, declared = args.orphans
            mine |= Q(due_at__lte=due_by) & ~Q(receiver_key__in=declared)
        rows = rows.filter(mine)
    if args.skip:
        rows = rows.exclude(receiver_key__in=args.skip)
    if args.exclude:
        rows = rows.exclude(id__in=args.exclude)
    if args.ids is not None:
        rows = rows.filter(id__in=args.ids)
    if heads and ordering.in_use():
        rows = rows.filter(ordering.head_q(alias))
    return rows.order_by("claim_rank", "id")


def owed_again(moment: datetime) -> dict[str, Any]:
    """The fields of a claimed row handed back unstarted: owed at ``moment``, nothing spent."""
    return {
        "status": Case(
            When(attempts=0, then=Value(DeliveryStatus.PENDING.value)),
            default=Value(DeliveryStatus.FAILED.value),
        ),
        "available_at": moment,
        "lease_expires_at": None,
    }


def held_claims(alias: str, args: ClaimArgs, alone_ids: Collection[int] = ()) -> list[Claim]:
    held = Q(status=DeliveryStatus.CLAIMED, claimed_by=args.worker_id, claimed_at=args.now)
    if args.ids is not None:
        held &= Q(id__in=args.ids)
    payload = Cast("event__payload", TextField())
    rows = (
        DeliveryRecord.objects.using(alias)
        .filter(held)
        .annotate(payload_length=Length(payload))
        .values_list(
            "id",
            "event_id",
            "receiver_key",
            "target",
            "attempts",
            "max_attempts",
            "due_at",
            "expires_at",
            "event__name",
            "event__version",
            Case(When(payload_length__lte=INLINE_PAYLOAD_BYTES, then=payload)),
            "event__occurred_at",
            "event__actor_key",
            "event__actor_label",
            Cast("event__scope", TextField()),
            "event__correlation_id",
            "last_error",
            "event__trace_context",
            "event__causation_id",
        )
        .order_by("id")[: args.limit]
    )
    return as_claims(list(rows), args, alone_ids)
