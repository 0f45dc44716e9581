"""The claim on MariaDB, MySQL and SQLite: pick the owed rows, then stamp them, in one
transaction. SQLite, a single writer, stamps with one ``UPDATE`` that re-checks the owed
condition; MariaDB picks its candidates unlocked and locks them by primary key
(``_pick``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Case, F, PositiveIntegerField, Q, Value, When

from ..models import (
    DeliveryRecord,
    DeliveryStatus,
)
from .claim_rows import Claim, ClaimArgs, held_claims, owed_again, owed_rows
from .lapse import keep_count, running_ids


def claim_portable(alias: str, args: ClaimArgs) -> list[Claim]:
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
        rows = owed_rows(alias, replace(args, ids=ids))
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
    held = held_claims(alias, replace(args, ids=ids), alone_ids)
    return sorted(held, key=lambda claim: order[claim.id])


def _pick(alias: str, args: ClaimArgs) -> list[tuple[Any, ...]]:
    """The owed rows the portable claim takes, locked where the database can skip locks.

    MariaDB locks every row a locking read examines, and for an owed range in rank order
    it examines them all (a scan and a sort): such a claim would hold the whole backlog,
    and a relay claiming beside it would find nothing. So the candidates are read
    unlocked, in rank order, then locked by primary key, skipping the rows another claim
    holds; a page that leaves the batch short is followed by the next, a few at most.
    """
    owed = owed_rows(alias, args)
    if not connections[alias].features.has_select_for_update_skip_locked:
        return list(owed.values_list(*_PICKED_FIELDS)[: args.limit])
    picked: list[tuple[Any, ...]] = []
    passed: list[int] = []  # candidates read already: taken, or locked by another claim
    for _ in range(PICK_PAGES):
        page = owed_rows(alias, replace(args, exclude=(*args.exclude, *passed)))
        candidates = tuple(page.values_list("id", flat=True)[: args.limit])
        if not candidates:
            break
        # Unordered, so the database reads the candidates by primary key and nothing else.
        locking = owed_rows(alias, replace(args, ids=candidates), heads=False).order_by()
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
        DeliveryRecord.objects.using(alias).filter(id__in=ids).update(**owed_again(now))
