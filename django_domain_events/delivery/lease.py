"""How long a worker holds a row: stamped by the claim, renewed before each run, kept
alive while the receiver runs.

A lease is ``lease_seconds`` (the receiver's, else ``LEASE_SECONDS``) with 10% headroom.
A batch is claimed under one lease, but its rows run one after another, so before each
row runs its lease is renewed by compare-and-set on the claim, unless nearly all of it
is still ahead. A row whose renewal finds the claim gone was taken over by another
worker after its lease lapsed, and is skipped: a relay never runs a row it lost.

While a receiver runs, a heartbeat thread renews its row's lease every third of the
lease on a connection of its own, for at most ``RUN_LIMIT_SECONDS``. So the lease bounds
how long the rows of a *dead* relay wait before another takes them over, not how long a
receiver may run; a receiver hung past the limit lets its lease lapse and the row is
taken over (and charged) like a dead worker's. SQLite has one relay and no heartbeat.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import clock, conf
from ..declare import RegisteredReceiver, registry
from .claim import compare_and_set, lane_keys
from .claim_rows import Claim

logger = logging.getLogger("django_domain_events.delivery")

HEADROOM = 1.1  # a lease is lease_seconds plus 10%, so a run of exactly that fits
RENEW_BELOW = 0.9  # renew before a run unless this share of the lease is still ahead


def with_headroom(seconds: float) -> timedelta:
    """The lease stamped for ``seconds`` of work."""
    return timedelta(seconds=seconds * HEADROOM)


def receiver_lease(receiver: RegisteredReceiver) -> timedelta:
    """The lease one row of ``receiver`` runs under."""
    return with_headroom(receiver.lease_seconds or conf.get().LEASE_SECONDS)


def lane_lease(lane: str | None) -> timedelta:
    """The lease a claim in ``lane`` stamps: its receivers' common ``lease_seconds``, else
    ``LEASE_SECONDS``, never longer than ``LEASE_SECONDS``; each row's own lease is
    stamped when it runs (``renew``)."""
    default = conf.get().LEASE_SECONDS
    only = lane_keys(lane)
    receivers = [r for r in registry.receivers if r.durable and (only is None or r.key in only)]
    declared = {r.lease_seconds or default for r in receivers}
    seconds = declared.pop() if len(declared) == 1 else default
    return with_headroom(min(seconds, default))


def renew(alias: str, claim: Claim, lease: timedelta) -> Claim | None:
    """``claim`` with its lease running ``lease`` from now, or None when the row was lost.

    Costs a query only when less than 90% of ``lease`` is left, so a batch of quick
    receivers renews nothing.
    """
    now = clock.now()
    if claim.lease_expires_at - now >= lease * RENEW_BELOW:
        return claim
    until = now + lease
    if not compare_and_set(alias, claim, {"lease_expires_at": until, "available_at": until}):
        return None
    return replace(claim, lease_expires_at=until)


def heartbeat_timeout() -> float:
    """How long the heartbeat waits on the database, in seconds: a third of the lease (a
    beat), within 2 to 30."""
    return min(30.0, max(2.0, conf.get().LEASE_SECONDS / 3))


def bounded_connection(alias: str, seconds: float) -> BaseDatabaseWrapper:
    """A new connection to ``alias`` whose connect and statements give up after
    ``seconds``: client-side timeouts, so a socket that no longer answers fails too."""
    connection = connections.create_connection(alias)
    settings = dict(connection.settings_dict)
    options = dict(settings.get("OPTIONS") or {})
    options.pop("pool", None)  # one connection of its own, outside any pool
    whole = max(1, math.ceil(seconds))
    if connection.vendor == "postgresql":
        options.setdefault("connect_timeout", max(2, whole))
        options.setdefault("tcp_user_timeout", int(seconds * 1000))  # unacknowledged sends
        options.setdefault("keepalives", 1)
        options.setdefault("keepalives_idle", whole)
        options.setdefault("keepalives_interval", 1)
        options.setdefault("keepalives_count", 1)
    elif connection.vendor == "mysql":
        options.setdefault("connect_timeout", whole)
        options.setdefault("read_timeout", whole)
        options.setdefault("write_timeout", whole)
    settings["OPTIONS"] = options
    settings["CONN_MAX_AGE"] = None  # the heartbeat closes it when idle
    return type(connection)(settings, alias)


def _statement_timeout(connection: BaseDatabaseWrapper, seconds: float) -> None:
    """Bound each statement on the server too: a renewal that waits on a lock gives up."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = %s", [int(seconds * 1000)])


@contextlib.contextmanager
def kept_alive(alias: str, claim: Claim, lease: timedelta) -> Iterator[None]:
    """Renew ``claim``'s lease from the heartbeat thread while the block runs."""
    if connections[alias].vendor == "sqlite":
        yield
        return
    token = _heartbeat.keep(alias, claim, lease)
    try:
        yield
    finally:
        _heartbeat.drop(token)


@contextlib.contextmanager
def kept_alive_together(
    alias: str, rows: Sequence[tuple[Claim, timedelta]]
) -> Iterator[Callable[[int], None]]:
    """Renew the leases of every row of a group run in one transaction while the block
    runs, not only the running row's: a group longer than a lease keeps all of its rows.
    Yields ``let_go(claim_id)``, for a row whose outcome is written before the commit."""
    if connections[alias].vendor == "sqlite":
        yield lambda claim_id: None
        return
    tokens = {claim.id: _heartbeat.keep(alias, claim, lease) for claim, lease in rows}

    def let_go(claim_id: int) -> None:
        token = tokens.pop(claim_id, None)
        if token is not None:
            _heartbeat.drop(token)

    try:
        yield let_go
    finally:
        for token in tokens.values():
            _heartbeat.drop(token)


@dataclass
class _Kept:
    alias: str
    claim: Claim
    lease: timedelta
    renew_at: float  # monotonic
    give_up_at: float  # monotonic: RUN_LIMIT_SECONDS after the run began


class _Heartbeat:
    """One daemon thread per process that renews the leases of running receivers' rows.

    It wakes only when a renewal is due (every third of a lease), so a receiver that
    finishes within a third of its lease costs a lock and two dict operations; it holds
    a database connection only while it has rows to keep.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._kept: dict[int, _Kept] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def keep(self, alias: str, claim: Claim, lease: timedelta) -> int:
        started = time.monotonic()
        entry = _Kept(
            alias,
            claim,
            lease,
            renew_at=started + lease.total_seconds() / 3,
            give_up_at=started + conf.get().RUN_LIMIT_SECONDS,
        )
        with self._condition:
            token = next(self._tokens)
            self._kept[token] = entry
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django_domain_events heartbeat", daemon=True
                )
                self._thread.start()
            elif entry.renew_at < self._wake_at:
                self._condition.notify()
        return token

    def drop(self, token: int) -> None:
        with self._condition:
            self._kept.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._condition:
                now = time.monotonic()
                self._wake_at = min((k.renew_at for k in self._kept.values()), default=now + 1.0)
                self._condition.wait(timeout=max(0.0, self._wake_at - now))
                now = time.monotonic()
                due = [(t, k) for t, k in self._kept.items() if k.renew_at <= now]
                idle = not self._kept
            for token, entry in due:
                self._renew(token, entry, now)
            if idle:
                for alias in connections:
                    with contextlib.suppress(Exception):
                        connections[alias].close()

    def _renew(self, token: int, entry: _Kept, now: float) -> None:
        if now >= entry.give_up_at:
            logger.warning(
                "Delivery %s to %s has run longer than RUN_LIMIT_SECONDS (%ss): its lease is "
                "no longer renewed and lapses at the latest in %ss, after which another relay "
                "may take the row over. Find what the receiver waits on, or raise the limit.",
                entry.claim.id,
                entry.claim.receiver_key,
                conf.get().RUN_LIMIT_SECONDS,
                round(entry.lease.total_seconds()),
            )
            self.drop(token)
            return
        try:
            self._connect(entry.alias)
            held = renew(entry.alias, entry.claim, entry.lease)
        except Exception as error:  # an outage, a timeout: try again at the next beat
            logger.warning(
                "Could not renew the lease of delivery %s (%s); trying again.",
                entry.claim.id,
                error,
            )
            with contextlib.suppress(Exception):
                connections[entry.alias].close()
            held = entry.claim
        with self._condition:
            if token not in self._kept:
                return
            if held is None:  # taken over: the run's outcome will not be recorded
                del self._kept[token]
                return
            entry.claim = held
            entry.renew_at = now + entry.lease.total_seconds() / 3

    @staticmethod
    def _connect(alias: str) -> None:
        """Give this thread a bounded connection to ``alias`` (``bounded_connection``)."""
        current = connections[alias]
        if current.connection is not None and getattr(current, "_dde_bounded", False):
            return
        seconds = heartbeat_timeout()
        bounded = bounded_connection(alias, seconds)
        bounded._dde_bounded = True  # type: ignore[attr-defined]
        connections[alias] = bounded
        with contextlib.suppress(Exception):
            current.close()
        bounded.ensure_connection()
        _statement_timeout(bounded, seconds)


_heartbeat = _Heartbeat()
