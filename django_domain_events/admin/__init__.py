"""The admin: the event log and its deliveries, read-only, with the operator's actions.

Nothing here edits a row. The change permission only gates the actions, which go
through :mod:`django_domain_events.operations` like the management commands do, so an
operator's cancel, replay or requeue is the same transactional operation the
application would run. Filters are built from the registry (event names, receiver
keys, lanes) at request time, so they follow declarations as they change.

One module per concept: ``filters``, ``events``, ``deliveries``, ``schedules`` (with
ticks), ``limits`` (the receivers' rate and concurrency limits), ``dashboard`` (its
page), ``charts`` and ``inbox`` (dead inbox entries);
``display`` shows values the same way on every page, ``readonly`` and ``actions`` hold
what the pages share.

Imported by ``django.contrib.admin``'s autodiscovery, so it is only loaded (and the
models only registered) when the admin is installed.
"""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin

from ..models import (
    DeadMessage,
    DeliveryRecord,
    EventRecord,
    LimitRecord,
    OutboxDashboard,
    ScheduleRecord,
    TickRecord,
)
from .dashboard import OutboxDashboardAdmin, dashboard_context
from .deliveries import DeliveryRecordAdmin
from .display import when
from .events import DeliveryInline, EventRecordAdmin
from .inbox import DeadMessageAdmin
from .limits import LimitRecordAdmin
from .schedules import ScheduleRecordAdmin, TickRecordAdmin

if apps.is_installed("django.contrib.admin"):
    admin.site.register(EventRecord, EventRecordAdmin)
    admin.site.register(DeliveryRecord, DeliveryRecordAdmin)
    admin.site.register(OutboxDashboard, OutboxDashboardAdmin)
    admin.site.register(ScheduleRecord, ScheduleRecordAdmin)
    admin.site.register(TickRecord, TickRecordAdmin)
    admin.site.register(LimitRecord, LimitRecordAdmin)
    admin.site.register(DeadMessage, DeadMessageAdmin)

__all__ = [
    "DeadMessageAdmin",
    "DeliveryInline",
    "DeliveryRecordAdmin",
    "EventRecordAdmin",
    "LimitRecordAdmin",
    "OutboxDashboardAdmin",
    "ScheduleRecordAdmin",
    "TickRecordAdmin",
    "dashboard_context",
    "when",
]
