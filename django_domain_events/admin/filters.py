"""The admin's sidebar filters, built from the registry at request time.

Event names, receiver keys, lanes and schedules follow the declarations as they change;
keys only the rows still carry (a receiver or schedule no longer declared) are listed
too. A value no row can hold (a NUL byte, a time that does not parse) is ignored, as a
filter nobody chose, rather than sent to the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest

from .. import clock
from ..declare import registry
from ..models import (
    OWED_VALUES,
    UNENDED_VALUES,
    DeliveryRecord,
    DeliveryStatus,
    EventRecord,
    ScheduleRecord,
)
from ..recurrence import schedules
from .display import when


def _usable(value: str | None) -> str | None:
    """A text a query may compare a column with; NUL is refused by PostgreSQL."""
    if value is None or "\x00" in value:
        return None
    return value


class _TextFilter(admin.SimpleListFilter):
    """A filter on a text value, ignoring one no column can hold."""

    def value(self) -> str | None:
        """The value asked for, or None when none was (or it cannot be stored)."""
        return _usable(super().value())


class EventNameFilter(_TextFilter):
    """The declared event names (a name no longer declared still filters by URL)."""

    title = "event name"
    parameter_name = "event_name"
    field_path = "name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(e.name, e.name) for e in registry.events]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.field_path: value})


class DeliveryEventNameFilter(EventNameFilter):
    """The event name filter of the deliveries list, through each row's event."""

    field_path = "event__name"


def _row_receiver_keys() -> list[str]:
    """Receiver keys rows carry while owed, dead or orphaned: two partial index reads in
    one query (``dde_delivery_owed``, ``dde_delivery_dead_type``), never the history."""
    rows = DeliveryRecord.objects.using(router.db_for_read(DeliveryRecord)).order_by()
    owed = rows.filter(status__in=OWED_VALUES).values_list("receiver_key", flat=True)
    ended = rows.filter(status__in=[DeliveryStatus.DEAD, DeliveryStatus.ORPHANED]).values_list(
        "receiver_key", flat=True
    )
    return sorted(set(owed.union(ended)))


class ReceiverKeyFilter(_TextFilter):
    """The declared durable receivers' keys, and the keys of receivers no longer declared
    that owed, dead or orphaned rows still carry (any key still filters by URL)."""

    title = "receiver"
    parameter_name = "receiver"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        declared = [r.key for r in registry.receivers if r.durable]
        known = set(declared)
        gone = [key for key in _row_receiver_keys() if key not in known]
        return [(key, key) for key in declared] + [(key, f"{key} (not declared)") for key in gone]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        if queryset.model is EventRecord:
            return queryset.filter(
                Exists(DeliveryRecord.objects.filter(event=OuterRef("pk"), receiver_key=value))
            )
        return queryset.filter(receiver_key=value)


class LaneFilter(admin.SimpleListFilter):
    """Lanes as the registry has them now: a lane is the receivers declared on it."""

    title = "lane"
    parameter_name = "lane"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(lane, lane) for lane in registry.lanes()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        keys = registry.lanes().get(value, ())
        return queryset.filter(receiver_key__in=keys)


class LimitGroupFilter(admin.SimpleListFilter):
    """The groups of ``LIMIT_GROUPS``: a group is the receivers declaring its name
    (``@receiver(limit_group=)``)."""

    title = "limit group"
    parameter_name = "limit_group"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = sorted({r.limit_group for r in registry.receivers if r.limit_group})
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        keys = [r.key for r in registry.receivers if r.durable and r.limit_group == value]
        return queryset.filter(receiver_key__in=keys)


class OrderKeyFilter(_TextFilter):
    """An ordered receiver's key (``ordered_by=``): the keys with rows still unended,
    from their index; any other key still filters by URL."""

    title = "order key"
    parameter_name = "order_key"
    shown = 50

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        keys = (
            DeliveryRecord.objects.using(router.db_for_read(DeliveryRecord))
            .filter(order_key__isnull=False, status__in=UNENDED_VALUES)
            .values_list("order_key", flat=True)
            .distinct()
            .order_by("order_key")
        )
        return [(key, key) for key in keys[: self.shown] if key is not None]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(order_key=value)


class ErrorTypeFilter(_TextFilter):
    """Dead letters' error types (``last_error`` up to its first ':'), from their index."""

    title = "error type of dead letters"
    parameter_name = "error_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        types = (
            DeliveryRecord.objects.using(router.db_for_read(DeliveryRecord))
            .filter(status=DeliveryStatus.DEAD)
            .values_list("error_type", flat=True)
            .distinct()
            .order_by("error_type")
        )
        return [(kind, kind or "(no error recorded)") for kind in types]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(error_type=value)


class TimeRangeFilter(admin.ListFilter):
    """The time range a dashboard link asked for (``completed_at__gte=...`` and the like),
    shown in the sidebar so the list says what it holds, with a choice to drop it.

    A bound that is not a time is ignored.
    """

    title = "time range"
    FIELDS = ("completed_at", "claimed_at", "due_at", "available_at")
    LOOKUPS = {"gte": ">=", "gt": ">", "lt": "<", "lte": "<="}

    def __init__(self, request: HttpRequest, params: Any, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self._names():
            if name in params:
                value = params.pop(name)[-1]
                moment = self._moment(model, name, value)
                if moment is not None:
                    self.used_parameters[name] = moment

    @staticmethod
    def _moment(model: Any, name: str, value: Any) -> Any:
        field = model._meta.get_field(name.rsplit("__", 1)[0])
        try:
            moment = field.to_python(value)
        except ValidationError:
            return None
        # A link's time carries its offset; under USE_TZ = False it is compared local.
        return clock.normalize(moment) if isinstance(moment, datetime) else None

    def _names(self) -> list[str]:
        return [f"{field}__{lookup}" for field in self.FIELDS for lookup in self.LOOKUPS]

    def expected_parameters(self) -> list[str | None]:
        return list(self._names())

    def has_output(self) -> bool:
        return bool(self.used_parameters)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(**self.used_parameters)

    def _described(self) -> str:
        parts = []
        for name, moment in self.used_parameters.items():
            field, lookup = str(name).rsplit("__", 1)
            shown = when(moment) if isinstance(moment, datetime) else str(moment)
            parts.append(f"{field.replace('_', ' ')} {self.LOOKUPS[lookup]} {shown}")
        return ", ".join(parts)

    def choices(self, changelist: Any) -> Iterator[Any]:
        yield {
            "selected": False,
            "query_string": changelist.get_query_string(remove=self.expected_parameters()),
            "display": "Any time",
        }
        yield {
            "selected": True,
            "query_string": changelist.get_query_string(),
            "display": self._described(),
        }


class DeliveryStatusOfEventFilter(_TextFilter):
    """Events with at least one delivery in this status."""

    title = "delivery status"
    parameter_name = "delivery_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, s.label) for s in DeliveryStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(
            Exists(DeliveryRecord.objects.filter(event=OuterRef("pk"), status=value))
        )


def _schedule_keys() -> list[tuple[str, str]]:
    """The declared schedules' keys, then the keys of cursor rows no schedule declares
    any more (one read of the cursor table, a row per schedule)."""
    declared = schedules.keys()
    rows = ScheduleRecord.objects.using(router.db_for_read(ScheduleRecord)).values_list(
        "key", flat=True
    )
    gone = sorted(set(rows) - set(declared))
    return [(key, key) for key in declared] + [(key, f"{key} (not declared)") for key in gone]


class PausedFilter(admin.SimpleListFilter):
    """Schedules paused, or ticking."""

    title = "paused"
    parameter_name = "paused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "paused"), ("no", "ticking")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.filter(paused_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(paused_at__isnull=True)
        return queryset


class TickScheduleFilter(_TextFilter):
    """The schedules, declared or left by a cursor row (any key still filters by URL)."""

    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return _schedule_keys()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(schedule_key=value)
