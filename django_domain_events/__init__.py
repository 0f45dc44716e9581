"""django-domain-events: a transactional log of typed domain events with durable reactions.

The public names are imported on first use, because Django imports this package before
the app registry is ready and most of them need the models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # Declaring
    "event": "declare",
    "receiver": "declare",
    "AnyEvent": "declare",
    "registry": "declare",
    "Registry": "declare",
    "RegisteredEvent": "declare",
    "RegisteredReceiver": "declare",
    "DeliveryMode": "declare",
    "DURABLE": "declare",
    "INLINE": "declare",
    "ON_COMMIT": "declare",
    "Retention": "declare",
    # Firing
    "fire": "fire",
    "attributed": "scope",
    "current_scope": "scope",
    "suppressed": "scope",
    "caused_by": "scope",
    "causing_event_id": "scope",
    "propagate_scope": "scope",
    "Scope": "scope",
    # Delivery
    "run_relay": "delivery.relay",
    "deliver_one": "delivery.relay",
    "deliver_pending": "delivery.relay",
    "claim_batch": "delivery.claim",
    "backoff": "retry",
    "notify_relay": "delivery.wake",
    "DeliveryContext": "delivery.outcomes",
    "DeliveryFailure": "delivery.outcomes",
    "DeliveryStatus": "models",
    "PermanentFailure": "delivery.outcomes",
    "RetryAfter": "delivery.outcomes",
    "NotYet": "delivery.outcomes",
    "TaskBackend": "delivery.tasks",
    # Retry policies
    "Exponential": "retry",
    "Constant": "retry",
    "Linear": "retry",
    # Payloads
    "PayloadCodec": "codec",
    "DataclassCodec": "codec",
    "UnsupportedPayloadType": "codec",
    "PayloadUpgradeFailed": "codec",
    # Introspection
    "what_listens_to": "introspect",
    "listens_for": "introspect",
    # Testing
    "drain_outbox": "testing",
    "assert_fired": "testing",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_domain_events' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .codec import DataclassCodec, PayloadCodec, PayloadUpgradeFailed, UnsupportedPayloadType
    from .declare import (
        DURABLE,
        INLINE,
        ON_COMMIT,
        AnyEvent,
        DeliveryMode,
        RegisteredEvent,
        RegisteredReceiver,
        Registry,
        Retention,
        event,
        receiver,
        registry,
    )
    from .delivery.claim import claim_batch
    from .delivery.outcomes import (
        DeliveryContext,
        DeliveryFailure,
        NotYet,
        PermanentFailure,
        RetryAfter,
    )
    from .delivery.relay import deliver_one, deliver_pending, run_relay
    from .delivery.tasks import TaskBackend
    from .delivery.wake import notify_relay
    from .fire import fire
    from .introspect import listens_for, what_listens_to
    from .models import DeliveryStatus
    from .retry import Constant, Exponential, Linear, backoff
    from .scope import (
        Scope,
        attributed,
        caused_by,
        causing_event_id,
        current_scope,
        propagate_scope,
        suppressed,
    )
    from .testing import assert_fired, drain_outbox
