"""The inbox: a message consumed from another service, recorded as a local event, once.

A transport (``contrib/brokers``) hands over ``Message`` values, attributes already read
from its headers; ``record_batch`` reads each one without touching the database (size,
attributes, type, version, payload) and then, in one transaction, records every good one
through ``fire()``'s own path (``firing.record_received``) with the message's source and
id as the event's dedupe key, and keeps every bad one as a ``DeadMessage``. The transport
acknowledges the batch only after that commit: a database error rolls the batch back and
reaches the transport, which then acknowledges nothing.

Seen again (redelivered, resent, replayed), a message finds its key taken and adds
nothing, for as long as its event row is kept (``retention``): the event row *is* the
inbox's memory, so the prune that deletes it also forgets the message.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.utils.dateparse import parse_datetime

from . import clock
from .codec import text_problem
from .declare import RegisteredEvent, registry
from .firing import Received, record_received, record_received_many
from .models import DeadMessage, database_alias

#: The outcomes ``record_batch`` counts.
RECORDED, DUPLICATE, DEAD, IGNORED = "recorded", "duplicate", "dead", "ignored"
#: The body size over which a message is kept dead rather than decoded, by default.
DEFAULT_MAX_BYTES = 1024 * 1024
_KEY_CHARS = 255
#: ``json.dumps``'s own encoder of a string with ``ensure_ascii=False`` (C where built).
_json_string = json.encoder.encode_basestring


@dataclass(frozen=True)
class Message:
    """One message as its transport received it.

    ``attributes`` are the CloudEvents attributes by name (``id``, ``source``, ``type``,
    ``time``, ``payloadversion``, ...), read from the transport's headers; ``headers``
    are those headers as received, kept on a dead entry with the raw ``body``.
    """

    attributes: Mapping[str, str]
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Subscription:
    """What ``subscribe()`` declared: which messages of ``source`` become which events.

    ``events`` maps a CloudEvents ``type`` to a local ``@event`` class; ``None`` takes
    every type that names a declared event. ``ttl`` is the lifetime of a message from
    its ``time`` (the earlier of it and the message's ``expirytime`` wins).
    """

    source: str
    broker: str
    name: str
    events: Mapping[str, type] | None = None
    ttl: timedelta | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    batch_size: int = 100
    options: Mapping[str, Any] = field(default_factory=dict)

    def event_for(self, ce_type: str) -> RegisteredEvent | None:
        """The declared event a message of ``ce_type`` is recorded as, or None."""
        if self.events is None:
            return registry.event_named(ce_type)
        cls = self.events.get(ce_type)
        return None if cls is None else registry.event_for_class(cls)

    def takes(self, ce_type: str) -> bool:
        """Whether this subscription asked for ``ce_type`` at all (others are skipped)."""
        return self.events is None or ce_type in self.events


_subscriptions: dict[str, Subscription] = {}


def register(subscription: Subscription) -> None:
    """Declare ``subscription``; the same declaration imported twice is one."""
    existing = _subscriptions.get(subscription.name)
    if existing is not None and existing != subscription:
        raise ValueError(
            f"A subscription named {subscription.name!r} is already declared (to "
            f"{existing.source!r} on broker {existing.broker!r}); give this one another "
            "name with subscribe(..., name=...)."
        )
    _subscriptions[subscription.name] = subscription


def subscriptions() -> list[Subscription]:
    """Every declared subscription, by name."""
    return [_subscriptions[name] for name in sorted(_subscriptions)]


def forget(name: str) -> None:
    """Remove a subscription: for tests that declare them at run time."""
    _subscriptions.pop(name, None)


# ---------------------------------------------------------------- reading a message


@dataclass(frozen=True)
class _Good:
    event: object
    occurred_at: datetime
    key: str
    received: Received


@dataclass(frozen=True)
class _Bad:
    reason: str


class _Refused(Exception):
    """Why a message cannot be recorded: its dead entry's reason."""


def inbox_key(source: str, message_id: str) -> str:
    """The dedupe key of a message: its source and id, or their digest when too long.

    The key is ``json.dumps([source, message_id], ensure_ascii=False, separators=(",",
    ":"))`` to the character (keys already stored must keep matching), built from the
    string encoder that call uses, without its per-call set-up (once per message)."""
    key = f"[{_json_string(source)},{_json_string(message_id)}]"
    if len(key) <= _KEY_CHARS and not text_problem(key):
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def read(subscription: Subscription, message: Message) -> _Good | _Bad | None:
    """What ``message`` becomes, decided without the database: None for a type this
    subscription did not ask for (acknowledged and skipped)."""
    attrs = message.attributes
    if attrs.get("type") and not subscription.takes(attrs["type"]):
        return None
    try:
        return _decoded(subscription, message)
    except _Refused as refused:
        return _Bad(str(refused))


def _decoded(subscription: Subscription, message: Message) -> _Good:
    attrs = message.attributes
    if len(message.body) > subscription.max_bytes:
        raise _Refused(
            f"oversize: the body is {len(message.body)} bytes, over the subscription's "
            f"max_bytes={subscription.max_bytes}; raise max_bytes in subscribe() to take it."
        )
    for name in ("id", "source", "type"):
        if not attrs.get(name):
            raise _Refused(f"no {name!r} attribute: not a CloudEvents message.")
    registered = subscription.event_for(attrs["type"])
    if registered is None:
        raise _Refused(
            f"unknown type: {attrs['type']!r} names no declared event; declare it "
            "(@event(name=...)) or map it in subscribe(events=...), then retry this entry."
        )
    version = _version(attrs.get("payloadversion"), registered)
    content_type = attrs.get("datacontenttype", "application/json")
    if content_type.split(";")[0].strip() != "application/json":
        raise _Refused(f"undecodable: datacontenttype {content_type!r} is not application/json.")
    try:
        payload = json.loads(message.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Refused(f"undecodable: the body is not JSON in UTF-8 ({exc}).") from None
    if not isinstance(payload, dict):
        raise _Refused(f"undecodable: the body is a JSON {type(payload).__name__}, not an object.")
    try:
        evt = registry.decode(registered.name, payload, version)
    except Exception as exc:
        raise _Refused(f"undecodable: {type(exc).__name__}: {exc}") from None
    occurred_at = _time(attrs, "time") or clock.now()
    return _Good(
        event=evt,
        occurred_at=occurred_at,
        key=inbox_key(attrs["source"], attrs["id"]),
        received=_received(subscription, attrs, occurred_at),
    )


def _version(text: str | None, registered: RegisteredEvent) -> int:
    """The payload's version: absent means the declared one (a sender without versions)."""
    if text is None:
        return registered.version
    if not text.isdigit() or int(text) < 1:
        raise _Refused(f"unknown version: payloadversion {text!r} is not a whole number >= 1.")
    version = int(text)
    if version > registered.version:
        raise _Refused(
            f"unknown version: {registered.name} version {version} is newer than the "
            f"declared version {registered.version}; deploy the newer class, then retry."
        )
    return version


def _time(attrs: Mapping[str, str], name: str) -> datetime | None:
    text = attrs.get(name)
    if not text:
        return None
    try:
        value = parse_datetime(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise _Refused(f"bad attribute: {name}={text!r} is not an RFC 3339 timestamp.")
    return clock.normalize(value)


def _received(
    subscription: Subscription, attrs: Mapping[str, str], occurred_at: datetime
) -> Received:
    ends = [_time(attrs, "expirytime")]
    if subscription.ttl is not None:
        ends.append(occurred_at + subscription.ttl)
    known = [end for end in ends if end is not None]
    trace = {k: attrs[k] for k in ("traceparent", "tracestate") if attrs.get(k)}
    origin = {k: attrs[k] for k in ("source", "id", "type", "causationid") if attrs.get(k)}
    origin["subscription"] = subscription.name
    return Received(
        source=attrs["source"][:255],
        origin=origin,
        correlation_id=attrs.get("correlationid", "")[:255],
        trace_context=json.dumps(trace, separators=(",", ":"), sort_keys=True)
        if "traceparent" in trace
        else "",
        expires_at=min(known) if known else None,
    )


# ---------------------------------------------------------------- recording a batch


def record_batch(subscription: Subscription, messages: Sequence[Message]) -> Counter[str]:
    """Record ``messages`` in one transaction; count each outcome.

    Returns only once the batch committed: the caller then acknowledges every message
    of it. A database error propagates (nothing committed, nothing to acknowledge). Any
    other error while recording one message (an ``INLINE`` receiver raising) keeps that
    message as a dead entry, and the others are recorded each in its own savepoint.
    """
    reads = [(message, read(subscription, message)) for message in messages]
    alias = database_alias()
    try:
        with transaction.atomic(using=alias):
            return _write_all(subscription, reads)
    except DatabaseError:
        raise
    except Exception:
        pass
    counts: Counter[str] = Counter()
    with transaction.atomic(using=alias):
        for message, got in reads:
            counts[_write_alone(subscription, message, got, alias)] += 1
    return counts


def _write_all(
    subscription: Subscription, reads: Sequence[tuple[Message, _Good | _Bad | None]]
) -> Counter[str]:
    """Every message of the batch: the good ones recorded together (one statement on
    PostgreSQL), the bad ones kept dead, the others skipped."""
    counts: Counter[str] = Counter()
    good = [got for _, got in reads if isinstance(got, _Good)]
    if good:
        items = [(got.event, got.occurred_at, got.key, got.received) for got in good]
        for _, created in record_received_many(items):
            counts[RECORDED if created else DUPLICATE] += 1
    for message, got in reads:
        if not isinstance(got, _Good):
            counts[_write(subscription, message, got)] += 1
    return counts


def _write(subscription: Subscription, message: Message, got: _Good | _Bad | None) -> str:
    if got is None:
        return IGNORED
    if isinstance(got, _Bad):
        keep_dead(subscription, message, got.reason)
        return DEAD
    _, created = record_received(
        got.event, occurred_at=got.occurred_at, dedupe_key=got.key, received=got.received
    )
    return RECORDED if created else DUPLICATE


def _write_alone(
    subscription: Subscription, message: Message, got: _Good | _Bad | None, alias: str
) -> str:
    try:
        with transaction.atomic(using=alias):
            return _write(subscription, message, got)
    except DatabaseError:
        raise
    except Exception as exc:
        reason = f"refused: recording it raised {type(exc).__name__}: {exc}"
        keep_dead(subscription, message, reason)
        return DEAD


def keep_dead(subscription: Subscription, message: Message, reason: str) -> None:
    """Keep ``message`` raw with its headers and ``reason``; once per message key."""
    attrs = message.attributes
    if attrs.get("source") and attrs.get("id"):
        key = inbox_key(attrs["source"], attrs["id"])
    else:
        raw = json.dumps(dict(message.headers), sort_keys=True).encode() + b"\0" + message.body
        key = f"sha256:{hashlib.sha256(raw).hexdigest()}"
    DeadMessage.objects.using(database_alias()).bulk_create(
        [
            DeadMessage(
                key=key,
                subscription=subscription.name,
                broker=subscription.broker,
                source=_text(attrs.get("source", "")),
                message_id=_text(attrs.get("id", "")),
                type=_text(attrs.get("type", "")),
                headers={_text(k): _text(v, 4096) for k, v in message.headers.items()},
                attributes={_text(k): _text(v, 4096) for k, v in attrs.items()},
                body=bytes(message.body),
                reason=_text(reason, 10_000),
                received_at=clock.now(),
            )
        ],
        ignore_conflicts=True,
    )


def _text(value: object, limit: int = 255) -> str:
    """``value`` as text every database stores: NUL and lone surrogates replaced."""
    text = str(value).replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")[:limit]


# ---------------------------------------------------------------- dead entries


def dead_messages(
    *, subscription: str | None = None, type: str | None = None
) -> Any:  # QuerySet[DeadMessage]
    """Dead inbox entries, oldest first, narrowed by subscription name or message type."""
    rows = DeadMessage.objects.using(database_alias()).all()
    if subscription is not None:
        rows = rows.filter(subscription=subscription)
    if type is not None:
        rows = rows.filter(type=type)
    return rows.order_by("received_at", "pk")


def inbox_entry(entry: DeadMessage) -> dict[str, Any]:
    """A dead inbox entry as JSON-ready values (``dead_letters dump --inbox``); the body
    as text where it is UTF-8, else base64 under ``body_base64``."""
    body = bytes(entry.body)
    shown: dict[str, Any] = {
        "id": entry.pk,
        "subscription": entry.subscription,
        "broker": entry.broker,
        "source": entry.source,
        "message_id": entry.message_id,
        "type": entry.type,
        "reason": entry.reason,
        "attributes": entry.attributes,
        "headers": entry.headers,
        "received_at": entry.received_at.isoformat(),
    }
    try:
        shown["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        shown["body_base64"] = base64.b64encode(body).decode("ascii")
    return shown


def retry_dead_messages(
    *, subscription: str | None = None, ids: Iterable[int] | None = None, limit: int | None = None
) -> Counter[str]:
    """Read dead entries again, as a deploy that learnt their type would: each one that
    now records becomes an event (its entry deleted); the others stay, reason updated."""
    rows = dead_messages(subscription=subscription)
    if ids is not None:
        rows = rows.filter(pk__in=list(ids))
    counts: Counter[str] = Counter()
    for entry in list(rows[:limit] if limit is not None else rows):
        counts[_retry(entry)] += 1
    return counts


def _retry(entry: DeadMessage) -> str:
    subscription = _subscriptions.get(entry.subscription)
    if subscription is None:
        return DEAD  # no longer subscribed here: nothing to read it with
    message = Message(attributes=entry.attributes, body=bytes(entry.body), headers=entry.headers)
    got = read(subscription, message)
    alias = database_alias()
    reason = got.reason if isinstance(got, _Bad) else entry.reason
    if isinstance(got, _Good):
        try:
            with transaction.atomic(using=alias):
                record_received(
                    got.event,
                    occurred_at=got.occurred_at,
                    dedupe_key=got.key,
                    received=got.received,
                )
                entry.delete(using=alias)
            return RECORDED
        except DatabaseError:
            raise
        except Exception as exc:  # an INLINE receiver still refuses it
            reason = f"refused: recording it raised {type(exc).__name__}: {exc}"
    DeadMessage.objects.using(alias).filter(pk=entry.pk).update(
        reason=_text(reason, 10_000), retried_at=clock.now()
    )
    return DEAD


def purge_dead_messages(*, subscription: str | None = None, all: bool = False) -> int:
    """Delete dead inbox entries of ``subscription`` (or every one with ``all=True``)."""
    if subscription is None and not all:
        raise ValueError(
            "purge_dead_messages() deletes dead inbox entries for good: name a subscription, "
            "or pass all=True to delete every one."
        )
    deleted, _ = dead_messages(subscription=subscription).delete()
    return deleted
