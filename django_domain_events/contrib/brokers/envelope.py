"""The CloudEvents 1.0 envelope (binary content mode) and each transport's headers.

The one place that knows header names, in both directions: the publisher turns an
``Envelope`` into a transport's headers, a consumer turns them back. Attributes are
strings; an absent attribute is omitted, never sent empty. The body is the event's
payload as JSON, UTF-8 (the publisher sends the text the event row stores:
``publishing.message_body``).

- RabbitMQ (AMQP 0-9-1): ``content_type`` = datacontenttype, ``message_id`` = id,
  every attribute but datacontenttype in the headers as ``cloudEvents_<name>`` (id
  too, for readers of the binding that look only at headers; a reader also accepts
  ``cloudEvents:<name>``).
- NATS: headers ``ce-<name>`` for every attribute but datacontenttype, which is
  ``content-type``; ``Nats-Msg-Id`` = id.
- Redis Streams: fields ``ce-<name>`` for every attribute but datacontenttype,
  ``content-type``, and ``data`` (the body).

The ``cloudevents`` SDK is not used: it has no AMQP, NATS or Redis binding, so it would
only build the attribute dict this module builds in a few lines, one more object per
message on the relay's hot path and one more dependency in each extra.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

SPECVERSION = "1.0"
JSON = "application/json"

#: Every attribute the publisher may set, in the order documented.
REQUIRED = ("specversion", "id", "source", "type")
OPTIONAL = (
    "time",
    "datacontenttype",
    "payloadversion",
    "correlationid",
    "causationid",
    "traceparent",
    "tracestate",
    "partitionkey",
    "expirytime",
)

AMQP_PREFIX = "cloudEvents_"
AMQP_PREFIXES = ("cloudEvents_", "cloudEvents:")
CE_PREFIX = "ce-"
CONTENT_TYPE = "content-type"
NATS_MSG_ID = "Nats-Msg-Id"
REDIS_DATA = "data"


class EnvelopeError(ValueError):
    """A message that is not a CloudEvent this package can read (names what is missing)."""


@dataclass(frozen=True)
class Envelope:
    """One CloudEvent: its attributes (strings, absent ones omitted) and its body."""

    attributes: Mapping[str, str]
    data: bytes = b""

    def __post_init__(self) -> None:
        if all(map(self.attributes.get, REQUIRED)):  # one C call: a relay makes thousands
            return
        missing = [name for name in REQUIRED if not self.attributes.get(name)]
        if missing:
            raise EnvelopeError(
                f"a CloudEvent needs {', '.join(REQUIRED)}; this one lacks {', '.join(missing)}."
            )

    @property
    def id(self) -> str:
        return self.attributes["id"]

    @property
    def source(self) -> str:
        return self.attributes["source"]

    @property
    def type(self) -> str:
        return self.attributes["type"]

    @property
    def content_type(self) -> str:
        return self.attributes.get("datacontenttype", JSON)

    def get(self, name: str, default: str | None = None) -> str | None:
        """An attribute, or ``default`` when the message did not carry it."""
        return self.attributes.get(name, default)

    def payload(self) -> Any:
        """The body parsed as JSON (the event's encoded payload)."""
        return json.loads(self.data)


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC, RFC 3339 with a ``Z`` (a naive one is taken as UTC)."""
    if moment.tzinfo is UTC:  # a claim's timestamps: no conversion to make
        return moment.isoformat(timespec="microseconds")[:-6] + "Z"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    text = moment.astimezone(UTC).isoformat(timespec="microseconds")
    return text.replace("+00:00", "Z")


def build(
    *,
    id: str,
    source: str,
    type: str,
    data: bytes,
    time: datetime | None = None,
    content_type: str = JSON,
    payloadversion: str | int | None = None,
    correlationid: str | None = None,
    causationid: str | int | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    partitionkey: str | None = None,
    expirytime: datetime | None = None,
    **unknown: object,
) -> Envelope:
    """An envelope from its parts; an extension that is None or empty is omitted.

    Each attribute is a parameter (not a loop over keywords checked against
    ``OPTIONAL``): the relay builds one envelope per published row."""
    if unknown:
        name = next(iter(unknown))
        raise EnvelopeError(f"{name!r} is not an attribute of this envelope; use {OPTIONAL}.")
    attributes = {"specversion": SPECVERSION, "id": id, "source": source, "type": type}
    if time is not None:
        attributes["time"] = rfc3339(time)
    attributes["datacontenttype"] = content_type
    texts = (
        ("payloadversion", payloadversion),
        ("correlationid", correlationid),
        ("causationid", causationid),
        ("traceparent", traceparent),
        ("tracestate", tracestate),
        ("partitionkey", partitionkey),
    )
    for name, value in texts:
        if value is not None and value != "":
            attributes[name] = str(value)
    if expirytime is not None:
        attributes["expirytime"] = rfc3339(expirytime)
    return Envelope(attributes, data)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


# RabbitMQ -------------------------------------------------------------------


@dataclass(frozen=True)
class AmqpMessage:
    """What an AMQP 0-9-1 publish carries: properties, headers and the body."""

    content_type: str
    message_id: str
    headers: dict[str, str]
    body: bytes


def to_amqp(envelope: Envelope) -> AmqpMessage:
    """``content_type`` and ``message_id`` as properties, the rest ``cloudEvents_<name>``."""
    headers = {
        AMQP_PREFIX + name: value
        for name, value in envelope.attributes.items()
        if name != "datacontenttype"
    }
    return AmqpMessage(envelope.content_type, envelope.id, headers, envelope.data)


def from_amqp(
    headers: Mapping[str, Any] | None,
    body: bytes,
    *,
    content_type: str | None = None,
    message_id: str | None = None,
) -> Envelope:
    """The envelope of a consumed AMQP message (either header prefix)."""
    attributes: dict[str, str] = {}
    for key, value in (headers or {}).items():
        for prefix in AMQP_PREFIXES:
            if key.startswith(prefix) and value is not None:
                attributes[key[len(prefix) :]] = _text(value)
    if content_type:
        attributes["datacontenttype"] = content_type
    if message_id and "id" not in attributes:
        attributes["id"] = message_id
    return Envelope(attributes, bytes(body))


# NATS -----------------------------------------------------------------------


def to_nats(envelope: Envelope) -> dict[str, str]:
    """The headers of a JetStream publish, ``Nats-Msg-Id`` included."""
    headers = _ce_fields(envelope)
    headers[NATS_MSG_ID] = envelope.id
    return headers


def from_nats(headers: Mapping[str, Any] | None, body: bytes) -> Envelope:
    """The envelope of a consumed NATS message."""
    return from_fields(headers or {}, bytes(body))


def from_fields(fields: Mapping[str, Any], body: bytes) -> Envelope:
    """The envelope of ``ce-<name>`` and ``content-type`` fields (NATS headers, a Redis
    stream entry's fields other than ``data``) already read as text, and the body."""
    return Envelope(_from_ce_fields(fields), body)


def attributes_of(fields: Mapping[str, str]) -> dict[str, str]:
    """``from_fields(fields, body).attributes`` for text fields, without building the
    envelope (a consumer's hot path): empty when a required attribute is missing, as a
    message that is no CloudEvent has none to read (the inbox keeps it dead)."""
    attributes: dict[str, str] = {}
    for key, value in fields.items():
        lowered = key.lower()
        if lowered[:3] == CE_PREFIX:
            attributes[lowered[3:]] = value
        elif lowered == CONTENT_TYPE:
            attributes["datacontenttype"] = value
    for name in REQUIRED:
        if not attributes.get(name):
            return {}
    return attributes


# Redis ----------------------------------------------------------------------


def to_redis(envelope: Envelope) -> dict[str, str | bytes]:
    """The fields of ``XADD``: ``ce-<name>``, ``content-type`` and ``data``."""
    fields: dict[str, str | bytes] = dict(_ce_fields(envelope))
    fields[REDIS_DATA] = envelope.data
    return fields


def from_redis(fields: Mapping[Any, Any]) -> Envelope:
    """The envelope of a stream entry (keys and values as bytes or str)."""
    decoded = {_text(key): value for key, value in fields.items()}
    data = decoded.pop(REDIS_DATA, b"")
    body = data if isinstance(data, bytes) else str(data).encode()
    return from_fields(decoded, body)


def _ce_fields(envelope: Envelope) -> dict[str, str]:
    fields = {
        CE_PREFIX + name: value
        for name, value in envelope.attributes.items()
        if name != "datacontenttype"
    }
    fields[CONTENT_TYPE] = envelope.content_type
    return fields


def _from_ce_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for key, value in fields.items():
        lowered = key.lower()
        if lowered.startswith(CE_PREFIX) and value is not None:
            attributes[lowered[len(CE_PREFIX) :]] = _text(value)
        elif lowered == CONTENT_TYPE and value is not None:
            attributes["datacontenttype"] = _text(value)
    return attributes
