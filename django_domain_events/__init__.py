"""django-domain-outbox: a transactional log of typed domain events with durable reactions.

The distribution is django-domain-outbox; the import name is django_domain_events.

The public names are imported on first use, because Django imports this package before
the app registry is ready and most of them need the models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one place the version is kept: pyproject.toml reads it (setuptools dynamic version).
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
    "recurring": "recurrence",
    "Schedule": "recurrence",
    # Firing
    "fire": "firing",
    "attributed": "scope",
    "current_scope": "scope",
    "suppressed": "scope",
    "caused_by": "scope",
    "causing_event_id": "scope",
    "propagate_scope": "scope",
    "Scope": "scope",
    # Delivery
    "run_relay": "delivery.relay",
    "deliver_one": "delivery.passes",
    "deliver_pending": "delivery.passes",
    "claim_batch": "delivery.claim",
    "backoff": "retry",
    "notify_relay": "delivery.wake",
    "fire_due_ticks": "tick_firing",
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
    # Operations
    "cancel_deliveries": "operations",
    "replay_events": "operations",
    "requeue_dead": "operations",
    "prune_events": "retention",
    "dead_letters": "operations",
    "purge_dead": "operations",
    "pause_schedule": "operations",
    "resume_schedule": "operations",
    "forget_schedule": "operations",
    # Introspection
    "outbox_health": "introspect",
    "OutboxHealth": "introspect",
    "ReceiverBacklog": "introspect",
    "LaneBacklog": "introspect",
    "LanePause": "introspect",
    "quiet_receivers": "introspect",
    "QuietReceiver": "introspect",
    "schedule_status": "introspect",
    "ScheduleStatus": "introspect",
    "catalogue": "cataloguing",
    "render_catalogue": "cataloguing",
    "Catalogue": "cataloguing",
    "CatalogueEvent": "cataloguing",
    "CatalogueField": "cataloguing",
    "CatalogueReceiver": "cataloguing",
    "CatalogueSchedule": "cataloguing",
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
    from .cataloguing import (
        Catalogue,
        CatalogueEvent,
        CatalogueField,
        CatalogueReceiver,
        CatalogueSchedule,
        catalogue,
        render_catalogue,
    )
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
    from .delivery.passes import deliver_one, deliver_pending
    from .delivery.relay import run_relay
    from .delivery.tasks import TaskBackend
    from .delivery.wake import notify_relay
    from .firing import fire
    from .introspect import (
        LaneBacklog,
        LanePause,
        OutboxHealth,
        QuietReceiver,
        ReceiverBacklog,
        ScheduleStatus,
        listens_for,
        outbox_health,
        quiet_receivers,
        schedule_status,
        what_listens_to,
    )
    from .models import DeliveryStatus
    from .operations import (
        cancel_deliveries,
        dead_letters,
        forget_schedule,
        pause_schedule,
        purge_dead,
        replay_events,
        requeue_dead,
        resume_schedule,
    )
    from .recurrence import Schedule, recurring
    from .retention import prune_events
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
    from .tick_firing import fire_due_ticks
