"""Claims held by row locks: a batch settled inside the transaction that took it.

For receivers that deliver many rows at once and learn, for each, whether it arrived: a
broker publish (``contrib.brokers``), acknowledged on the broker's confirm. On
PostgreSQL a relay takes their owed rows with ``FOR UPDATE SKIP LOCKED`` in a
transaction of a connection of its own, writing nothing; once the batch is sent and
confirmed, one ``UPDATE`` records the confirmed rows succeeded, the others are stamped
claimed as the usual claim (``claim.py``) would have, and one commit ends it; those
others are then settled the usual way (a refusal is a failed attempt, an outage hands
the row back). A published row is written once where the usual claim writes it twice,
and a claim moves a row between the partial indexes of owed and claimed rows (about
seven index entries a row): the relay's database work per published row halves.

A relay killed meanwhile leaves nothing claimed: its transaction ends with its
connection, the rows are owed again at once, uncharged, and another relay sends them
again under the same message id. A relay that hangs holding them is cut off by
PostgreSQL once its transaction has idled for ``LEASE_SECONDS``
(``idle_in_transaction_session_timeout``), as a lease would lapse; back, it records
what the broker confirmed where no one has taken the row since, and hands back the rest
(``LockedBatch.settle``): a lapse, never an error that stops it. Cut in the middle of
locking a batch, nothing was sent from it: it is locked again on a new connection
(``LockedClaims.take``).

Two connections take turns: while one batch's confirms are outstanding, the lane's
next batch is locked on the other, and sent once the first is settled, so one relay
still sends in order.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, transaction

from .. import clock, conf, priority, tally
from ..declare import registry
from ..models import STATUS_SQL, DeliveryRecord, DeliveryStatus, database_alias
from . import limits
from .claim import lane_keys
from .claim_postgresql import lock_postgresql
from .claim_rows import Claim, ClaimArgs, table
from .outage import answers
from .report import report_success
from .run import attempt, has_expired, has_spent_attempts

# One row's result, as ``passes.Result``: its status and outcome, or None when it was
# handed back (a broker outage).
Result = tuple[DeliveryStatus | None, Any] | None

logger = logging.getLogger("django_domain_events.delivery")

#: What a sent batch answers for each row: None when it arrived, else why not.
Outcomes = dict[int, BaseException | None]


class NotSent(Exception):
    """A row ``prepare_batch`` left unsent (its event cannot be read here): it runs the
    usual way once claimed, where what is wrong with it is recorded."""


def lockable_keys(lane: str | None) -> tuple[str, ...]:
    """The receivers of ``lane`` whose rows are claimed by row lock: those whose function
    prepares batches (``prepare_batch``), neither ordered nor limited (their claims take
    other rows into account), on PostgreSQL; empty elsewhere."""
    if connections[database_alias()].vendor != "postgresql":
        return ()
    keys = lane_keys(lane)
    candidates = [
        r
        for r in registry.receivers
        if r.durable
        and (keys is None or r.key in keys)
        and r.ordered_by is None
        and callable(getattr(r.func, "prepare_batch", None))
    ]
    held = {key for lm in limits.declared([r.key for r in candidates]) for key in lm.members}
    return tuple(sorted(r.key for r in candidates if r.key not in held))


class LockedClaims:
    """The two connections a pass locks batches on, opened on first use, each in a
    transaction from a batch's claim to its commit."""

    def __init__(self) -> None:
        self._connections: list[Any] = []

    def take(
        self,
        turn: int,
        *,
        worker_id: str,
        keys: Sequence[str],
        now: datetime,
        lease: timedelta,
        limit: int,
        exclude: Collection[int],
        ignore_backoff: bool,
    ) -> LockedBatch:
        """Lock up to ``limit`` owed rows of ``keys`` on the connection of ``turn``; once
        more on a new connection if the server had cut that one (``_lock_again``)."""
        args = ClaimArgs(
            worker_id,
            now,
            now + lease,
            limit,
            tuple(keys),
            None,
            tuple(exclude),
            None,
            ignore_backoff,
        )
        try:
            try:
                connection = self._connection(turn)
                claims = lock_postgresql(connection, args)
            except (DatabaseError, InterfaceError) as error:
                connection, claims = self._lock_again(turn, args, error)
        except BaseException:
            self.give_back()
            raise
        return LockedBatch(connection, claims, args)

    def _lock_again(
        self, turn: int, args: ClaimArgs, error: DatabaseError | InterfaceError
    ) -> tuple[Any, list[Claim]]:
        """The lock failed: if the server had cut the connection of ``turn`` while it
        waited between batches (PostgreSQL ends one whose transaction idles past
        ``LEASE_SECONDS``, as when the relay is paused mid-claim), that lock lapsed with
        nothing sent from it, so it is taken again on a new connection; the batch on its
        way on the other connection is not touched. Raises ``error`` if the connection
        is not cut, and whatever the new connection raises (an outage then)."""
        connection = self._connections[turn % 2] if len(self._connections) == 2 else None
        if connection is None or not _cut(connection):
            raise error
        with contextlib.suppress(Exception):
            connection.close()
        logger.warning(
            "Relay %s: the connection locking its next batch was cut before the lock "
            "answered (%s: %s), so that lock lapsed and nothing was sent from it: "
            "PostgreSQL ends a transaction that idles past LEASE_SECONDS (the relay was "
            "paused or starved of CPU mid-claim), and a DBA or a proxy may end a "
            "connection. Locking the batch again on a new connection.",
            args.worker_id,
            type(error).__name__,
            " ".join(str(error).split()),  # psycopg's messages span lines
            extra={"worker_id": args.worker_id},
        )
        connection = self._connection(turn)
        return connection, lock_postgresql(connection, args)

    def give_back(self) -> None:
        """End every open transaction: the rows they lock are owed again, uncharged. A
        connection that cannot is closed (the next batch opens a new one)."""
        for connection in self._connections:
            try:
                connection.rollback()
            except Exception:
                with contextlib.suppress(Exception):
                    connection.close()

    def close(self) -> None:
        """Close both connections (their transactions end with them)."""
        for connection in self._connections:
            with contextlib.suppress(Exception):
                connection.close()
        self._connections = []

    def _connection(self, turn: int) -> Any:
        alias = database_alias()
        while len(self._connections) < 2:
            self._connections.append(connections.create_connection(alias))
        connection = self._connections[turn % 2]
        if connection.connection is None:  # first use, or closed by ``give_back``
            connection.set_autocommit(False)
            timeout = int(conf.get().LEASE_SECONDS * 1000)
            with connection.cursor() as cursor:
                cursor.execute(f"SET idle_in_transaction_session_timeout = {timeout}")
            connection.commit()
        return connection


@dataclass
class LockedBatch:
    """A batch of rows locked by the open transaction of ``connection``."""

    connection: Any
    claims: list[Claim]
    args: ClaimArgs
    # Each batch group's messages once built (``prepare``), and the rows not to send.
    _prepared: list[Any] | None = field(default=None, init=False)
    _unsent: Outcomes = field(default_factory=dict, init=False)

    def prepare(self) -> None:
        """Build the messages of every row that may be sent (``send`` builds them if not
        done yet): the relay builds a batch's while the one before is on its way."""
        self._unsent = {}
        groups: dict[object, tuple[Any, list[Claim]]] = {}
        tallied_from = tally.horizon()
        for claim in self.claims:
            receiver = registry.receiver(claim.receiver_key)
            func: Any = receiver.func if receiver is not None else None
            sends = func is not None and callable(getattr(func, "prepare_batch", None))
            if not sends or not _sendable(claim, self.args.now, tallied_from):
                self._unsent[claim.id] = NotSent()
            else:
                groups.setdefault(func.batch_group, (func, []))[1].append(claim)
        self._prepared = [func.prepare_batch(claims) for func, claims in groups.values()]

    def send(self) -> Callable[[], Outcomes]:
        """Start sending every row that may be sent; returns what waits for the outcomes."""
        if self._prepared is None:
            self.prepare()
        outcomes: Outcomes = dict(self._unsent)
        waits = [prepared.send() for prepared in self._prepared or ()]

        def wait() -> Outcomes:
            for waiting in waits:
                outcomes.update(waiting())
            return outcomes

        return wait

    def settle(self, outcomes: Outcomes, in_hand: list[Claim]) -> list[Result]:
        """Commit the confirmed rows succeeded and the others claimed, then settle those
        the usual way, keeping them in ``in_hand`` meanwhile (what a relay hands back if
        that fails); one result per row, in order."""
        confirmed = [claim for claim in self.claims if outcomes[claim.id] is None]
        others = [claim for claim in self.claims if outcomes[claim.id] is not None]
        try:
            with self.connection.cursor() as cursor:
                if confirmed:
                    cursor.execute(*self._succeeded_sql(confirmed))
                if others:
                    cursor.execute(*self._claimed_sql(others))
            self.connection.commit()
        except (DatabaseError, InterfaceError) as error:
            if answers(self.connection):  # the statement failed, the locks live on
                raise
            return self._settle_lapsed(confirmed, error)
        in_hand.extend(others)
        results: dict[int, Result] = {}
        for claim in confirmed:
            report_success(claim)
            results[claim.id] = (DeliveryStatus.SUCCEEDED, None)
        results.update(_settle_others(others, outcomes, self.args.now))
        return [results[claim.id] for claim in self.claims]

    def give_back(self) -> None:
        """End the transaction: the rows are owed again, uncharged."""
        try:
            self.connection.rollback()
        except Exception:
            with contextlib.suppress(Exception):
                self.connection.close()

    def _settle_lapsed(self, confirmed: Sequence[Claim], error: BaseException) -> list[Result]:
        """The transaction holding the batch ended before its commit (PostgreSQL cut it
        after ``LEASE_SECONDS`` idle, or its connection broke), as a lease lapses: every
        row is owed again, uncharged, and may already be another relay's. What the broker
        confirmed is recorded acknowledged where no one else has taken the row since
        (still owed, not locked), so it is not sent twice; the rest are handed back.
        Raises if the database cannot be reached (the relay rides out the outage)."""
        self.give_back()
        recorded: set[int] = set()
        if confirmed:
            outbox = connections[database_alias()]
            with transaction.atomic(using=outbox.alias), outbox.cursor() as cursor:
                cursor.execute(*self._succeeded_sql(confirmed, lapsed=True))
                recorded = {row[0] for row in cursor.fetchall()}
        logger.warning(
            "Relay %s: the lock on a batch of %s rows lapsed before it was recorded "
            "(%s: %s): PostgreSQL ends a transaction that idles past LEASE_SECONDS, and "
            "a lost connection or a failed acknowledgement ends it too. %s rows the "
            "broker confirmed are recorded acknowledged; the other %s are owed again, "
            "uncharged, and are sent again under the same message ids. Raise "
            "LEASE_SECONDS if the broker's confirms often take this long.",
            self.args.worker_id,
            len(self.claims),
            type(error).__name__,
            " ".join(str(error).split()),  # psycopg's messages span lines
            len(recorded),
            len(self.claims) - len(recorded),
            extra={"worker_id": self.args.worker_id},
        )
        results: list[Result] = []
        for claim in self.claims:
            if claim.id in recorded:
                report_success(claim)
                results.append((DeliveryStatus.SUCCEEDED, None))
            else:
                results.append(None)
        return results

    def _succeeded_sql(
        self, claims: Sequence[Claim], *, lapsed: bool = False
    ) -> tuple[str, list[Any]]:
        """Record ``claims`` acknowledged. Once their lock ``lapsed``, only the rows still
        owed and locked by no one (no other relay is sending them), returning their ids."""
        adapt = self.connection.ops.adapt_datetimefield_value
        done = adapt(clock.now())
        table = self._table()
        where = "id = ANY(%s)"
        if lapsed:
            where = (
                f"id IN (SELECT id FROM {table} WHERE id = ANY(%s) AND status = "
                f"{STATUS_SQL['pending']} FOR UPDATE SKIP LOCKED) RETURNING id"
            )
        sql = (
            f"UPDATE {table} SET status = {STATUS_SQL['succeeded']}, "
            "attempts = attempts + 1, completed_at = %s, succeeded_at = %s, "
            "claimed_by = %s, claimed_at = %s, lease_expires_at = NULL, last_error = '' "
            f"WHERE {where}"
        )
        args = self.args
        return sql, [done, done, args.worker_id, adapt(args.now), [c.id for c in claims]]

    def _claimed_sql(self, claims: Sequence[Claim]) -> tuple[str, list[Any]]:
        """Stamp ``claims`` as the usual claim would: held by this worker until the lease
        ends, each run alone (a lapse of it is its attempt)."""
        adapt = self.connection.ops.adapt_datetimefield_value
        args = self.args
        sql = (
            f"UPDATE {self._table()} SET status = {STATUS_SQL['claimed']}, "
            "claimed_by = %s, claimed_at = %s, lease_expires_at = %s, available_at = %s, "
            "claim_rank = %s - priority_credit, claim_position = 0 WHERE id = ANY(%s)"
        )
        end = adapt(args.lease_end)
        params = [args.worker_id, adapt(args.now), end, end, priority.rank(args.lease_end)]
        return sql, [*params, [c.id for c in claims]]

    def _table(self) -> str:
        return str(self.connection.ops.quote_name(table(DeliveryRecord)))


def _cut(connection: Any) -> bool:
    """Whether the server ended ``connection``, open until then (the driver found it
    closed), rather than refused a statement on it or never let it connect."""
    driver = connection.connection
    return driver is not None and bool(getattr(driver, "closed", False))


def _sendable(claim: Claim, now: datetime, tallied_from: datetime) -> bool:
    """Whether the row may be sent and acknowledged here: not past its lifetime or its
    attempts (the usual way dead-letters it), and no scheduled tally to change with it
    (due from ``tallied_from`` on, ``tally.horizon``: a claim made ahead of the clock)."""
    if has_expired(claim, now) or has_spent_attempts(claim):
        return False
    return not tally.is_tallied(claim.due_at, tallied_from)


def _settle_others(claims: Sequence[Claim], outcomes: Outcomes, now: datetime) -> dict[int, Result]:
    """Settle the rows not confirmed, now claimed: the unsent run the usual way
    (``deliver_batch``), the sent ones are settled by their function (``settle_unsent``)."""
    results: dict[int, Result] = {}
    by_func: dict[int, tuple[Any, list[Claim], list[Claim]]] = {}
    for claim in claims:
        receiver = registry.receiver(claim.receiver_key)
        func: Any = receiver.func if receiver is not None else None
        unsent, sent = by_func.setdefault(id(func), (func, [], []))[1:]
        (unsent if isinstance(outcomes[claim.id], NotSent) else sent).append(claim)
    for func, unsent, sent in by_func.values():
        if unsent:
            results.update(_run_usually(func, unsent, now))
        if sent:
            errors = [outcomes[claim.id] for claim in sent]
            settled = func.settle_unsent(sent, errors, now=now)
            results.update(zip([c.id for c in sent], settled, strict=True))
    return results


def _run_usually(func: Any, claims: Sequence[Claim], now: datetime) -> dict[int, Result]:
    """Claimed rows run as any claimed batch is; a row whose receiver is gone is settled
    by the usual checks (``run.attempt``)."""
    if func is not None and callable(getattr(func, "deliver_batch", None)):
        results = func.deliver_batch(claims, now=now)
        return dict(zip([c.id for c in claims], results, strict=True))
    return {claim.id: attempt(claim, now=now) for claim in claims}
