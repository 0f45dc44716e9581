"""Publish events to other services, and consume theirs: RabbitMQ, NATS JetStream, Redis.

``publish(EventClass, to="orders")`` in an ``events.py`` declares a durable delivery per
event to that destination of a broker named in ``DJANGO_DOMAIN_EVENTS["BROKERS"]``; the
relay sends it as a CloudEvent and acknowledges the row only once the broker confirmed
it. ``subscribe(source)`` consumes what another service publishes.

Nothing broker-specific is imported until it is used: this package imports no client
library, and each transport module imports its own only when a broker of its kind is
configured and used.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["publish", "subscribe"]

# public name -> the module (of this package) that defines it
_LAZY = {"publish": ".publishing", "subscribe": ".subscribing"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
