"""``subscribe()``: declare, at import time, which messages of another service become
which local events. The consumer (``consuming.py``, ``manage.py consume_events``) reads
the declarations; nothing here connects or imports a client library."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from ...declare import registry
from ...inbox import DEFAULT_MAX_BYTES, Subscription, register
from .config import event_source

#: subscribe()'s own options, beside the transport's (``TRANSPORT_SUBSCRIBE_OPTIONS``).
_OPTIONS = ("ttl", "max_bytes", "batch_size")

#: Options a transport reads from a subscription, with their defaults.
TRANSPORT_SUBSCRIBE_OPTIONS: dict[str, Any] = {
    # RabbitMQ, NATS: how long the broker waits for an acknowledgement before it hands
    # the message to another consumer (NATS ack_wait; Redis: the idle time after which
    # another consumer claims a dead one's pending entries with XAUTOCLAIM).
    "ack_wait_seconds": 30.0,
}

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


def subscribe(
    source: str,
    *,
    broker: str = "default",
    events: Sequence[type] | Mapping[str, type] | None = None,
    name: str | None = None,
    **options: Any,
) -> Subscription:
    """Consume what ``publish(..., to=source)`` sends, recording each message as an event.

    ``events``: the ``@event`` classes to take, each under its declared name, or a mapping
    of another service's CloudEvents ``type`` to a local class; ``None`` takes every type
    naming a declared event (and keeps the rest as dead inbox entries). ``name`` is the
    queue, durable consumer or consumer group (default ``<EVENT_SOURCE>.<source>``).
    Options: ``ttl`` (a message's lifetime from its ``time``), ``max_bytes`` (bodies over
    it are kept dead, default 1 MiB), ``batch_size`` (messages per transaction, default
    100), ``ack_wait_seconds`` (default 30).
    """
    if not isinstance(source, str) or not _NAME.match(source):
        raise ValueError(
            f"subscribe(source={source!r}) must name the publisher's destination (its "
            "publish(to=...)): letters, digits, '-', '_', '.' or ':'."
        )
    chosen = name if name is not None else f"{event_source()}.{source}"
    if not isinstance(chosen, str) or not _NAME.match(chosen):
        raise ValueError(
            f"subscribe(name={chosen!r}) names a queue, durable consumer and consumer group: "
            "use up to 200 letters, digits, '-', '_', '.' or ':'."
        )
    unknown = sorted(set(options) - set(_OPTIONS) - set(TRANSPORT_SUBSCRIBE_OPTIONS))
    if unknown:
        known = ", ".join((*_OPTIONS, *TRANSPORT_SUBSCRIBE_OPTIONS))
        raise TypeError(f"subscribe() got unknown options {', '.join(unknown)}; it takes {known}.")
    subscription = Subscription(
        source=source,
        broker=broker,
        name=chosen,
        events=_mapping(events),
        ttl=_ttl(options.get("ttl")),
        max_bytes=_positive_int(options.get("max_bytes", DEFAULT_MAX_BYTES), "max_bytes"),
        batch_size=_positive_int(options.get("batch_size", 100), "batch_size"),
        options={k: options.get(k, v) for k, v in TRANSPORT_SUBSCRIBE_OPTIONS.items()},
    )
    register(subscription)
    return subscription


def _mapping(events: Sequence[type] | Mapping[str, type] | None) -> dict[str, type] | None:
    if events is None:
        return None
    pairs = events.items() if isinstance(events, Mapping) else [(None, cls) for cls in events]
    mapping: dict[str, type] = {}
    for ce_type, cls in pairs:
        registered = registry.event_for_class(cls) if isinstance(cls, type) else None
        if registered is None:
            raise TypeError(
                f"subscribe(events=) takes @event classes, and {cls!r} is not one; "
                "decorate it with @event."
            )
        mapping[ce_type if ce_type is not None else registered.name] = cls
    if not mapping:
        raise ValueError("subscribe(events=) is empty; name the events to take, or pass None.")
    return mapping


def _ttl(value: object) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(f"subscribe(ttl=) must be a positive timedelta or None, not {value!r}.")
    return value


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"subscribe({name}=) must be a whole number >= 1, not {value!r}.")
    return value
