"""One attempt at one claimed row, and the write that records how it ended.

A success commits the receiver's own writes and the acknowledgement together: for a
receiver that touches only this database, delivery is effectively once. Every write
here is a compare-and-set on the claim (``claimed_by``, ``claimed_at``), so a worker
whose lease lapsed cannot overwrite the row's new owner, and the lease is renewed
before the receiver runs, so a row lost meanwhile is not run at all.

Whatever a receiver raises becomes one recorded attempt; a row that cannot be read
becomes a dead letter. Only a configuration error (``ImproperlyConfigured``: a codec
or hook that cannot be imported) escapes, charging nothing, for the relay to stop on.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction
from django.utils.module_loading import import_string

from .. import clock, conf, tally, tracing
from ..codec import PayloadDecodeError, PayloadUpgradeFailed
from ..declare import RegisteredReceiver, registry
from ..models import STATUS_SQL, TERMINAL_VALUES, DeliveryRecord, DeliveryStatus, database_alias
from ..scope import caused_by
from . import limits
from .claim import compare_and_set, may_orphan, release
from .claim_rows import Claim, event_payload, parse_json
from .lease import kept_alive, receiver_lease, renew
from .loop import as_receiver_call
from .outage import Blame, blame, is_outage
from .outcomes import (
    DeliveryContext,
    Outcome,
    RetryAfter,
    decide,
    describe_error,
    expired_reason,
)
from .report import (
    Subject,
    Timing,
    log_fields,
    report_failure,
    report_success,
    report_unrun,
    warn_lease_lost,
)

logger = logging.getLogger("django_domain_events.delivery")


class _LeaseLost(Exception):
    """The acknowledgement found the row claimed by someone else: roll the attempt back."""


def call_receiver(receiver: RegisteredReceiver, evt: Any, ctx: DeliveryContext) -> None:
    """Call the receiver as declared, running an ``async def`` to completion.

    A plain function that returns an awaitable is refused with a ``TypeError`` (its work
    would silently never happen): a failed attempt for a durable row, an error elsewhere.
    """
    func: Callable[..., Any] = receiver.func
    if receiver.is_async:
        func = async_to_sync(as_receiver_call(receiver.key, func))
    result = func(evt, ctx) if receiver.takes_context else func(evt)
    refuse_awaitable(
        result,
        f"receiver {receiver.key}, a plain function,",
        "None; declare it with async def so that it is awaited",
    )


def refuse_awaitable(value: object, what: str, wanted: str) -> None:
    """A sync callable that returned an awaitable: closed unawaited, and refused."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # no "never awaited" warning on top of the error
        raise TypeError(
            f"{what} returned an awaitable, which nothing would await; return {wanted}."
        )


def call_hook(hook: Callable[..., Any], *args: Any) -> None:
    """Call an ``on_failure`` hook, sync or async; its exceptions are logged and swallowed."""
    try:
        if inspect.iscoroutinefunction(hook):
            async_to_sync(hook)(*args)
        else:
            hook(*args)
    except Exception:
        logger.exception("on_failure hook %r raised; ignored.", hook)


@functools.lru_cache(maxsize=8)
def around_hook(path: str) -> Callable[[DeliveryContext], Any]:
    """The ``AROUND_DELIVERY`` callable; ``ImproperlyConfigured`` when it cannot be imported."""
    try:
        hook = import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"{conf.SETTINGS_NAME}['AROUND_DELIVERY'] = {path!r} cannot be imported ({error}); "
            "point it at a function fn(ctx) that returns a context manager, or remove it."
        ) from error
    if not callable(hook):
        raise ImproperlyConfigured(
            f"{conf.SETTINGS_NAME}['AROUND_DELIVERY'] = {path!r} is not callable; point it at "
            "a function fn(ctx) that returns a context manager."
        )
    return hook


@contextlib.contextmanager
def _around(hook: Callable[[DeliveryContext], Any], ctx: DeliveryContext) -> Iterator[None]:
    with hook(ctx):
        yield


def around_delivery(ctx: DeliveryContext) -> contextlib.AbstractContextManager[None]:
    """``AROUND_DELIVERY(ctx)`` when configured; raising on entry fails the attempt."""
    path = conf.get().AROUND_DELIVERY
    return contextlib.nullcontext() if path is None else _around(around_hook(path), ctx)


def acknowledge(alias: str, claim: Claim) -> bool:
    """Record ``claim``'s success, in the transaction of its receiver's writes."""
    done = clock.now()
    return _update_claimed(
        alias,
        claim,
        {
            "status": DeliveryStatus.SUCCEEDED.value,
            "attempts": 1,
            "completed_at": done,
            "succeeded_at": done,
            "lease_expires_at": None,
            "last_error": "",
        },
    )


def acknowledge_all(alias: str, claims: Sequence[Claim]) -> bool:
    """Record the success of every row of ``claims`` (rows of one claim) with one
    compare-and-set ``UPDATE``, in the caller's transaction; False when a row was lost
    to another worker. For deliveries settled together: ``ack="batch"`` groups, and a
    batch of publishes once the broker confirmed it (``contrib.brokers``)."""
    connection = connections[alias]
    sql, params = _acknowledge_sql(alias, claims)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        written = cursor.rowcount
    tally.record(alias, left=[(c.receiver_key, c.due_at) for c in claims])
    return bool(written == len(claims))


def acknowledge_held(alias: str, claims: Sequence[Claim]) -> set[int] | None:
    """Record the success of the rows of ``claims`` (rows of one claim) this claim still
    holds, in one statement that commits on its own; the ids it acknowledged. One round
    trip where a transaction takes three (``BEGIN``, the ``UPDATE``, ``COMMIT``): for a
    relay publishing batches, as much as the statement itself. None where this cannot be
    done alone (not PostgreSQL, not in autocommit: inside a transaction, or a row due in
    a later hour whose tally must change with it): the caller uses ``acknowledge_all``."""
    connection = connections[alias]
    if connection.vendor != "postgresql" or not connection.get_autocommit():
        return None
    if tally.deltas(left=[(c.receiver_key, c.due_at) for c in claims]):
        return None
    sql, params = _acknowledge_sql(alias, claims)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING id", params)
        return {row[0] for row in cursor.fetchall()}


def _acknowledge_sql(alias: str, claims: Sequence[Claim]) -> tuple[str, list[Any]]:
    """The compare-and-set ``UPDATE`` recording the success of ``claims``; on PostgreSQL
    the ids are one array parameter (a short statement, parsed once)."""
    first = claims[0]
    connection = connections[alias]
    quote, adapt = connection.ops.quote_name, connection.ops.adapt_datetimefield_value
    done = clock.now()
    ids: list[Any] = [claim.id for claim in claims]
    if connection.vendor == "postgresql":
        among, ids = "= ANY(%s)", [ids]
    else:
        among = f"IN ({', '.join(['%s'] * len(ids))})"
    sql = (
        f"UPDATE {quote(DeliveryRecord._meta.db_table)} SET status = {STATUS_SQL['succeeded']}, "
        "attempts = attempts + 1, completed_at = %s, succeeded_at = %s, "
        "lease_expires_at = NULL, last_error = '' "
        f"WHERE status = {STATUS_SQL['claimed']} AND claimed_by = %s AND claimed_at = %s "
        f"AND id {among}"
    )
    params = [adapt(done), adapt(done), first.claimed_by, adapt(first.claimed_at)]
    return sql, [*params, *ids]


def _update_claimed(alias: str, claim: Claim, assignments: dict[str, Any]) -> bool:
    """One ``UPDATE`` of the row, only while this claim still holds it.

    A row due in a later hour that settles or moves (``NotYet``) also changes the
    scheduled tally, in the same transaction; the usual row, due already, does not.
    """
    changes = _tally_changes(claim, assignments)
    if not changes:
        return compare_and_set(alias, claim, assignments)
    with transaction.atomic(using=alias, savepoint=False):
        written = compare_and_set(alias, claim, assignments)
        if written:
            tally.write(alias, changes)
    return written


def _tally_changes(claim: Claim, assignments: dict[str, Any]) -> tally.Deltas:
    moved_to: datetime | None = assignments.get("due_at")
    if moved_to is None and assignments.get("status") not in TERMINAL_VALUES:
        return tally.Deltas()
    entered = [(claim.receiver_key, moved_to)] if moved_to is not None else []
    return tally.deltas(entered=entered, left=[(claim.receiver_key, claim.due_at)])


def context_for(claim: Claim, scope: dict[str, Any]) -> DeliveryContext:
    return DeliveryContext(
        event_id=claim.event_id,
        event_name=claim.event_name,
        attempt=claim.attempts + 1,
        actor_key=claim.actor_key,
        actor_label=claim.actor_label,
        scope=scope,
        target=claim.target,
        delivery_id=claim.id,
        due_at=claim.due_at,
        receiver_key=claim.receiver_key,
        occurred_at=claim.occurred_at,
        correlation_id=claim.correlation_id,
        trace_context=claim.trace_context,
    )


@dataclass(frozen=True)
class Ready:
    """A claimed row about to run: its lease renewed, its event read."""

    claim: Claim
    receiver: RegisteredReceiver
    lease: timedelta
    evt: Any
    ctx: DeliveryContext


Attempted = tuple[DeliveryStatus | None, Outcome | None]


def prepare(
    alias: str, claim: Claim, now: datetime, decoded: dict[int, Any] | None = None
) -> Ready | Attempted:
    """Everything before the receiver runs: a row that cannot run is settled unrun, a row
    lost to another worker skipped (both answered as an attempt's result); the rest is
    ``Ready``, its lease renewed and its event decoded."""
    admitted = admit(alias, claim, now)
    if not isinstance(admitted, Admitted):
        return admitted
    held, receiver, lease = admitted.claim, admitted.receiver, admitted.lease
    try:
        evt, scope = read_event(held, decoded)
    except _UNREADABLE as error:  # a row that cannot become the event: dead, unrun
        reason = describe_error(error)
        if not isinstance(error, LookupError | PayloadDecodeError | PayloadUpgradeFailed):
            reason = f"the payload could not be decoded into {claim.event_name}: {reason}"
        return _settle_unrun(alias, held, DeliveryStatus.DEAD, reason, receiver)
    except ImproperlyConfigured:
        raise  # the codec cannot be loaded: nothing about this row is wrong
    except Exception as error:  # reading failed: an outage, else one failed attempt
        if isinstance(error, DatabaseError) and is_outage(error, alias):
            raise
        return record_failure(held, receiver, error, now=now)
    return Ready(held, receiver, lease, evt, context_for(held, scope))


@dataclass(frozen=True)
class Admitted:
    """A claimed row that may run: its receiver, and its lease renewed (not yet decoded)."""

    claim: Claim
    receiver: RegisteredReceiver
    lease: timedelta


def admit(alias: str, claim: Claim, now: datetime) -> Admitted | Attempted:
    """The checks before a row runs, without reading its event: a row that cannot run
    is settled unrun, a row lost to another worker skipped (both answered as an
    attempt's result). A publisher, which sends the stored payload, needs no more."""
    receiver = registry.receiver(claim.receiver_key)
    if receiver is None or not receiver.durable:
        if not may_orphan(claim.receiver_key, claim.due_at, now):
            return _leave_to_another_release(claim)
        return _settle_unrun(
            alias,
            claim,
            DeliveryStatus.ORPHANED,
            f"receiver {claim.receiver_key!r} is no longer registered as a durable receiver; "
            "restore it and replay the event, or leave the row as a record.",
            receiver=None,
        )
    if not receiver.accepts(claim.event_name):
        reason = f"receiver {claim.receiver_key!r} now listens to {receiver.event_name}, not "
        reason += f"{claim.event_name}; restore the key's receiver and replay, or leave the row."
        return _settle_unrun(alias, claim, DeliveryStatus.ORPHANED, reason, receiver=None)
    ended = settle_if_ended(alias, claim, receiver, now)
    if ended is not None:
        return ended
    lease = receiver_lease(receiver)
    held = renew(alias, claim, lease)
    if held is None:
        warn_lease_lost(claim, ran=False)
        return None, None
    return Admitted(held, receiver, lease)


# What a payload that cannot become its event raises: the JSON parse, the codec, the
# event's upgrade(), an event no longer declared or gone from the log. Permanent, so
# the row is dead at once; anything else (a database error while reading) is not.
_UNREADABLE = (
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    RecursionError,
    PayloadUpgradeFailed,
)


def prepare_all(
    alias: str, claims: Sequence[Claim], now: datetime, decoded: dict[int, Any] | None
) -> tuple[list[Ready], dict[int, Attempted]]:
    """``prepare`` each of ``claims``, for a run of rows settled together: the rows
    ready to run, in order, and the results of those that cannot, by delivery id."""
    ready: list[Ready] = []
    results: dict[int, Attempted] = {}
    for claim in claims:
        prepared = prepare(alias, claim, now, decoded)
        if isinstance(prepared, Ready):
            ready.append(prepared)
        else:
            results[claim.id] = prepared
    return ready, results


def _leave_to_another_release(claim: Claim) -> Attempted:
    """Hand back, unrun and uncharged, a row of a receiver this process does not declare,
    still inside ``ORPHAN_AFTER_SECONDS``: a relay of another release may run it."""
    release([claim])
    logger.info(
        "Delivery %s to %s: the receiver is not declared by this relay; left owed for a "
        "relay that declares it (orphaned after ORPHAN_AFTER_SECONDS).",
        claim.id,
        claim.receiver_key,
        extra=log_fields(claim),
    )
    return None, None


def settle_if_ended(
    alias: str, claim: Claim, receiver: RegisteredReceiver, now: datetime
) -> Attempted | None:
    """Dead-letter, unrun, a claimed row past its lifetime or whose attempts were all spent
    (the last ones by lapses); None for a row that may still run or be handed to a task."""
    if has_expired(claim, now):
        assert claim.expires_at is not None
        reason = expired_reason(receiver, claim.expires_at)
        return _settle_unrun(alias, claim, DeliveryStatus.DEAD, reason, receiver)
    if has_spent_attempts(claim):
        return _settle_unrun(alias, claim, DeliveryStatus.DEAD, _lapsed_reason(claim), receiver)
    return None


def has_expired(claim: Claim, now: datetime) -> bool:
    """Whether ``claim`` is past its lifetime at ``now``: it is dead-lettered unrun."""
    return claim.expires_at is not None and now >= claim.expires_at


def has_spent_attempts(claim: Claim) -> bool:
    """Whether every attempt of ``claim`` is spent (the last ones by lapses): it is
    dead-lettered unrun."""
    return claim.max_attempts is not None and claim.attempts >= claim.max_attempts


def attempt(claim: Claim, *, now: datetime, decoded: dict[int, Any] | None = None) -> Attempted:
    """Run ``claim``'s receiver once and record the outcome.

    ``now`` is the claim's clock (a test's ``now=``, or the real one); time written
    for the next attempt is measured from the later of it and the real clock. Returns
    the recorded status (None when the row was lost to another worker) and, for an
    attempt that did not succeed, the outcome, so the relay can honour a pause.
    ``decoded`` keeps the last event decoded, for the fan-out rows after it.
    """
    alias = database_alias()
    ready = prepare(alias, claim, now, decoded)
    if not isinstance(ready, Ready):
        return ready
    claim, receiver = ready.claim, ready.receiver
    timing = Timing.start()
    hook = around_delivery(ready.ctx)  # an unimportable hook escapes here, before anything
    failure: BaseException | None = None  # what the receiver (or the hook) raised
    try:
        with transaction.atomic(using=alias):
            try:
                with (
                    kept_alive(alias, claim, ready.lease),
                    tracing.attempt_span(ready.ctx),
                    hook,
                    caused_by(claim.event_id, claim.correlation_id),
                ):
                    call_receiver(receiver, ready.evt, ready.ctx)
            except BaseException as error:  # CancelledError, sys.exit(), KeyboardInterrupt too
                failure = error
                raise
            if not acknowledge(alias, claim):
                raise _LeaseLost
    except _LeaseLost:
        warn_lease_lost(claim, ran=True)
        return None, None
    except BaseException as error:
        if failure is None or blame(error, alias) is Blame.OUTBOX:
            # The acknowledgement itself failed, or the outbox's database went away under
            # the receiver: not the receiver's failure, and nothing is charged for it.
            raise
        result = record_failure(claim, receiver, failure, now=now, timing=timing.stop())
        stop_if_interrupted(failure)
        return result
    report_success(claim, timing.stop())
    return DeliveryStatus.SUCCEEDED, None


def stop_if_interrupted(error: BaseException) -> None:
    """Re-raise a ``KeyboardInterrupt`` that Ctrl-C may have sent, once its attempt is
    recorded: where Python's own SIGINT handler is in place (``deliver_pending`` in a
    shell), it may be the user's; a relay handles SIGINT itself, so there one raised
    inside a receiver is the receiver's, and only its attempt."""
    if isinstance(error, KeyboardInterrupt) and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        raise error


def read_event(claim: Claim, decoded: dict[int, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The claim's event and scope, parsed from the stored JSON."""
    scope = parse_json(claim.scope)
    if decoded is not None and claim.event_id in decoded:
        return decoded[claim.event_id], scope
    evt = registry.decode(claim.event_name, event_payload(claim), claim.event_version)
    if decoded is not None:
        decoded.clear()  # one event at a time: a batch of large payloads stays small
        decoded[claim.event_id] = evt
    return evt, scope


def _lapsed_reason(claim: Claim) -> str:
    """Why a row whose last attempt was lost to a lapsed lease is dead; keeps the error
    an earlier attempt recorded, if any."""
    reason = (
        f"the lease lapsed on attempt {claim.attempts} of {claim.max_attempts}: the worker "
        "died or outlived its lease. Raise lease_seconds= or find what kills the worker."
    )
    if claim.last_error:
        return f"{reason} The last recorded error: {claim.last_error}"
    return f"{reason} No attempt recorded an error."


def _settle_unrun(
    alias: str,
    claim: Claim,
    status: DeliveryStatus,
    reason: str,
    receiver: RegisteredReceiver | None,
) -> tuple[DeliveryStatus | None, Outcome | None]:
    """Settle a row without running its receiver (orphaned, expired, undecodable)."""
    outcome = Outcome(status=status, spent=False, last_error=reason)
    written = _update_claimed(
        alias,
        claim,
        {
            "status": status.value,
            "last_error": reason,
            "completed_at": clock.now(),
            "lease_expires_at": None,
        },
    )
    if not written:
        warn_lease_lost(claim, ran=False)
        return None, None
    subject = Subject.of_claim(claim, attempt=claim.attempts)
    report_unrun(subject, status, reason)
    if status is DeliveryStatus.DEAD and receiver is not None and receiver.on_failure:
        call_hook(receiver.on_failure, subject.failure(status, RuntimeError(reason)))
    return status, outcome


def record_failure(
    claim: Claim,
    receiver: RegisteredReceiver,
    error: BaseException,
    *,
    now: datetime,
    timing: Timing | None = None,
) -> Attempted:
    """Record that ``error`` ended this attempt, as ``decide()`` rules; tell on_failure."""
    outcome, written = write_failure(claim, receiver, error, now=now)
    if not written:
        warn_lease_lost(claim, ran=True)
        return None, None
    if isinstance(error, RetryAfter):
        until = now + timedelta(seconds=error.seconds)
        for key in limits.paused_by(receiver.key):  # its own limit's and its group's
            limits.pause(database_alias(), key, until, now)  # for every relay
    tell_failure(claim, receiver, outcome, error, timing)
    return outcome.status, outcome


def write_failure(
    claim: Claim, receiver: RegisteredReceiver, error: BaseException, *, now: datetime
) -> tuple[Outcome, bool]:
    """Write the row's fate after ``error``; False when the claim no longer holds it."""
    moment = max(now, clock.now())
    outcome = decide(
        receiver,
        error,
        attempt=claim.attempts + 1,
        max_attempts=claim.max_attempts,
        due_at=claim.due_at,
        now=moment,
        expires_at=claim.expires_at,
    )
    for message in outcome.warnings:
        logger.warning(message)
    assignments: dict[str, Any] = {"status": outcome.status.value, "lease_expires_at": None}
    if outcome.spent:
        assignments["attempts"] = 1
    if outcome.status is DeliveryStatus.PENDING:  # NotYet: the work moved later
        assignments.update(
            available_at=outcome.available_at,
            due_at=outcome.due_at,
            expires_at=outcome.expires_at,
        )
    else:
        assignments["last_error"] = outcome.last_error
        if outcome.status is DeliveryStatus.DEAD:
            assignments["completed_at"] = clock.now()
        else:
            assignments["available_at"] = outcome.available_at
    return outcome, _update_claimed(database_alias(), claim, assignments)


def tell_failure(
    claim: Claim,
    receiver: RegisteredReceiver,
    outcome: Outcome,
    error: BaseException,
    timing: Timing | None = None,
) -> None:
    """Log a recorded failure and tell the receiver's ``on_failure``, once it is written."""
    if not outcome.tells_on_failure:
        return
    report_failure(claim, outcome.status, outcome.last_error, error, timing)
    if receiver.on_failure is not None:
        call_hook(receiver.on_failure, Subject.of_claim(claim).failure(outcome.status, error))


def expire_overdue(*, now: datetime | None = None, limit: int = 500) -> int:
    """Dead-letter owed rows past their lifetime that no claim has looked at yet.

    The relay runs this when idle, so a row nobody claims (its lane unserved, its backoff
    longer than its life) does not sit owed after it expired. Tells ``on_failure``.
    """
    moment = now if now is not None else clock.now()
    alias = database_alias()
    overdue = (
        DeliveryRecord.objects.using(alias)
        .filter(status__in=(DeliveryStatus.PENDING, DeliveryStatus.FAILED), expires_at__lte=moment)
        .select_related("event")
        .order_by("expires_at")[:limit]
    )
    expired = 0
    for row in overdue:
        receiver = registry.receiver(row.receiver_key)
        if row.expires_at is None:  # narrowed by the filter; keeps the type checker honest
            continue
        reason = expired_reason(receiver, row.expires_at)
        with transaction.atomic(using=alias):
            settled = (
                DeliveryRecord.objects.using(alias)
                .filter(pk=row.pk, status=row.status, expires_at=row.expires_at)
                .update(status=DeliveryStatus.DEAD, last_error=reason, completed_at=clock.now())
            )
            if settled:  # due in a later hour only when swept with a now= ahead of the clock
                tally.record(alias, left=[(row.receiver_key, row.due_at)])
        if not settled:
            continue
        expired += 1
        subject = Subject.of_row(row)
        report_unrun(subject, DeliveryStatus.DEAD, reason)
        if receiver is not None and receiver.on_failure is not None:
            call_hook(
                receiver.on_failure, subject.failure(DeliveryStatus.DEAD, RuntimeError(reason))
            )
    return expired
