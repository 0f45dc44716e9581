"""Claiming owed rows under a lease: ``claim_batch``, and what a claim's rows may become.

``claim_batch`` is the one way rows are claimed: it works out the lane's receivers, the
orphans it may take and the limits (``limits.py``), then runs the database's claim: one
statement on PostgreSQL (``claim_postgresql.py``), a pick then a stamp elsewhere
(``claim_portable.py``). A claimed row's ``available_at`` is its lease expiry, so a row
whose worker died is claimable again by the same index and condition as any owed row;
what taking it over costs, and how it runs next, is the lapse rule (``lapse.py``). A
held row changes only while its claim still holds it (``compare_and_set``), is handed
back unstarted (``release``) or is taken by a task worker (``take_over``). What a claim
carries is in ``claim_rows.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from .. import clock, conf, priority
from ..declare import registry
from ..models import (
    DeliveryRecord,
    DeliveryStatus,
    database_alias,
)
from . import limits
from .claim_portable import claim_portable
from .claim_postgresql import claim_postgresql
from .claim_rows import Claim, ClaimArgs, held_claims, owed_again, table


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
    skip_keys: Collection[str] = (),
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
    args = ClaimArgs(
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
        skip=tuple(sorted(skip_keys)),
    )
    if only is not None and orphans is None and set(only) <= set(args.skip):
        return []
    keys = only if only is not None else declared_keys()
    limited = limits.declared(keys)
    if limited:
        return _claim_within_limits(alias, args, limited, keys)
    return _claim(alias, args)


def _claim(alias: str, args: ClaimArgs) -> list[Claim]:
    if connections[alias].vendor == "postgresql":
        return claim_postgresql(alias, args)
    with transaction.atomic(using=alias):
        return claim_portable(alias, args)


def _claim_within_limits(
    alias: str, args: ClaimArgs, limited: Sequence[limits.Limit], keys: Sequence[str]
) -> list[Claim]:
    """The limited receivers' rows first, each within every limit holding it as it allows
    now; then the rest of the lane, after the limited rows' tokens are spent, so a limit's
    lock never slows the unlimited receivers' claims. A row that must run alone
    (``lapse.py``) ends the claim.

    The limited rows are claimed in one transaction holding the limits' rows locked
    (``limits.py``), or, where the limits are rates alone on PostgreSQL
    (``limits.lock_free``), without one: the buckets read, the rows claimed, the tokens
    spent by compare-and-set, and the rows handed back unstarted if another claim spent
    the bucket first.
    """
    asking = limits.worth_asking(alias, limited, args.now)
    if limits.lock_free(alias, asking):
        grants = limits.allowances(alias, asking, args.now, lock=False) if asking else []
        claims, taken = _claim_limited(alias, args, limited, keys, grants)
        if not limits.spend_unlocked(alias, grants, taken, args.now):
            release(claims, now=args.now)
            claims = []
    else:
        with transaction.atomic(using=alias):
            grants = limits.allowances(alias, asking, args.now) if asking else []
            claims, taken = _claim_limited(alias, args, limited, keys, grants)
            limits.spend(alias, grants, taken)
    rest = args.limit - len(claims)
    skip = tuple(sorted({key for lm in limited for key in lm.members} | set(args.skip)))
    every_one_limited = (
        args.only is not None and args.orphans is None and set(args.only) <= set(skip)
    )
    if rest > 0 and not every_one_limited and not any(claim.alone for claim in claims):
        claims += _claim(alias, _more(args, claims, only=args.only, limit=rest, skip=skip))
    if not claims:
        limits.forget_idle(alias)
    return claims


def _claim_limited(
    alias: str,
    args: ClaimArgs,
    limited: Sequence[limits.Limit],
    keys: Sequence[str],
    grants: Sequence[limits.Grant],
) -> tuple[list[Claim], dict[str, int]]:
    """Claim the limited receivers' rows within ``grants``: the claims, and how many rows
    were taken from each limit."""
    claims: list[Claim] = []
    taken: dict[str, int] = {}
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
    return claims, taken


def _more(
    args: ClaimArgs,
    claims: Sequence[Claim],
    *,
    only: tuple[str, ...] | None,
    limit: int,
    skip: tuple[str, ...] = (),
) -> ClaimArgs:
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


def release(claims: Sequence[Claim], *, now: datetime | None = None) -> int:
    """Hand rows back unstarted: owed again at once, no attempt spent.

    A compare-and-set on each claim, so a row another worker has taken since is left alone:
    one statement for the rows of each claim (one worker at one moment), in one transaction.
    """
    if not claims:
        return 0
    alias = database_alias()
    moment = clock.normalize(now) if now is not None else clock.now()
    ids_by_claim: dict[tuple[str, datetime], list[int]] = {}
    for claim in claims:
        ids_by_claim.setdefault((claim.claimed_by, claim.claimed_at), []).append(claim.id)
    released = 0
    with transaction.atomic(using=alias):
        for (claimed_by, claimed_at), ids in ids_by_claim.items():
            released += (
                DeliveryRecord.objects.using(alias)
                .filter(
                    id__in=ids,
                    status=DeliveryStatus.CLAIMED,
                    claimed_by=claimed_by,
                    claimed_at=claimed_at,
                )
                .update(**owed_again(moment))
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
    args = ClaimArgs(worker_id, now, now + lease, 1, None, None, (), (delivery_id,), False)
    return next(iter(held_claims(alias, args)), None)


@functools.lru_cache(maxsize=64)
def _update_sql(alias: str, columns: tuple[str, ...]) -> str:
    """The compare-and-set ``UPDATE`` for these columns, built once per shape."""
    quote = connections[alias].ops.quote_name
    sets = [_assignment(quote, c) for c in columns]
    return (
        f"UPDATE {quote(table(DeliveryRecord))} SET {', '.join(sets)} "
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
