"""``publish()``: a durable delivery per event to a broker destination, and the relay's
side of it: a claimed batch sent with confirms outstanding, acknowledged in one commit.

A publish is a receiver (key ``brokers:<broker>:<to>[:<event name>]``) whose function is
a ``Publication``, so retries, lifetimes, dead letters, lanes, the admin, the signals
and the metrics apply unchanged. The relay hands a run of such rows of one broker to
``deliver_batch`` (the ``deliver_batch`` hook of ``delivery.passes``): every message is
sent, the confirms awaited, the confirmed rows acknowledged by one ``UPDATE``, a refused
message recorded as a failed attempt with the broker's reason, and the rows a broker
outage left unconfirmed handed back uncharged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import transaction

from ... import clock
from ...declare import AnyEvent, receiver, registry
from ...delivery.claim import release
from ...delivery.claim_rows import Claim, stored_payload
from ...delivery.locked import NotSent
from ...delivery.outcomes import DeliveryContext
from ...delivery.run import (
    Admitted,
    Ready,
    acknowledge,
    acknowledge_all,
    acknowledge_held,
    admit,
    prepare,
    read_event,
    record_failure,
    report_success,
    warn_lease_lost,
)
from ...models import DeliveryRecord, DeliveryStatus, database_alias
from . import envelope
from .config import broker as broker_config
from .config import destination_problem, event_source
from .links import link
from .transport import BrokerDown, Outgoing

Result = tuple[DeliveryStatus | None, Any] | None

# receiver options a publish decides itself
_NOT_OPTIONS = ("mode", "takes_context", "targets", "ack", "site")


@dataclass(frozen=True)
class Publication:
    """What one ``publish()`` declared: the broker, the destination and the key."""

    broker: str
    to: str
    key: Callable[[Any], Any] | None = None

    @property
    def batch_group(self) -> str:
        """Rows of one broker are sent together (see ``delivery.passes``)."""
        return self.broker

    def __call__(self, evt: Any, ctx: DeliveryContext) -> None:
        """One row run by ``attempt()`` outside any batch: send it, await the confirm.
        Relays and ``deliver_one`` go through ``deliver_batch`` instead, where a broker
        outage hands the row back uncharged; here it would be a failed attempt."""
        record = DeliveryRecord.objects.using(database_alias()).select_related("event")
        delivery = record.defer("event__payload").get(pk=int(ctx.delivery_id or 0))
        event = delivery.event
        row = Row(
            id=delivery.pk,
            event_id=event.pk,
            event_name=event.name,
            event_version=event.version,
            occurred_at=event.occurred_at,
            correlation_id=event.correlation_id,
            causation_id=event.causation_id,
            trace_context=event.trace_context,
            expires_at=delivery.expires_at,
        )
        message = Outgoing(self.to, make_envelope(self, evt, row))
        (result,) = link(self.broker).send([message])
        if result is not None:
            raise result

    def deliver_batch(
        self,
        claims: Sequence[Claim],
        *,
        now: datetime,
        meanwhile: Callable[[], object] | None = None,
    ) -> list[Result]:
        """Publish ``claims`` (rows of this broker) together, running ``meanwhile()``
        while their confirms are outstanding; see the module docstring."""
        return deliver_batch(self.broker, claims, now=now, meanwhile=meanwhile)

    def prepare_batch(self, claims: Sequence[Claim]) -> PreparedBatch:
        """The messages of ``claims`` (rows of this broker held by row locks,
        ``delivery.locked``), built to be sent with confirms outstanding."""
        return prepare_batch(self.broker, claims)

    def settle_unsent(
        self, claims: Sequence[Claim], errors: Sequence[BaseException], *, now: datetime
    ) -> list[Result]:
        """Settle rows sent by ``prepare_batch`` and not confirmed, now claimed: an outage's
        handed back uncharged, the others failed attempts with their reasons."""
        rows = [
            (claim, registry.receiver(claim.receiver_key), error)
            for claim, error in zip(claims, errors, strict=True)
        ]
        results = _unconfirmed(rows, now)
        return [results[claim.id] for claim in claims]


def publish(
    event_cls: type,
    *,
    to: str,
    broker: str = "default",
    key: Callable[[Any], Any] | None = None,
    **receiver_options: Any,
) -> Publication:
    """Publish every ``event_cls`` event (or every event: ``AnyEvent``) to ``to`` on the
    broker ``broker``, as a durable delivery acknowledged on the broker's confirm.

    ``key(evt)`` gives the message's partition key (``partitionkey``); the receiver
    options (``lane``, ``retry``, ``ttl``, ``max_attempts``...) apply to the delivery.
    """
    config = broker_config(broker)
    problem = destination_problem(config.transport, to)
    if problem:
        raise ValueError(f"publish({_name(event_cls)}, {problem[:-1]} on broker {broker!r}.")
    if key is not None and not callable(key):
        raise TypeError(
            f"publish({_name(event_cls)}, key=) must be a function of the event returning "
            f"the partition key, not {key!r}."
        )
    for option in _NOT_OPTIONS:
        if option in receiver_options:
            raise TypeError(
                f"publish() decides {option}= itself (one durable row per event and "
                "destination); drop it."
            )
    publication = Publication(broker, to, key)
    suffix = "" if event_cls is AnyEvent else f":{_name(event_cls)}"
    receiver(
        event_cls, key=f"brokers:{broker}:{to}{suffix}", takes_context=True, **receiver_options
    )(publication)
    return publication


def _name(event_cls: Any) -> str:
    if event_cls is AnyEvent:
        return "AnyEvent"
    registered = registry.event_for_class(event_cls) if isinstance(event_cls, type) else None
    return registered.name if registered is not None else repr(event_cls)


class MessageSource(Protocol):
    """What the message of one delivery row is made of: a ``Claim`` carries it all, a
    ``Row`` is read from the rows (the names are the claim's)."""

    @property
    def id(self) -> int: ...  # the delivery row's
    @property
    def event_id(self) -> int: ...
    @property
    def event_name(self) -> str: ...
    @property
    def event_version(self) -> int: ...
    @property
    def payload(self) -> str | dict[str, Any] | None: ...  # None: read from the event row
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def correlation_id(self) -> str: ...
    @property
    def causation_id(self) -> int | None: ...
    @property
    def trace_context(self) -> str: ...
    @property
    def expires_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class Row:
    """A ``MessageSource`` read from the rows: a publish run outside a relay's batch."""

    id: int
    event_id: int
    event_name: str
    event_version: int
    occurred_at: datetime
    correlation_id: str
    causation_id: int | None
    trace_context: str
    expires_at: datetime | None
    payload: None = None  # read by ``message_body``, as stored


def make_envelope(
    publication: Publication, evt: Any, row: MessageSource, source: str | None = None
) -> envelope.Envelope:
    """The CloudEvent of one delivery row; the id is ``<event id>.<delivery id>``, the
    same on every resend."""
    traceparent, tracestate = _trace(row.trace_context)
    key = publication.key(evt) if publication.key is not None else None
    return envelope.build(
        id=f"{row.event_id}.{row.id}",
        source=source if source is not None else event_source(),
        type=row.event_name,
        data=message_body(row),
        time=row.occurred_at,
        payloadversion=row.event_version,
        correlationid=row.correlation_id,
        causationid=str(row.causation_id) if row.causation_id is not None else None,
        traceparent=traceparent,
        tracestate=tracestate,
        partitionkey=str(key) if key is not None else None,
        expirytime=row.expires_at,
    )


# The encoder of a payload a driver handed back parsed, made once: ``json.dumps`` with
# these options builds a new encoder at every call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def message_body(row: MessageSource) -> bytes:
    """The payload's JSON text as the event row stores it, UTF-8: sent as it is, not
    parsed and written again (a relay sends thousands a second; the wire format says a
    body's whitespace and key order are the database's)."""
    payload = row.payload if row.payload is not None else stored_payload(row.event_id)
    if isinstance(payload, str):
        return payload.encode()
    return _COMPACT_JSON.encode(payload).encode()


def _trace(stored: str) -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` from the trace context stored at fire."""
    if not stored:
        return None, None
    if not stored.startswith("{"):
        return stored, None
    try:
        carrier = json.loads(stored)
    except ValueError:
        return None, None
    return carrier.get("traceparent"), carrier.get("tracestate")


def deliver_batch(
    broker: str,
    claims: Sequence[Claim],
    *,
    now: datetime,
    meanwhile: Callable[[], object] | None = None,
) -> list[Result]:
    """Send every row, run ``meanwhile()`` while the confirms are outstanding, await them,
    acknowledge the confirmed rows in one commit.

    The message body is the stored payload and the claim carries every attribute, so a
    row's event is decoded only when its publish has a ``key=`` to call; a batch costs the
    same few queries whatever its size.
    """
    alias = database_alias()
    results: dict[int, Result] = {}
    decoded: dict[int, Any] = {}
    ready: list[Ready | Admitted] = []
    for claim in claims:
        prepared = _admit(alias, claim, now, decoded)
        if isinstance(prepared, Ready | Admitted):
            ready.append(prepared)
        else:
            results[claim.id] = prepared
    messages: list[tuple[Ready | Admitted, Outgoing]] = []
    source = event_source()
    for row in ready:
        publication: Any = row.receiver.func
        try:
            env = _claim_envelope(publication, row, source)
        except Exception as error:  # key= raised, or the payload is unreadable: this row
            results[row.claim.id] = record_failure(row.claim, row.receiver, error, now=now)
            continue
        messages.append((row, Outgoing(publication.to, env)))
    sending = link(broker).submit([message for _, message in messages])
    try:
        if meanwhile is not None:
            meanwhile()  # the relay claims its next batch while the confirms are outstanding
    finally:
        confirmations = sending.wait()
    results.update(_settle(alias, messages, confirmations, now))
    return [results[claim.id] for claim in claims]


def prepare_batch(broker: str, claims: Sequence[Claim]) -> PreparedBatch:
    """Build the message of every row of ``claims``, to be sent by ``PreparedBatch.send``.
    A row whose event cannot be read for its ``key=`` is ``NotSent`` (the usual run
    records why); one whose ``key=`` raised has that error as its outcome."""
    outcomes: dict[int, BaseException | None] = {}
    messages: list[tuple[Claim, Outgoing]] = []
    decoded: dict[int, Any] = {}
    source = event_source()
    for claim in claims:
        receiver = registry.receiver(claim.receiver_key)
        publication: Any = receiver.func if receiver is not None else None
        evt = None
        if publication.key is not None:
            try:
                evt, _ = read_event(claim, decoded)
            except Exception:
                outcomes[claim.id] = NotSent()
                continue
        try:
            env = make_envelope(publication, evt, claim, source)
        except Exception as error:  # key= raised: this row's failed attempt
            outcomes[claim.id] = error
            continue
        messages.append((claim, Outgoing(publication.to, env)))
    return PreparedBatch(broker, messages, outcomes)


@dataclass(frozen=True)
class PreparedBatch:
    """A batch's messages, built and not yet sent: a relay builds the next batch's while
    this one's confirms are outstanding (``delivery.locked``)."""

    broker: str
    messages: list[tuple[Claim, Outgoing]]
    outcomes: dict[int, BaseException | None]  # the rows not sent, and why

    def send(self) -> Callable[[], dict[int, BaseException | None]]:
        """Send every message with confirms outstanding; what it returns waits for them
        and answers each row's outcome: None when confirmed, else the error."""
        sending = link(self.broker).submit([message for _, message in self.messages])

        def wait() -> dict[int, BaseException | None]:
            confirmations = sending.wait()
            outcomes = dict(self.outcomes)
            for (claim, _), confirmation in zip(self.messages, confirmations, strict=True):
                outcomes[claim.id] = confirmation
            return outcomes

        return wait


class _Lost(Exception):
    """A confirmed row of the batch is no longer this claim's: acknowledge one by one."""


def _acknowledged(
    alias: str, confirmed: Sequence[Ready | Admitted]
) -> list[tuple[Ready | Admitted, bool]]:
    """Acknowledge the confirmed rows in one commit, and only those this claim still holds
    (one taken over meanwhile is the other worker's to settle): on PostgreSQL one
    statement that answers which; elsewhere one transaction, else each row on its own."""
    if not confirmed:
        return []
    held = acknowledge_held(alias, [row.claim for row in confirmed])
    if held is not None:
        return [(row, row.claim.id in held) for row in confirmed]
    try:
        with transaction.atomic(using=alias):
            if not acknowledge_all(alias, [row.claim for row in confirmed]):
                raise _Lost
        return [(row, True) for row in confirmed]
    except _Lost:
        return [(row, acknowledge(alias, row.claim)) for row in confirmed]


def _admit(
    alias: str, claim: Claim, now: datetime, decoded: dict[int, Any]
) -> Ready | Admitted | Result:
    """The row's checks and lease; its event decoded only for a ``key=`` to call."""
    receiver = registry.receiver(claim.receiver_key)
    func = receiver.func if receiver is not None else None
    if isinstance(func, Publication) and func.key is None:
        return admit(alias, claim, now)
    return prepare(alias, claim, now, decoded)


def _claim_envelope(publication: Publication, ready: Ready | Admitted, source: str) -> Any:
    return make_envelope(publication, getattr(ready, "evt", None), ready.claim, source)


def _settle(
    alias: str,
    messages: Sequence[tuple[Ready | Admitted, Outgoing]],
    confirmations: Sequence[BaseException | None],
    now: datetime,
) -> dict[int, Result]:
    """Acknowledge the confirmed rows together, hand back the outage's, fail the refused."""
    results: dict[int, Result] = {}
    confirmed = [row for (row, _), c in zip(messages, confirmations, strict=True) if c is None]
    for row, held in _acknowledged(alias, [row for row in confirmed]):
        if held:
            report_success(row.claim)
            results[row.claim.id] = (DeliveryStatus.SUCCEEDED, None)
        else:  # its lease lapsed and another worker holds it: that one settles it
            warn_lease_lost(row.claim, ran=True)
            results[row.claim.id] = (None, None)
    unconfirmed = [
        (row.claim, row.receiver, error)
        for (row, _), error in zip(messages, confirmations, strict=True)
        if error is not None
    ]
    results.update(_unconfirmed(unconfirmed, now))
    return results


def _unconfirmed(
    rows: Sequence[tuple[Claim, Any, BaseException]], now: datetime
) -> dict[int, Result]:
    """Rows sent and not confirmed: a broker outage's handed back uncharged, to be sent
    again once the broker may be back (``RETRY_CONNECT_SECONDS``); any other error is a
    failed attempt with the broker's reason."""
    results: dict[int, Result] = {}
    down = [claim for claim, _, error in rows if isinstance(error, BrokerDown)]
    if down:
        func: Any = registry.receiver(down[0].receiver_key).func  # type: ignore[union-attr]
        retry = timedelta(seconds=link(func.broker).config.retry_connect)
        release(down, now=clock.now() + retry)
        results.update({claim.id: None for claim in down})
    for claim, declared, error in rows:
        if not isinstance(error, BrokerDown):
            results[claim.id] = record_failure(claim, declared, error, now=now)
    return results
