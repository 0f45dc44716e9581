"""Rate and concurrency limits held across every relay and slot, in the database.

A claim in a lane with limited receivers (``rate_limit=``, ``concurrency_limit=``) runs
in one transaction: it locks their ``LimitRecord`` rows, works out how many rows of each
it may take (``allowances``), claims up to that many of each, then the unlimited rest, and
spends the tokens (``spend``) before it commits. So two relays never spend one token, and a
limit that allows nothing now leaves its rows owed, unclaimed and uncharged, while the
other receivers of the lane are claimed as usual. A limit another relay's claim holds
locked is skipped, not waited for (``SKIP LOCKED``): that relay is taking its rows, and
this one claims the rest of the lane at once.

- **Rate**: a token bucket per receiver, refilled at the rate from ``refilled_at``, holding
  at most a fifth of a second's worth (at least one), so no window sees more than the
  rate plus that burst.
- **Concurrency**: the rows of the receiver under a live lease (claimed, lease not past),
  counted at each claim. Nothing is held apart from the rows: a relay killed with rows
  running frees them when their lease lapses.
- **Pause**: ``RetryAfter`` from a limited receiver stops every relay claiming its rows
  until its ``until`` (``pause``).

A relay whose claim found a rate empty sleeps until the next token (``seconds_to_token``)
rather than its poll interval, and its claims leave that limit alone until the bucket
holds ``Limit.gather`` tokens again (``worth_asking``): they neither lock it nor wait for
it, and a busy rate costs a transaction per few rows, not per row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Count

from ..declare import registry
from ..models import DeliveryRecord, DeliveryStatus, LimitRecord
from ..receiver_options import per_second

BURST_SECONDS = 0.2  # a bucket holds this many seconds' worth of tokens (at least one)


@dataclass(frozen=True)
class Limit:
    """A receiver's declared limits: a rate in rows per second, and rows at once."""

    key: str
    rate: float | None
    concurrency: int | None

    @property
    def burst(self) -> float:
        """The most tokens the bucket holds."""
        return max(1.0, (self.rate or 0.0) * BURST_SECONDS)

    @property
    def gather(self) -> float:
        """The tokens worth a claim's lock once this process saw the bucket spent: half
        the burst (at least one), so a busy rate is taken a few rows per transaction
        rather than one, and the bucket never fills up unasked."""
        return max(1.0, self.burst / 2)


def declared(keys: Iterable[str]) -> tuple[Limit, ...]:
    """The limits of the receivers among ``keys`` that declare one."""
    found = []
    for key in keys:
        r = registry.receiver(key)
        if r is None or (r.rate_limit is None and r.concurrency_limit is None):
            continue
        rate = per_second(r.rate_limit) if r.rate_limit is not None else None
        found.append(Limit(key, rate, r.concurrency_limit))
    return tuple(found)


def every_declared() -> tuple[Limit, ...]:
    """The limits of every durable receiver this process declares."""
    return declared(r.key for r in registry.receivers if r.durable)


@dataclass(frozen=True)
class Grant:
    """What one claim may take of a limited receiver, and its bucket once refilled."""

    limit: Limit
    rows: int
    tokens: float
    # Never moved back: relays claim with slightly different clocks and stale moments, and a
    # bucket refilled from an earlier time would be handed the same seconds twice.
    refilled_at: datetime


# time.monotonic() at which this process's last claim expects a token; relay._poll reads it.
_next_token = math.inf
# Per database and rate-only limit, the moment (the claims' clock) before which its bucket
# is known to hold less than ``Limit.gather``: other relays only take tokens, so no claim
# before then need lock it.
# Keyed by the whole limit, so a receiver declared again with other limits asks afresh.
_empty_until: dict[tuple[str, Limit], datetime] = {}


def worth_asking(alias: str, limits: Iterable[Limit], now: datetime) -> tuple[Limit, ...]:
    """The limits a claim at ``now`` on ``alias`` should lock: all but the rates this
    process saw empty there, until their next token is due."""
    return tuple(lm for lm in limits if not _known_empty(alias, lm, now))


def _known_empty(alias: str, limit: Limit, now: datetime) -> bool:
    until = _empty_until.get((alias, limit))
    # A naive and an aware moment (USE_TZ changed in this process): ask the database.
    return until is not None and (until.tzinfo is None) == (now.tzinfo is None) and now < until


def allowances(alias: str, limits: Collection[Limit], now: datetime) -> list[Grant]:
    """Lock the limits' rows no other claim holds and say how many rows of each a claim
    may take now (a limit held elsewhere gets no grant: its holder is claiming it).

    Called inside the claim's transaction; the locks hold until it commits.
    """
    global _next_token
    state = _locked(alias, limits, now)
    limits = [limit for limit in limits if limit.key in state]
    running = running_counts(alias, [lm.key for lm in limits if lm.concurrency], now)
    grants, wait = [], math.inf
    for limit in limits:
        grant, seconds = _grant(limit, state[limit.key], running.get(limit.key, 0), now)
        grants.append(grant)
        wait = min(wait, seconds)
        if seconds < math.inf:
            _spent_until(alias, grant, grant.tokens)
    _next_token = time.monotonic() + wait
    return grants


def _locked(alias: str, limits: Collection[Limit], now: datetime) -> dict[str, LimitRecord]:
    """The limits' rows this claim could lock, by key, created on first use: one statement
    when they exist and none is held elsewhere."""
    found = _lock(alias, [limit.key for limit in limits])
    missing = [limit for limit in limits if limit.key not in found]
    if missing:  # held by another claim, or not written yet: only the latter are created
        rows = LimitRecord.objects.using(alias)
        held = set(rows.filter(key__in=[lm.key for lm in missing]).values_list("key", flat=True))
        new = [lm for lm in missing if lm.key not in held]
        if new:
            rows.bulk_create(
                [LimitRecord(key=lm.key, tokens=lm.burst, refilled_at=now) for lm in new],
                ignore_conflicts=True,
            )
            found.update(_lock(alias, [lm.key for lm in new]))
    return found


def _lock(alias: str, keys: list[str]) -> dict[str, LimitRecord]:
    """Lock the rows of ``keys`` that no other transaction holds (all of them where the
    database cannot skip a lock: it then waits)."""
    rows = LimitRecord.objects.using(alias).filter(key__in=keys).order_by("key")
    features = connections[alias].features
    if features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=True)
    elif features.has_select_for_update:
        rows = rows.select_for_update()
    return {row.key: row for row in rows}


def _grant(limit: Limit, row: LimitRecord, running: int, now: datetime) -> tuple[Grant, float]:
    """One limit's grant, and the seconds until a token comes when the rate allows none."""
    refilled_at = max(row.refilled_at, now)
    if row.paused_until is not None and row.paused_until > now:
        return Grant(limit, 0, row.tokens, row.refilled_at), math.inf
    rows, tokens, wait = math.inf, row.tokens, math.inf
    if limit.rate is not None:
        elapsed = max(0.0, (now - row.refilled_at).total_seconds())
        tokens = min(limit.burst, row.tokens + elapsed * limit.rate)
        rows = math.floor(tokens)
        if rows < 1:
            wait = (1 - tokens) / limit.rate
    if limit.concurrency is not None:
        rows = min(rows, max(0, limit.concurrency - running))
    return Grant(limit, int(min(rows, 1_000_000)), tokens, refilled_at), wait


def spend(alias: str, grants: Iterable[Grant], taken: Mapping[str, int]) -> None:
    """Write back each rate's bucket: refilled to its grant's moment, less the rows claimed.

    A bucket nothing was taken from is left as it is: refilling it in the row would say
    nothing its stored tokens and ``refilled_at`` do not (the claim then writes nothing).
    """
    for grant in grants:
        if grant.limit.rate is None or not taken.get(grant.limit.key, 0):
            continue
        left = max(0.0, grant.tokens - taken[grant.limit.key])
        LimitRecord.objects.using(alias).filter(key=grant.limit.key).update(
            tokens=left, refilled_at=grant.refilled_at
        )
        _spent_until(alias, grant, left)


def _spent_until(alias: str, grant: Grant, left: float) -> None:
    """Remember when a rate-only bucket holding ``left`` tokens at its grant's moment has
    gathered enough to be worth asking again (``worth_asking``)."""
    limit = grant.limit
    if limit.rate is None or limit.concurrency is not None or left >= limit.gather:
        return
    seconds = (limit.gather - left) / limit.rate
    _empty_until[alias, limit] = grant.refilled_at + timedelta(seconds=seconds)


def running_counts(alias: str, keys: Collection[str], now: datetime) -> dict[str, int]:
    """How many rows of each receiver are under a live lease at ``now``."""
    if not keys:
        return {}
    counted = (
        DeliveryRecord.objects.using(alias)
        .filter(receiver_key__in=keys, status=DeliveryStatus.CLAIMED, lease_expires_at__gt=now)
        .values("receiver_key")
        .annotate(n=Count("id"))
    )
    return {row["receiver_key"]: row["n"] for row in counted}


def pause(alias: str, key: str, until: datetime, now: datetime) -> None:
    """Stop every relay claiming ``key``'s rows until ``until`` (its RetryAfter)."""
    LimitRecord.objects.using(alias).bulk_create(
        [LimitRecord(key=key, tokens=0.0, refilled_at=now)], ignore_conflicts=True
    )
    LimitRecord.objects.using(alias).filter(key=key).update(paused_until=until)


def seconds_to_token() -> float | None:
    """Seconds until the rate this process last found empty has a token (None: no wait)."""
    left = _next_token - time.monotonic()
    return left if 0 < left < math.inf else None
