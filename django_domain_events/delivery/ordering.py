"""The ordering rule: a row of an ordered receiver runs only as the head of its key.

``@receiver(ordered_by=...)`` gives each row a key at ``fire()`` (``order_key``). A
row with a key may be claimed only when

- no earlier row (smaller id) of the same receiver and key is unended: pending, failed
  or claimed, or dead when the receiver declares ``on_dead="block"``; and
- no other row of the same receiver and key is claimed (a dead row requeued under
  ``on_dead="skip"`` waits for the key's running row).

"Earlier" is the order the rows were recorded in (their ids). Only a key's head is
ever claimable, so a batch, the slots of ``--concurrency`` and an ``ack="batch"`` group
never hold two rows of one key, and a head that retries, is ``NotYet`` or is not due
holds its key. The rule is stated once, here: PostgreSQL's claim statement adds
``head_sql``, the portable claim ``head_q``, and both read the partial indexes
``dde_delivery_order`` (a key's unended rows by id) and ``dde_delivery_order_claimed``.

MariaDB reads the heads unlocked and then locks them by primary key (``claim_portable.py``):
its ``SKIP LOCKED`` also skips the rows a ``NOT EXISTS`` subquery reads, so a locked
earlier row would look absent and its successor would run beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, Min, OuterRef, Q

from ..declare import RegisteredReceiver, registry
from ..models import (
    ORDER_KEY_LENGTH,
    OWED_VALUES,
    STATUS_SQL,
    UNENDED_VALUES,
    DeliveryRecord,
    DeliveryStatus,
)


def order_key(receiver: RegisteredReceiver, evt: object) -> str | None:
    """The key ``receiver``'s row for ``evt`` is ordered by (None: not ordered).

    Raises ``TypeError`` or ``ValueError`` naming the value, from ``fire()``, before
    anything is written.
    """
    if receiver.ordered_by is None:
        return None
    value = receiver.ordered_by(evt)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(
            f"ordered_by of receiver {receiver.key!r} returned {value!r}; it must return a "
            "str or an int (the aggregate's id), never None or a bool."
        )
    key = str(value)
    if not key or len(key) > ORDER_KEY_LENGTH:
        raise ValueError(
            f"ordered_by of receiver {receiver.key!r} returned {key[:40]!r} "
            f"({len(key)} characters); a key must be 1 to {ORDER_KEY_LENGTH} characters: "
            "return the aggregate's id, not a description of it."
        )
    return key


def in_use() -> bool:
    """Whether any declared receiver is ordered: the claim adds the rule only then."""
    return any(r.durable and r.ordered_by is not None for r in registry.receivers)


def blocking_keys() -> tuple[str, ...]:
    """The receivers whose dead rows hold their key (``on_dead="block"``)."""
    return tuple(
        r.key
        for r in registry.receivers
        if r.durable and r.ordered_by is not None and r.on_dead == "block"
    )


def head_sql(row: str, delivery: str) -> str:
    """SQL true when the row named ``row`` may be claimed by the rule; takes the
    ``%(blocking)s`` parameter (``blocking_keys()``, a text array)."""
    same = (
        f"receiver_key = {row}.receiver_key AND {{t}}.order_key = {row}.order_key "
        f"AND {{t}}.order_key IS NOT NULL"
    )
    # The claimed rows first: a small index, and the usual reason a row waits (its
    # key's head is running), so most waiting rows cost the claim one cheap probe.
    return (
        f"({row}.order_key IS NULL OR ("
        f"NOT EXISTS (SELECT 1 FROM {delivery} AS running WHERE running."
        + same.format(t="running")
        + f" AND running.status = {STATUS_SQL['claimed']} AND running.id <> {row}.id) "
        f"AND NOT EXISTS (SELECT 1 FROM {delivery} AS earlier WHERE earlier."
        + same.format(t="earlier")
        + f" AND earlier.id < {row}.id AND earlier.status IN {unended_sql()} "
        f"AND (earlier.status <> {STATUS_SQL['dead']} "
        f"OR earlier.receiver_key = ANY(%(blocking)s::text[])))))"
    )


def unended_sql() -> str:
    return "(" + ", ".join(f"'{v}'" for v in UNENDED_VALUES) + ")"


def head_q(alias: str) -> Q:
    """``head_sql`` for the ORM: the portable claim's filter."""
    rows = DeliveryRecord.objects.using(alias)
    same: dict[str, Any] = {
        "receiver_key": OuterRef("receiver_key"),
        "order_key": OuterRef("order_key"),
    }
    holds = Q(status__in=OWED_VALUES)
    blocking = blocking_keys()
    if blocking:
        holds |= Q(status=DeliveryStatus.DEAD, receiver_key__in=blocking)
    earlier = rows.filter(holds, id__lt=OuterRef("id"), **same)
    running = rows.filter(status=DeliveryStatus.CLAIMED, **same).exclude(id=OuterRef("id"))
    return Q(order_key__isnull=True) | (~Exists(running) & ~Exists(earlier))


@dataclass(frozen=True)
class HeldKey:
    """An ordered key whose later rows wait behind a head that cannot run now."""

    receiver_key: str
    order_key: str
    delivery_id: int  # the head holding the key
    status: str
    why: str  # "retrying", "not due" or "dead under block"
    waiting: int  # the key's rows behind it


#: The most held keys ``held_keys`` reports, oldest head first.
HELD_KEYS_SHOWN = 100


def held_keys(alias: str, moment: datetime) -> tuple[HeldKey, ...]:
    """The held keys, oldest head first, in two queries (none while nothing is ordered):
    the heads of keys with rows waiting, read from ``dde_delivery_order``, then the heads
    themselves. A claimed head is running, so its key is not reported."""
    if not in_use():
        return ()
    holds = Q(status__in=OWED_VALUES)
    blocking = blocking_keys()
    if blocking:
        holds |= Q(status=DeliveryStatus.DEAD, receiver_key__in=blocking)
    keys = (
        DeliveryRecord.objects.using(alias)
        .filter(holds, order_key__isnull=False)
        .values("receiver_key", "order_key")
        .annotate(head=Min("id"), n=Count("id"))
        .filter(n__gt=1)
        .order_by("head")
    )
    waiting = {row["head"]: row["n"] - 1 for row in keys[: HELD_KEYS_SHOWN * 2]}
    heads = DeliveryRecord.objects.using(alias).filter(pk__in=waiting).order_by("pk")
    held = []
    for row in heads.values("pk", "receiver_key", "order_key", "status", "available_at"):
        why = _why_held(row["status"], row["available_at"], moment)
        if why:
            held.append(
                HeldKey(
                    row["receiver_key"],
                    str(row["order_key"]),
                    row["pk"],
                    row["status"],
                    why,
                    waiting[row["pk"]],
                )
            )
    return tuple(held[:HELD_KEYS_SHOWN])


def _why_held(status: str, available_at: datetime, moment: datetime) -> str:
    if status == DeliveryStatus.DEAD:
        return "dead under block"
    if status == DeliveryStatus.CLAIMED or available_at <= moment:
        return ""  # running, or claimable now
    return "retrying" if status == DeliveryStatus.FAILED else "not due"
