"""Claiming owed rows under a lease, with the event each row delivers.

On PostgreSQL one statement picks the rows (``FOR UPDATE SKIP LOCKED``), stamps the
lease and returns them joined to their events. MariaDB/MySQL pick with ``SKIP LOCKED``
and stamp in the same transaction; SQLite, a single writer, stamps with one ``UPDATE``
over a sub-select. A claimed row's ``available_at`` is its lease expiry, so a row whose
worker died is claimable again by the same index and condition as any owed row; what
taking it over costs, and how it runs next, is the lapse rule (``lapse.py``).

A claim carries each event's payload only up to ``INLINE_PAYLOAD_BYTES``; a larger one
is read when its row runs (``event_payload``), so a relay holds at most one large
payload at a time however large its batch. Payload and scope travel as the stored JSON
text and are parsed when the row runs, where a row that cannot be read becomes a dead
letter instead of crashing the claim.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Case, F, PositiveIntegerField, Q, TextField, Value, When
from django.db.models.functions import Cast, Length
from django.utils import timezone

from .. import clock, conf, priority
from ..declare import registry
from ..models import (
    OWED_VALUES,
    STATUS_SQL,
    DeliveryRecord,
    DeliveryStatus,
    EventRecord,
    database_alias,
)
from . import limits, ordering
from .lapse import KEPT_SQL, ROW_COLUMNS, keep_count, running_ids, running_sql


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


def lane_keys(lane: str | None) -> tuple[str, ...] | None:
    """The receiver keys a claim in ``lane`` takes (None: every key, for ``lane=None``).

    Read from the declarations at every claim, so moving a receiver to another lane
    moves its owed rows with it. The default lane also takes the rows of receivers this
    process does not declare, once ``orphans_from`` says they may be orphaned.
    """
    if lane is None:
        return None
    return registry.lanes().get(lane, ())


def orphans_from(lane: str | None, now: datetime) -> datetime | None:
    """Rows of a receiver this relay does not declare, due at or before the returned time,
    are its to orphan (None: this lane takes none of them).

    Before that, ``ORPHAN_AFTER_SECONDS`` after the row came due, it waits untouched: in
    a rolling deploy the relay of another release may declare the receiver and run it.
    """
    if lane != "default":
        return None
    return now - timedelta(seconds=conf.get().ORPHAN_AFTER_SECONDS)


def may_orphan(receiver_key: str, due_at: datetime, now: datetime) -> bool:
    """Whether a row of ``receiver_key``, undeclared here, is past its wait for another
    release (see ``orphans_from``)."""
    cutoff = orphans_from("default", now)
    return cutoff is not None and due_at <= cutoff


def declared_keys() -> tuple[str, ...]:
    """The keys of every durable receiver this process declares, in any lane."""
    return tuple(r.key for r in registry.receivers if r.durable)


def claim_batch(
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta | float,
    limit: int,
    lane: str | None = None,
    exclude_ids: Collection[int] = (),
    ids: Collection[int] | None = None,
    ignore_backoff: bool = False,
    at_once: bool = False,
    alone_ok: bool = True,
) -> list[Claim]:
    """Claim up to ``limit`` owed rows due at ``now`` for ``worker_id``, oldest first.

    ``lane=None`` claims from every lane; ``ids`` narrows the claim to those rows (a
    direct ``deliver_one``); ``exclude_ids`` keeps rows out (a pass given a ``now=``);
    ``ignore_backoff`` also takes failed rows still waiting out their backoff (tests),
    never a row whose due time has not come. ``at_once``: the caller starts every row
    at once (a pool), rather than in order. ``alone_ok``: the caller runs nothing else
    now, so it may take a row that must run alone (``lapse.py``).
    """
    if limit < 1:
        return []
    if not isinstance(lease, timedelta):
        lease = timedelta(seconds=lease)
    now = clock.normalize(now)
    only = lane_keys(lane)
    orphans = orphans_from(lane, now)
    if only is not None and not only and orphans is None:
        return []
    alias = database_alias()
    args = _ClaimArgs(
        worker_id,
        now,
        now + lease,
        limit,
        only,
        (orphans, declared_keys()) if orphans is not None else None,
        tuple(exclude_ids),
        tuple(ids) if ids is not None else None,
        ignore_backoff,
        tuple(r.key for r in registry.receivers if r.durable and r.site == "task"),
        at_once,
        alone_ok,
    )
    keys = only if only is not None else declared_keys()
    limited = limits.declared(keys)
    if limited:
        return _claim_within_limits(alias, args, limited, keys)
    return _claim(alias, args)


def _claim(alias: str, args: _ClaimArgs) -> list[Claim]:
    if connections[alias].vendor == "postgresql":
        return _claim_postgresql(alias, args)
    with transaction.atomic(using=alias):
        return _claim_portable(alias, args)


def _claim_within_limits(
    alias: str, args: _ClaimArgs, limited: Sequence[limits.Limit], keys: Sequence[str]
) -> list[Claim]:
    """The limited receivers' rows first, each within every limit holding it as it allows
    now, in one transaction holding the limits' rows locked (``limits.py``); then the rest
    of the lane, after the commit, so the lock never slows the unlimited receivers'
    claims. A row that must run alone (``lapse.py``) ends the claim."""
    claims: list[Claim] = []
    taken: dict[str, int] = {}
    asking = limits.worth_asking(alias, limited, args.now)
    with transaction.atomic(using=alias):
        grants = limits.allowances(alias, asking, args.now) if asking else []
        left = {grant.limit.key: grant.rows for grant in grants}
        for receivers, holding in limits.takes(limited, keys):
            room = min([left.get(lm.key, 0) for lm in holding] + [args.limit - len(claims)])
            if room < 1 or any(claim.alone for claim in claims):
                continue
            got = _claim(alias, _more(args, claims, only=receivers, limit=room))
            if len(got) < room:  # none of their rows left due: not asked for a moment
                limits.note_idle(alias, receivers, args.now)
            for lm in holding:
                left[lm.key] -= len(got)
                taken[lm.key] = taken.get(lm.key, 0) + len(got)
            claims += got
        limits.spend(alias, grants, taken)
    rest = args.limit - len(claims)
    skip = tuple(sorted({key for lm in limited for key in lm.members}))
    every_one_limited = args.only is not None and args.orphans is None
    every_one_limited = every_one_limited and set(args.only or ()) <= set(skip)
    if rest > 0 and not every_one_limited and not any(claim.alone for claim in claims):
        claims += _claim(alias, _more(args, claims, only=args.only, limit=rest, skip=skip))
    if not claims:
        limits.forget_idle(alias)
    return claims


def _more(
    args: _ClaimArgs,
    claims: Sequence[Claim],
    *,
    only: tuple[str, ...] | None,
    limit: int,
    skip: tuple[str, ...] = (),
) -> _ClaimArgs:
    """The arguments of one more claim in a batch that holds ``claims`` already: its rows
    numbered after them, and none that must run alone unless it is the first."""
    orphans = args.orphans if only == args.only else None
    return replace(
        args,
        only=only,
        orphans=orphans,
        limit=limit,
        skip=skip,
        first=len(claims) + 1,
        alone_ok=args.alone_ok and not claims,
    )


@dataclass(frozen=True)
class _ClaimArgs:
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


def _table(model: type[Any]) -> str:
    return str(model._meta.db_table)


def _pg_is_task(expr: str) -> str:
    return f"({expr} = ANY(%(task_keys)s::text[]))"


# The lapse rule (lapse.py) inside the claim: ``numbered`` judges each picked row,
# ``kept`` keeps the rows the claim takes, ``unstarted`` finds the rows of a batch run in
# order after the one charged, whose own leases lapsed too, to hand back.
_POSTGRESQL_CLAIM = """
WITH picked AS (
    SELECT id, claim_rank AS was_rank, status AS was_status, claimed_by AS was_by,
           claimed_at AS was_at, claim_position AS was_position, receiver_key
    FROM {delivery}
    WHERE status IN {owed} AND {due} {filters}
    ORDER BY claim_rank, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), judged AS (
    SELECT p.*, row_number() OVER (ORDER BY p.was_rank, p.id) AS position,
           {running} AS charged, {is_task} AS is_task
    FROM picked AS p
), numbered AS (
    SELECT j.*, j.charged AND NOT j.is_task AS alone FROM judged AS j
), kept AS ({kept}
), unstarted AS (
    SELECT d.id
    FROM {delivery} AS d
    JOIN kept AS n
      ON n.alone AND n.was_position > 0 AND d.claimed_by = n.was_by
     AND d.claimed_at = n.was_at AND d.claim_position > n.was_position
    WHERE d.status = {claimed} AND d.available_at <= %(now)s
      AND d.id NOT IN (SELECT id FROM kept)
    FOR UPDATE OF d SKIP LOCKED
), handed_back AS (
    UPDATE {delivery} AS d
    SET status = CASE WHEN d.attempts = 0 THEN {pending} ELSE {failed} END,
        available_at = %(now)s,
        claim_rank = %(now_rank)s - d.priority_credit,
        lease_expires_at = NULL
    FROM unstarted AS u
    WHERE d.id = u.id
), claimed AS (
    UPDATE {delivery} AS d
    SET status = {claimed},
        claimed_by = %(worker)s,
        claimed_at = %(now)s,
        lease_expires_at = %(lease_end)s,
        available_at = %(lease_end)s,
        claim_rank = %(lease_end_rank)s - d.priority_credit,
        claim_position = CASE
            WHEN %(at_once)s OR n.alone THEN 0 ELSE n.position + %(first)s - 1
        END,
        -- never past the budget: a row already spent is dead-lettered unrun, uncharged
        attempts = CASE
            WHEN n.charged AND (d.max_attempts IS NULL OR d.attempts < d.max_attempts)
            THEN d.attempts + 1 ELSE d.attempts
        END
    FROM kept AS n
    WHERE d.id = n.id
    RETURNING d.id, d.event_id, d.receiver_key, d.target, d.attempts, d.max_attempts,
              d.due_at, d.expires_at, d.last_error, n.was_rank, n.alone
)
SELECT c.id, c.event_id, c.receiver_key, c.target, c.attempts, c.max_attempts,
       {micros_due}, {micros_expires}, e.name, e.version,
       CASE WHEN octet_length(p.text) <= %(inline)s THEN p.text END, {micros_occurred},
       e.actor_key, e.actor_label, e.scope::text, e.correlation_id, c.last_error,
       e.trace_context, e.causation_id, c.alone
FROM claimed AS c JOIN {event} AS e ON e.id = c.event_id
-- The stored size first: a payload far too large is never turned into text here.
CROSS JOIN LATERAL (
    SELECT CASE WHEN pg_column_size(e.payload) <= %(inline)s THEN e.payload::text END AS text
) AS p
ORDER BY c.was_rank, c.id
"""


def _claim_postgresql(alias: str, args: _ClaimArgs) -> list[Claim]:
    filters = []
    params: dict[str, Any] = {
        "now": args.now,
        "limit": args.limit,
        "worker": args.worker_id,
        "lease_end": args.lease_end,
        "task_keys": list(args.task_keys),
        "inline": INLINE_PAYLOAD_BYTES,
        "at_once": args.at_once,
        "alone_ok": args.alone_ok,
        "now_rank": priority.rank(args.now),
        "lease_end_rank": priority.rank(args.lease_end),
        "window": priority.window(args.now),
        "first": args.first,
    }
    if args.only is not None and len(args.only) == 1 and args.orphans is None:
        filters.append("AND receiver_key = %(one)s")  # one receiver: its own index
        params["one"] = args.only[0]
    elif args.only is not None and args.orphans is None:
        filters.append("AND receiver_key = ANY(%(only)s)")
        params["only"] = list(args.only)
    elif args.only is not None and args.orphans is not None:
        filters.append(
            "AND (receiver_key = ANY(%(only)s) OR (due_at <= %(orphans_due)s "
            "AND NOT (receiver_key = ANY(%(declared)s))))"
        )
        params.update(only=list(args.only), orphans_due=args.orphans[0])
        params["declared"] = list(args.orphans[1])
    if args.skip:
        filters.append("AND NOT (receiver_key = ANY(%(skip)s))")
        params["skip"] = list(args.skip)
    if args.exclude:
        filters.append("AND NOT (id = ANY(%(exclude)s))")
        params["exclude"] = list(args.exclude)
    if args.ids is not None:
        filters.append("AND id = ANY(%(ids)s)")
        params["ids"] = list(args.ids)
    connection = connections[alias]
    delivery = connection.ops.quote_name(_table(DeliveryRecord))
    if ordering.in_use():
        filters.append("AND " + ordering.head_sql(delivery, delivery))
        params["blocking"] = list(ordering.blocking_keys())
    old_claim = ("p.was_status", "p.was_position", "p.was_by", "p.was_at", "p.receiver_key")
    sql = _POSTGRESQL_CLAIM.format(
        delivery=delivery,
        event=connection.ops.quote_name(_table(EventRecord)),
        filters=" ".join(filters),
        running=running_sql(
            dict(zip(ROW_COLUMNS, old_claim, strict=True)), delivery=delivery, is_task=_pg_is_task
        ),
        is_task=_pg_is_task("p.receiver_key"),
        kept=KEPT_SQL,
        micros_due=_micros("c.due_at"),
        micros_expires=_micros("c.expires_at"),
        micros_occurred=_micros("e.occurred_at"),
        **STATUS_SQL,
        due="(available_at <= %(now)s OR (status = {failed} AND due_at <= %(now)s))".format(
            **STATUS_SQL
        )
        if args.ignore_backoff
        else "available_at <= %(now)s AND claim_rank <= %(window)s",
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return _claims(rows, args)


def _micros(column: str) -> str:
    """A ``timestamptz`` column as microseconds since the epoch: a claim's 500 rows read
    as integers cost a tenth of their timestamps parsed by the driver (about 3 ms)."""
    return f"(extract(epoch FROM {column}) * 1000000)::bigint"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _moment(value: datetime | int) -> datetime:
    """A timestamp a claim read (a datetime, or microseconds since the epoch: ``_micros``)
    in the project's convention: naive ``TIME_ZONE`` time under ``USE_TZ = False``, as the
    driver would have read it."""
    if not isinstance(value, int):
        return clock.normalize(value)
    moment = _EPOCH + timedelta(microseconds=value)
    if settings.USE_TZ:
        return moment
    return timezone.make_naive(moment, timezone.get_default_timezone())


def _claims(
    rows: Sequence[Sequence[Any]], args: _ClaimArgs, alone_ids: Collection[int] = ()
) -> list[Claim]:
    """Claims from the rows both claims select, in one column order: the delivery's id,
    event_id, receiver_key, target, attempts, max_attempts, due_at, expires_at, the
    event's name, version, payload (None when too large), occurred_at, actor_key,
    actor_label, scope, correlation_id, the delivery's last_error, and the event's
    trace_context and causation_id, and whether it runs alone (a missing column:
    ``alone_ids``). Timestamps come as datetimes or epoch microseconds (``_moment``)."""
    return [
        Claim(
            id=row[0],
            event_id=row[1],
            receiver_key=row[2],
            target=row[3],
            attempts=row[4],
            max_attempts=row[5],
            due_at=_moment(row[6]),
            expires_at=_moment(row[7]) if row[7] is not None else None,
            claimed_by=args.worker_id,
            claimed_at=args.now,
            lease_expires_at=args.lease_end,
            event_name=row[8],
            event_version=row[9],
            payload=row[10],
            occurred_at=_moment(row[11]),
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
    alias = database_alias()
    text = (
        EventRecord.objects.using(alias)
        .filter(pk=claim.event_id)
        .values_list(Cast("payload", TextField()), flat=True)
        .first()
    )
    if text is None:
        raise LookupError(f"event #{claim.event_id} is no longer in the log")
    return parse_json(text)


def _owed_rows(alias: str, args: _ClaimArgs, *, heads: bool = True) -> Any:
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


def _claim_portable(alias: str, args: _ClaimArgs) -> list[Claim]:
    picked = _pick(alias, args)
    if not picked:
        return []
    lapsed = [row[0] for row in picked if row[1] == DeliveryStatus.CLAIMED]
    charged = running_ids(alias, lapsed, args.task_keys)
    alone = [row[0] in charged and row[5] not in args.task_keys for row in picked]
    kept = picked[: keep_count(alone, alone_ok=args.alone_ok)]
    if not kept:
        return []
    alone_ids = {row[0] for row, flag in zip(kept, alone, strict=False) if flag}
    _hand_back_unstarted(alias, [row for row in kept if row[0] in alone_ids], kept, args.now)
    ids = tuple(row[0] for row in kept)
    positions = {
        pk: 0 if args.at_once or pk in alone_ids else n for n, pk in enumerate(ids, args.first)
    }
    # Where the pick locked the rows they are ours: the primary key alone, so MariaDB
    # locks nothing more (another index's range would meet other claims' locks and
    # deadlock). On SQLite the owed condition again: another process may have claimed.
    rows = DeliveryRecord.objects.using(alias).filter(id__in=ids)
    if not connections[alias].features.has_select_for_update_skip_locked:
        rows = _owed_rows(alias, replace(args, ids=ids))
    # attempts first: MySQL evaluates assignments left to right, on the new values.
    rows.update(
        attempts=Case(
            When(
                Q(id__in=charged) & (Q(max_attempts=None) | Q(attempts__lt=F("max_attempts"))),
                then=F("attempts") + 1,
            ),
            default=F("attempts"),
            output_field=PositiveIntegerField(),
        ),
        claim_position=Case(
            *(When(id=pk, then=Value(position)) for pk, position in positions.items()),
            output_field=PositiveIntegerField(),
        ),
        status=DeliveryStatus.CLAIMED,
        claimed_by=args.worker_id,
        claimed_at=args.now,
        lease_expires_at=args.lease_end,
        available_at=args.lease_end,
    )
    order = {pk: index for index, pk in enumerate(ids)}
    held = _held(alias, replace(args, ids=ids), alone_ids)
    return sorted(held, key=lambda claim: order[claim.id])


def _pick(alias: str, args: _ClaimArgs) -> list[tuple[Any, ...]]:
    """The owed rows the portable claim takes, locked where the database can skip locks.

    MariaDB locks every row a locking read examines, and for an owed range in rank order
    it examines them all (a scan and a sort): such a claim would hold the whole backlog,
    and a relay claiming beside it would find nothing. So the candidates are read
    unlocked, in rank order, then locked by primary key, skipping the rows another claim
    holds; a page that leaves the batch short is followed by the next, a few at most.
    """
    owed = _owed_rows(alias, args)
    if not connections[alias].features.has_select_for_update_skip_locked:
        return list(owed.values_list(*_PICKED_FIELDS)[: args.limit])
    picked: list[tuple[Any, ...]] = []
    passed: list[int] = []  # candidates read already: taken, or locked by another claim
    for _ in range(PICK_PAGES):
        page = _owed_rows(alias, replace(args, exclude=(*args.exclude, *passed)))
        candidates = tuple(page.values_list("id", flat=True)[: args.limit])
        if not candidates:
            break
        # Unordered, so the database reads the candidates by primary key and nothing else.
        locking = _owed_rows(alias, replace(args, ids=candidates), heads=False).order_by()
        rows = locking.select_for_update(skip_locked=True).values_list(*_PICKED_FIELDS)
        rank = {pk: n for n, pk in enumerate(candidates, len(passed))}
        passed += candidates
        picked += sorted(rows, key=lambda row: rank[row[0]])[: args.limit - len(picked)]
        if len(picked) >= args.limit or len(candidates) < args.limit:
            break
    return picked


# Pages of candidates a portable claim reads when other claims hold the first ones locked.
PICK_PAGES = 4

# What the portable claim reads of each picked row, with the pick itself.
_PICKED_FIELDS = ("id", "status", "claimed_by", "claimed_at", "claim_position", "receiver_key")


def _hand_back_unstarted(
    alias: str, charged: Sequence[tuple[Any, ...]], kept: Sequence[tuple[Any, ...]], now: datetime
) -> None:
    """Hand back the rows after each charged row of a batch run in order, whose own lease
    lapsed too: they never started (``lapse.py``)."""
    kept_ids = [row[0] for row in kept]
    for _, _, claimed_by, claimed_at, position, _ in charged:
        if position == 0:
            continue
        unstarted = (
            DeliveryRecord.objects.using(alias)
            .filter(
                status=DeliveryStatus.CLAIMED,
                claimed_by=claimed_by,
                claimed_at=claimed_at,
                claim_position__gt=position,
                available_at__lte=now,
            )
            .exclude(id__in=kept_ids)
        )
        if connections[alias].features.has_select_for_update_skip_locked:
            unstarted = unstarted.select_for_update(skip_locked=True)
        ids = list(unstarted.values_list("id", flat=True))
        DeliveryRecord.objects.using(alias).filter(id__in=ids).update(**_owed_again(now))


def _owed_again(moment: datetime) -> dict[str, Any]:
    """The fields of a claimed row handed back unstarted: owed at ``moment``, nothing spent."""
    return {
        "status": Case(
            When(attempts=0, then=Value(DeliveryStatus.PENDING.value)),
            default=Value(DeliveryStatus.FAILED.value),
        ),
        "available_at": moment,
        "lease_expires_at": None,
    }


def _held(alias: str, args: _ClaimArgs, alone_ids: Collection[int] = ()) -> list[Claim]:
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
    return _claims(list(rows), args, alone_ids)


def release(claims: Sequence[Claim], *, now: datetime | None = None) -> int:
    """Hand rows back unstarted: owed again at once, no attempt spent.

    A compare-and-set on each claim, so a row another worker has taken since is left alone.
    """
    if not claims:
        return 0
    alias = database_alias()
    released = 0
    moment = clock.normalize(now) if now is not None else clock.now()
    with transaction.atomic(using=alias):
        for claim in claims:
            released += (
                DeliveryRecord.objects.using(alias)
                .filter(
                    id=claim.id,
                    status=DeliveryStatus.CLAIMED,
                    claimed_by=claim.claimed_by,
                    claimed_at=claim.claimed_at,
                )
                .update(**_owed_again(moment))
            )
    return released


def take_over(
    delivery_id: int,
    *,
    claimed_by: str,
    claimed_at: datetime,
    worker_id: str,
    now: datetime,
    lease: timedelta,
) -> Claim | None:
    """Take a row handed to a task worker, under exactly the claim it was handed with.

    Committed before the receiver runs, so a duplicate or late message for the same
    claim finds it gone. None when the claim no longer holds the row.
    """
    alias = database_alias()
    with transaction.atomic(using=alias):
        taken = (
            DeliveryRecord.objects.using(alias)
            .filter(
                id=delivery_id,
                status=DeliveryStatus.CLAIMED,
                claimed_by=claimed_by,
                claimed_at=clock.normalize(claimed_at),
            )
            .update(
                claimed_by=worker_id,
                claimed_at=now,
                lease_expires_at=now + lease,
                available_at=now + lease,
                claim_position=0,  # run alone: a lapse of this claim is this row's attempt
            )
        )
    if not taken:
        return None
    args = _ClaimArgs(worker_id, now, now + lease, 1, None, None, (), (delivery_id,), False)
    return next(iter(_held(alias, args)), None)


@functools.lru_cache(maxsize=64)
def _update_sql(alias: str, columns: tuple[str, ...]) -> str:
    """The compare-and-set ``UPDATE`` for these columns, built once per shape."""
    quote = connections[alias].ops.quote_name
    sets = [_assignment(quote, c) for c in columns]
    return (
        f"UPDATE {quote(_table(DeliveryRecord))} SET {', '.join(sets)} "
        f"WHERE {quote('id')} = %s AND {quote('status')} = %s "
        f"AND {quote('claimed_by')} = %s AND {quote('claimed_at')} = %s"
    )


def _assignment(quote: Any, column: str) -> str:
    if column == "attempts":
        return f"{quote(column)} = {quote(column)} + %s"
    if column == "claim_rank":
        return f"{quote(column)} = %s - {quote('priority_credit')}"
    return f"{quote(column)} = %s"


def compare_and_set(alias: str, claim: Claim, assignments: dict[str, Any]) -> bool:
    """One ``UPDATE`` of the claimed row, only while ``claim`` still holds it.

    ``attempts`` is added to, every other column set; ``claim_rank`` follows a new
    ``available_at``. False when the row was settled, handed back or taken over since:
    the caller no longer holds it.
    """
    moment = assignments.get("available_at")
    if isinstance(moment, datetime):
        assignments = {**assignments, "claim_rank": priority.rank(moment)}
    connection = connections[alias]
    adapt = connection.ops.adapt_datetimefield_value
    params = [adapt(v) if isinstance(v, datetime) else v for v in assignments.values()]
    params += [claim.id, DeliveryStatus.CLAIMED.value, claim.claimed_by, adapt(claim.claimed_at)]
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(alias, tuple(assignments)), params)
        return bool(cursor.rowcount)
