"""Rate and concurrency limits held across every relay and slot, in the database.

A limit belongs to one receiver (``rate_limit=``, ``concurrency_limit=``), to a named
group of receivers (``@receiver(limit_group="sms")`` and the ``LIMIT_GROUPS`` setting) or
to every receiver of a lane (``LANE_LIMITS``): one ``LimitRecord`` each, keyed by the
receiver's key, ``group:<name>`` or ``lane:<name>``. A row runs only within every limit
that holds its receiver: its own, its group's and its lane's.

A claim in a lane with limited receivers runs in one transaction: it locks their
``LimitRecord`` rows, works out how many rows each limit allows (``allowances``), claims
the limited receivers' rows within them (``takes``: a receiver with a limit of its own
alone, the others of one group or lane together, in rank order), then the unlimited
rest, and spends the tokens (``spend``) before it commits. So two relays never spend one
token, and a limit that allows nothing now leaves its rows owed, unclaimed and
uncharged, while the other receivers of the lane are claimed as usual. A limit another
relay's claim holds locked is skipped, not waited for (``SKIP LOCKED``): that relay is
taking its rows, and this one claims the rest of the lane at once, and leaves a rate it
found held alone for half the time its bucket takes to gather (``_held_elsewhere``).

On PostgreSQL, a claim whose limits are all rates (``lock_free``) opens no transaction:
it reads the buckets, claims within them, and spends by compare-and-set against what it
read (``spend_unlocked``, one statement that skips a locked row); if another claim spent
or holds a bucket meanwhile, it spends nothing and hands its rows back unstarted. A rate
is never overspent either way; a busy one costs a read, a claim and a write, not the five
statements of a locked transaction, and a short one a read.

- **Rate**: a token bucket per limit, refilled at the rate from ``refilled_at``, holding
  at most a fifth of a second's worth (at least one), so no window sees more than the
  rate plus that burst; granted only once it holds ``Limit.gather`` tokens (half the
  burst), so busy relays take a rate a handful of rows per transaction, not a row per
  token each.
- **Concurrency**: the rows of the limit's receivers under a live lease (claimed, lease
  not past), counted at each claim. Nothing is held apart from the rows: a relay killed
  with rows running frees them when their lease lapses.
- **Pause**: ``RetryAfter`` from a limited receiver stops every relay claiming its rows
  until its ``until`` (``pause``); from a receiver of a group, every receiver of the
  group (``paused_by``). A lane is not paused: its receivers share a budget, not a
  downstream service.

A relay whose claim found a rate empty sleeps until it can be granted again
(``seconds_to_token``) rather than its poll interval, and its claims leave that limit
alone until the bucket holds ``Limit.gather`` tokens again (``worth_asking``): they
neither lock it nor wait for it, and a busy rate costs a transaction per few rows, not
per row. A limited receiver a claim found nothing due of is not asked for
``IDLE_SECONDS`` while the relay keeps finding work (``note_idle``, ``forget_idle``), so
an idle limit does not cost its lane a locked transaction at every claim.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count

from .. import conf
from ..declare import registry
from ..models import DeliveryRecord, DeliveryStatus, LimitRecord
from ..receiver_options import per_second

BURST_SECONDS = 0.2  # a bucket holds this many seconds' worth of tokens (at least one)
GROUP_PREFIX = "group:"  # a group's LimitRecord key: "group:sms"
LANE_PREFIX = "lane:"  # a lane's: "lane:bulk"


@dataclass(frozen=True)
class Limit:
    """A declared limit: a rate in rows per second and rows at once, shared by
    ``members`` (the receiver itself for a receiver's own limit)."""

    key: str  # its LimitRecord's: the receiver's key, "group:<name>" or "lane:<name>"
    rate: float | None
    concurrency: int | None
    members: tuple[str, ...] = ()
    kind: str = "receiver"  # "receiver", "group" or "lane"
    rate_text: str | None = None  # the rate as declared: "50/s"

    @property
    def burst(self) -> float:
        """The most tokens the bucket holds."""
        return max(1.0, (self.rate or 0.0) * BURST_SECONDS)

    @property
    def gather(self) -> float:
        """The tokens a bucket must hold to be granted at all: half the burst (at least
        one), so a busy rate is taken a few rows per transaction rather than one, and the
        bucket never fills up unasked."""
        return max(1.0, self.burst / 2)


def _limit(key: str, kind: str, members: tuple[str, ...], spec: Mapping[str, Any]) -> Limit:
    rate = spec.get("rate_limit")
    return Limit(
        key=key,
        rate=per_second(rate) if rate is not None else None,
        concurrency=spec.get("concurrency_limit"),
        members=members,
        kind=kind,
        rate_text=rate,
    )


def _options(rate: str | None, concurrency: int | None) -> dict[str, Any]:
    return {"rate_limit": rate, "concurrency_limit": concurrency}


def every_declared() -> tuple[Limit, ...]:
    """Every limit this process declares: the receivers' own, then the groups' and the
    lanes' (a group or lane without a receiver too, with no members)."""
    receivers = [r for r in registry.receivers if r.durable]
    found = [
        _limit(r.key, "receiver", (r.key,), _options(r.rate_limit, r.concurrency_limit))
        for r in receivers
        if r.rate_limit is not None or r.concurrency_limit is not None
    ]
    settings = conf.get()
    for name, spec in sorted((settings.LIMIT_GROUPS or {}).items()):
        members = tuple(r.key for r in receivers if r.limit_group == name)
        found.append(_limit(GROUP_PREFIX + name, "group", members, spec))
    lanes = registry.lanes()
    for lane, spec in sorted((settings.LANE_LIMITS or {}).items()):
        found.append(_limit(LANE_PREFIX + lane, "lane", lanes.get(lane, ()), spec))
    return tuple(found)


def declared(keys: Iterable[str]) -> tuple[Limit, ...]:
    """The limits holding any receiver among ``keys``: their own, their group's, their
    lane's."""
    wanted = set(keys)
    return tuple(lm for lm in every_declared() if wanted.intersection(lm.members))


def paused_by(receiver_key: str) -> tuple[str, ...]:
    """The limits a ``RetryAfter`` from the receiver pauses: its own and its group's."""
    return tuple(
        lm.key
        for lm in declared([receiver_key])
        if lm.kind in ("receiver", "group") and receiver_key in lm.members
    )


def takes(
    limited: Collection[Limit], keys: Iterable[str]
) -> list[tuple[tuple[str, ...], tuple[Limit, ...]]]:
    """The claims a batch makes of the limited receivers among ``keys``, in order: each
    the receivers taken together (in rank order) and the limits they all answer to.

    A receiver with a limit of its own goes alone, first (its own limit bounds what it
    takes of its group's); the receivers answering to the same group and lane limits and
    to none of their own go together, so the oldest of their rows go first.
    """
    by_limits: dict[tuple[Limit, ...], list[str]] = {}
    for key in keys:
        holding = tuple(lm for lm in limited if key in lm.members)
        if holding:
            by_limits.setdefault(holding, []).append(key)
    found = [(tuple(ks), h) for h, ks in by_limits.items()]
    # Stable: the receivers with a limit of their own first, each set in its first order.
    return sorted(found, key=lambda take: not any(lm.kind == "receiver" for lm in take[1]))


@dataclass(frozen=True)
class Grant:
    """What one claim may take of a limit, and its bucket once refilled."""

    limit: Limit
    rows: int
    tokens: float
    # Never moved back: relays claim with slightly different clocks and stale moments, and a
    # bucket refilled from an earlier time would be handed the same seconds twice.
    refilled_at: datetime
    # The bucket as the claim found it (tokens, refilled_at, paused_until): what a spend
    # without a lock (``spend_unlocked``) expects to find still there.
    found: tuple[float, datetime, datetime | None]


# time.monotonic() at which this process's last claim expects a token; relay._poll reads it.
_next_token = math.inf
# Per database and rate-only limit, the moment (the claims' clock) before which its bucket
# is known to hold less than ``Limit.gather``: other relays only take tokens, so no claim
# before then need lock it.
# Keyed by the whole limit, so a receiver declared again with other limits asks afresh.
# A rate another claim held locked is left alone for HELD_SHARE of the time its bucket
# takes to gather (``_held_elsewhere``): its holder may take fewer rows than the bucket
# holds (as many as it has free slots), and the rest must be taken before the bucket is
# full. It holds as much again beyond ``gather`` (at 10/s and more), so half of that wait
# loses no token; asked again at every claim, four busy relays at 50/s locked it 100
# times a second, nearly half of them to find it held (measured, bench section 17).
_empty_until: dict[tuple[str, Limit], datetime] = {}
HELD_SHARE = 0.5
# Per database and limited receiver, the moment before which a busy relay's claims need
# not ask for it: a claim found none of its rows due (``note_idle``). Dropped when a claim
# comes back empty (``forget_idle``), so an idle relay woken by a new row asks at once.
_idle_until: dict[tuple[str, str], datetime] = {}
IDLE_SECONDS = 0.2


def worth_asking(alias: str, limits: Iterable[Limit], now: datetime) -> tuple[Limit, ...]:
    """The limits a claim at ``now`` on ``alias`` should lock: all but the rates this
    process saw short or held elsewhere there, until their wait is over
    (``_empty_until``), and but those whose every receiver answers to such a rate too
    (their lock would buy nothing)."""
    limits = tuple(limits)
    fresh = {lm for lm in limits if not _known_empty(alias, lm, now)}

    def open_to(key: str) -> bool:
        idle = _idle_until.get((alias, key))
        if idle is not None and (idle.tzinfo is None) == (now.tzinfo is None) and now < idle:
            return False
        return all(other in fresh for other in limits if key in other.members)

    return tuple(lm for lm in limits if lm in fresh and any(map(open_to, lm.members)))


def _known_empty(alias: str, limit: Limit, now: datetime) -> bool:
    until = _empty_until.get((alias, limit))
    # A naive and an aware moment (USE_TZ changed in this process): ask the database.
    return until is not None and (until.tzinfo is None) == (now.tzinfo is None) and now < until


def lock_free(alias: str, limits: Collection[Limit]) -> bool:
    """Whether a claim asking these limits takes their tokens without a transaction: on
    PostgreSQL, where they are rates alone. A concurrency is counted from the rows under
    a lease, so its claim must hold the limit locked while it claims; SQLite writes one
    transaction at a time (a second would cost a commit), and MariaDB cannot lock a row in
    the statement that updates it, so both keep the locked claim."""
    return connections[alias].vendor == "postgresql" and all(
        limit.concurrency is None for limit in limits
    )


def allowances(
    alias: str, limits: Collection[Limit], now: datetime, *, lock: bool = True
) -> list[Grant]:
    """Lock the limits' rows no other claim holds and say how many rows of each a claim
    may take now (a limit held elsewhere gets no grant: its holder is claiming it).

    Called inside the claim's transaction; the locks hold until it commits. With
    ``lock=False`` (``lock_free`` limits) the rows are only read, and the claim spends
    what it took by compare-and-set (``spend_unlocked``).
    """
    global _next_token
    state = _locked(alias, limits, now) if lock else _read(alias, limits, now)
    wait = min(
        [_held_elsewhere(alias, lm, now) for lm in limits if lm.key not in state], default=math.inf
    )
    limits = [limit for limit in limits if limit.key in state]
    running = running_counts(alias, {k for lm in limits if lm.concurrency for k in lm.members}, now)
    grants = []
    for limit in limits:
        in_use = sum(running.get(key, 0) for key in limit.members)
        grant, seconds = _grant(limit, state[limit.key], in_use, now)
        grants.append(grant)
        wait = min(wait, seconds)
        if seconds < math.inf:
            _spent_until(alias, grant, grant.tokens)
    _next_token = time.monotonic() + wait
    return grants


def _held_elsewhere(alias: str, limit: Limit, now: datetime) -> float:
    """A limit another claim holds locked is being taken from: a rate-only one is left
    alone for ``HELD_SHARE`` of the time its bucket takes to gather; returns the seconds
    until this process asks for it again (math.inf: at its next claim)."""
    if limit.rate is None or limit.concurrency is not None:
        return math.inf
    seconds = HELD_SHARE * limit.gather / limit.rate
    _empty_until[alias, limit] = now + timedelta(seconds=seconds)
    return seconds


def note_idle(alias: str, keys: Iterable[str], now: datetime) -> None:
    """Remember that a claim at ``now`` found no more due rows of these limited
    receivers: this process's claims leave them alone for ``IDLE_SECONDS``."""
    for key in keys:
        _idle_until[alias, key] = now + timedelta(seconds=IDLE_SECONDS)


def forget_idle(alias: str) -> None:
    """A claim came back empty: the relay may sleep now, and its next claim (a new row's
    wake-up) must ask every limited receiver again."""
    for pair in [pair for pair in _idle_until if pair[0] == alias]:
        del _idle_until[pair]


# When this process last saw each limit's row, by (alias, key): a row it saw a moment
# ago and cannot lock now is held by another claim, so the claim skips it without asking
# whether it exists (one statement, not two, for every claim that finds a busy limit held
# elsewhere). Past SEEN_SECONDS it asks again, so a row deleted meanwhile is written anew.
_seen_at: dict[tuple[str, str], float] = {}
SEEN_SECONDS = 5.0


def _locked(alias: str, limits: Collection[Limit], now: datetime) -> dict[str, LimitRecord]:
    """The limits' rows this claim could lock, by key, created on first use: one statement
    when they exist, whether or not another claim holds some of them."""
    found = _lock(alias, [limit.key for limit in limits])
    clock = time.monotonic()
    missing = [
        limit
        for limit in limits
        if limit.key not in found
        and clock - _seen_at.get((alias, limit.key), -math.inf) > SEEN_SECONDS
    ]
    if missing:  # held by another claim, or not written yet: only the latter are created
        rows = LimitRecord.objects.using(alias)
        held = set(rows.filter(key__in=[lm.key for lm in missing]).values_list("key", flat=True))
        _seen_at.update({(alias, key): clock for key in held})
        new = [lm for lm in missing if lm.key not in held]
        if new:
            _create(alias, new, now)
            found.update(_lock(alias, [lm.key for lm in new]))
    _seen_at.update({(alias, key): clock for key in found})
    return found


def _read(alias: str, limits: Collection[Limit], now: datetime) -> dict[str, LimitRecord]:
    """The limits' rows, by key, created on first use; read, not locked."""
    rows = LimitRecord.objects.using(alias)
    found = {row.key: row for row in rows.filter(key__in=[limit.key for limit in limits])}
    new = [limit for limit in limits if limit.key not in found]
    if new:
        _create(alias, new, now)
        found.update({row.key: row for row in rows.filter(key__in=[lm.key for lm in new])})
    return found


def _create(alias: str, limits: Iterable[Limit], now: datetime) -> None:
    """Write the rows of limits used for the first time: a full bucket each (another
    claim writing one at the same moment wins, and its row is used)."""
    LimitRecord.objects.using(alias).bulk_create(
        [LimitRecord(key=lm.key, tokens=lm.burst, refilled_at=now) for lm in limits],
        ignore_conflicts=True,
    )


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
    found = (row.tokens, row.refilled_at, row.paused_until)
    if row.paused_until is not None and row.paused_until > now:
        return Grant(limit, 0, row.tokens, row.refilled_at, found), math.inf
    rows, tokens, wait = math.inf, row.tokens, math.inf
    if limit.rate is not None:
        elapsed = max(0.0, (now - row.refilled_at).total_seconds())
        tokens = min(limit.burst, row.tokens + elapsed * limit.rate)
        rows = math.floor(tokens) if tokens >= limit.gather else 0
        if rows < 1:
            wait = (limit.gather - tokens) / limit.rate
    if limit.concurrency is not None:
        rows = min(rows, max(0, limit.concurrency - running))
    return Grant(limit, int(min(rows, 1_000_000)), tokens, refilled_at, found), wait


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


# Spend a bucket only if it is as the claim read it, and no other statement holds it
# (``spend_unlocked``): a compare-and-set in one statement, which never waits for a lock.
_SPEND_FOUND = """
UPDATE django_domain_events_limit SET tokens = %s, refilled_at = %s
WHERE key = (
    SELECT key FROM django_domain_events_limit
    WHERE key = %s AND tokens = %s AND refilled_at = %s
        AND paused_until IS NOT DISTINCT FROM %s::timestamptz
    FOR UPDATE SKIP LOCKED
)
"""


def spend_unlocked(
    alias: str, grants: Iterable[Grant], taken: Mapping[str, int], now: datetime
) -> bool:
    """Spend the rows claimed from each rate as ``spend`` does, without the claim having
    locked them: each bucket by compare-and-set against what the claim read. False when
    any was changed or is held by another claim since (nothing is then spent, and the
    caller hands its rows back); that rate is left alone as one found held.

    Several buckets are spent in one transaction, so a claim spends all or none.
    """
    global _next_token
    spent = [g for g in grants if g.limit.rate is not None and taken.get(g.limit.key, 0)]
    if not spent:
        return True
    left = {g.limit.key: max(0.0, g.tokens - taken[g.limit.key]) for g in spent}
    several = len(spent) > 1  # one bucket is one statement, all or nothing by itself
    together = transaction.atomic(using=alias) if several else nullcontext()
    with together, connections[alias].cursor() as cursor:
        for grant in spent:
            key = grant.limit.key
            cursor.execute(_SPEND_FOUND, [left[key], grant.refilled_at, key, *grant.found])
            if cursor.rowcount != 1:
                wait = _held_elsewhere(alias, grant.limit, now)
                _next_token = min(_next_token, time.monotonic() + wait)
                if several:
                    transaction.set_rollback(True, using=alias)
                return False
    for grant in spent:
        _spent_until(alias, grant, left[grant.limit.key])
    return True


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
    """Stop every relay claiming the rows of limit ``key`` until ``until`` (a RetryAfter)."""
    LimitRecord.objects.using(alias).bulk_create(
        [LimitRecord(key=key, tokens=0.0, refilled_at=now)], ignore_conflicts=True
    )
    LimitRecord.objects.using(alias).filter(key=key).update(paused_until=until)


def seconds_to_token() -> float | None:
    """Seconds until the rate this process last found empty can be granted again (None:
    no wait)."""
    left = _next_token - time.monotonic()
    return left if 0 < left < math.inf else None
