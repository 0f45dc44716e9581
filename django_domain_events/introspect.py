"""Answers about the declarations and the rows: who listens, and (later) health and quiet."""

from __future__ import annotations

from .declare import AnyEvent, RegisteredEvent, RegisteredReceiver, registry


def what_listens_to(cls: type) -> list[RegisteredReceiver]:
    """The receivers of ``cls``, sorted by key; wildcards only when asked about ``AnyEvent``."""
    if cls is AnyEvent:
        return [r for r in registry.receivers if r.wildcard]
    return [r for r in registry.receivers if r.event_class is cls]


def listens_for(key: str) -> RegisteredEvent | None:
    """The event the receiver ``key`` is declared for; None for an unknown key or a wildcard."""
    declared = registry.receiver(key)
    if declared is None or declared.wildcard:
        return None
    return registry.event_for_class(declared.event_class)
