"""The admin: the event log and its deliveries, read-only, with the operator's actions.

Nothing here edits a row. The change permission only gates the actions, which go
through :mod:`django_domain_events.operations` like the management commands do, so an
operator's cancel, replay or requeue is the same transactional operation the
application would run. Filters are built from the registry (event names, receiver
keys, lanes) at request time, so they follow declarations as they change.

Imported by ``django.contrib.admin``'s autodiscovery, so it is only loaded (and the
models only registered) when the admin is installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from .codec import PayloadUpgradeFailed
from .dashboard import Dashboard, DeadCount, outbox_dashboard
from .declare import registry
from .models import (
    OWED_VALUES,
    TERMINAL_VALUES,
    DeliveryRecord,
    DeliveryStatus,
    EventRecord,
    OutboxDashboard,
    ScheduleRecord,
    TickRecord,
    TickStatus,
    database_alias,
)
from .operations import (
    cancel_deliveries,
    pause_schedule,
    replay_events,
    requeue_dead,
    resume_schedule,
    retry_now,
)
from .recurrence import schedules

#: What an operation raises for a selection it refuses (an event no longer declared or
#: pruned meanwhile, a payload that no longer decodes): reported, with nothing applied.
REFUSED = (LookupError, ValueError, TypeError, PayloadUpgradeFailed)

if TYPE_CHECKING:
    _EventAdminBase = admin.ModelAdmin[EventRecord]
    _DeliveryAdminBase = admin.ModelAdmin[DeliveryRecord]
    _DeliveryInlineBase = admin.TabularInline[DeliveryRecord, EventRecord]
    _ScheduleAdminBase = admin.ModelAdmin[ScheduleRecord]
    _TickAdminBase = admin.ModelAdmin[TickRecord]
else:
    _EventAdminBase = _DeliveryAdminBase = admin.ModelAdmin
    _ScheduleAdminBase = _TickAdminBase = admin.ModelAdmin
    _DeliveryInlineBase = admin.TabularInline

#: Rows of an event shown inline on its page; the rest are a link away.
INLINE_DELIVERIES = 50

#: Longest ``last_error`` shown in a list before it is cut.
ERROR_PREVIEW_CHARS = 80

_STATUS_ORDER = [s.value for s in DeliveryStatus]
_STATUS_COLOURS = {
    DeliveryStatus.SUCCEEDED.value: "#2e7d32",
    DeliveryStatus.DEAD.value: "#ba2121",
    DeliveryStatus.ORPHANED.value: "#ba2121",
    DeliveryStatus.FAILED.value: "#c05600",
    DeliveryStatus.CLAIMED.value: "#1565c0",
    TickStatus.FIRED.value: "#2e7d32",
    TickStatus.SKIPPED.value: "#c05600",
}


def _plural(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def _status(value: str) -> SafeString:
    colour = _STATUS_COLOURS.get(value)
    if colour is None:
        return format_html("{}", value)
    return format_html('<span style="color: {}; font-weight: bold">{}</span>', colour, value)


def _counts_by_event(event_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """Each event's delivery count per status, in one grouped query."""
    ids = list(event_ids)
    found: dict[int, dict[str, int]] = {pk: {} for pk in ids}
    if not ids:
        return found
    rows = (
        DeliveryRecord.objects.filter(event_id__in=ids)
        .order_by()
        .values_list("event_id", "status")
        .annotate(n=Count("pk"))
    )
    for event_id, status, n in rows:
        found[event_id][status] = n
    return found


def _summary(counts: dict[str, int]) -> SafeString:
    if not counts:
        return format_html("{}", "no deliveries")
    ordered = sorted(
        counts.items(),
        key=lambda kv: _STATUS_ORDER.index(kv[0]) if kv[0] in _STATUS_ORDER else 99,
    )
    return format_html_join(", ", "{} {}", ((n, _status(status)) for status, n in ordered))


def _ids_of(queryset: QuerySet[Any]) -> list[int]:
    return sorted(queryset.order_by().values_list("pk", flat=True).distinct())


def when(value: datetime | None) -> str:
    """A time to the second, in the current time zone: ``2026-12-03 09:01:02``."""
    if value is None:
        return "-"
    if settings.USE_TZ and timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _shown_to_the_second(field: str, description: str | None = None) -> Callable[..., str]:
    """A read-only column or field showing ``field`` to the second (Django's own format
    stops at the minute)."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def show(self: Any, obj: Any) -> str:
        return when(getattr(obj, field))

    show.__name__ = f"{field}_shown"
    return show


def _settled(obj: DeliveryRecord) -> bool:
    return obj.status in TERMINAL_VALUES


def _row_receiver_keys() -> list[str]:
    """Receiver keys rows carry while owed, dead or orphaned: two partial index reads in
    one query (``dde_delivery_owed``, ``dde_delivery_dead_type``), never the history."""
    rows = DeliveryRecord.objects.using(router.db_for_read(DeliveryRecord)).order_by()
    owed = rows.filter(status__in=OWED_VALUES).values_list("receiver_key", flat=True)
    ended = rows.filter(status__in=[DeliveryStatus.DEAD, DeliveryStatus.ORPHANED]).values_list(
        "receiver_key", flat=True
    )
    return sorted(set(owed.union(ended)))


# ---------------------------------------------------------------- filters


class EventNameFilter(admin.SimpleListFilter):
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
    field_path = "event__name"


class ReceiverKeyFilter(admin.SimpleListFilter):
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


class ErrorTypeFilter(admin.SimpleListFilter):
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
    shown in the sidebar so the list says what it holds, with a choice to drop it."""

    title = "time range"
    FIELDS = ("completed_at", "claimed_at", "due_at", "available_at")
    LOOKUPS = {"gte": ">=", "gt": ">", "lt": "<", "lte": "<="}

    def __init__(self, request: HttpRequest, params: Any, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self._names():
            if name in params:
                self.used_parameters[name] = params.pop(name)[-1]

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
        for name, value in self.used_parameters.items():
            field, lookup = str(name).rsplit("__", 1)
            moment = _parse_time(str(value))
            shown = when(moment) if moment is not None else value
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


def _parse_time(value: str) -> datetime | None:
    from django.utils.dateparse import parse_datetime

    try:
        return parse_datetime(value)
    except ValueError:
        return None


class DeliveryStatusOfEventFilter(admin.SimpleListFilter):
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


# ---------------------------------------------------------------- shared


class _ViewOnlyChangeList(ChangeList):
    """The changelist of a model nobody edits here: it selects rows to view."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        if not self.is_popup:
            self.title = f"Select {self.opts.verbose_name} to view"


class _EventChangeList(_ViewOnlyChangeList):
    """Attaches the page's delivery counts in one query, not one per row."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        # The list shows no payload: don't read every row's JSON for it.
        return super().get_queryset(request, exclude_parameters).defer("payload", "scope")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        page = list(self.result_list)  # evaluates and caches the page's rows
        counts = _counts_by_event(e.pk for e in page)
        for record in page:
            record._dde_delivery_counts = counts.get(record.pk, {})


class _ReadOnly:
    """Never add, edit or delete; the change permission only unlocks the actions.

    ``has_change_permission`` answers the real permission for the model as a whole
    (what the actions ask), and ``False`` for any one row, which opens each row's page
    in Django's view-only mode: every field read-only, no save buttons, and a POST
    refused.
    """

    opts: Any

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        codename = f"{self.opts.app_label}.change_{self.opts.model_name}"
        return bool(request.user.has_perm(codename))

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        # The index and app pages then offer "View", not "Change".
        perms: dict[str, bool] = super().get_model_perms(request)  # type: ignore[misc]
        return {**perms, "add": False, "change": False, "delete": False}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        declared = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        fields = [f.name for f in self.opts.concrete_fields]
        return declared + [f for f in fields if f not in declared]


def _event_url(site_name: str, event_id: int) -> str | None:
    try:
        return reverse(f"{site_name}:django_domain_events_eventrecord_change", args=[event_id])
    except NoReverseMatch:
        return None


def _deliveries_url(site_name: str, **params: Any) -> str | None:
    try:
        url = reverse(f"{site_name}:django_domain_events_deliveryrecord_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{urlencode(params)}" if params else url


def _pre(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', text)


# ---------------------------------------------------------------- inline


class _FirstDeliveries(BaseInlineFormSet):
    """An event's first deliveries, so an event with thousands of rows still opens."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_first_deliveries"):
            self._first_deliveries = super().get_queryset()[:INLINE_DELIVERIES]
        return self._first_deliveries


class DeliveryInline(_DeliveryInlineBase):
    model = DeliveryRecord
    formset = _FirstDeliveries
    fk_name = "event"
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    ordering = ("id",)
    fields = (
        "receiver_key",
        "target",
        "status_badge",
        "attempts_display",
        "due_at_shown",
        "available_at_shown",
        "completed_at_shown",
        "error_preview",
    )
    readonly_fields = fields
    due_at_shown = _shown_to_the_second("due_at", "due at")
    completed_at_shown = _shown_to_the_second("completed_at", "completed at")

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        # Inline instances are made per request, so this heading is this page's own.
        total = obj.deliveries.count() if obj is not None else 0
        if total > INLINE_DELIVERIES:
            self.verbose_name_plural = f"deliveries (the first {INLINE_DELIVERIES} of {total})"
        return super().get_formset(request, obj, **kwargs)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="status")
    def status_badge(self, obj: DeliveryRecord) -> SafeString:
        return _status(obj.status)

    @admin.display(description="attempts")
    def attempts_display(self, obj: DeliveryRecord) -> str:
        return _attempts(obj)

    @admin.display(description="available at")
    def available_at_shown(self, obj: DeliveryRecord) -> str:
        return "-" if _settled(obj) else when(obj.available_at)

    @admin.display(description="last error")
    def error_preview(self, obj: DeliveryRecord) -> str:
        return Truncator(obj.last_error).chars(ERROR_PREVIEW_CHARS)


def _attempts(obj: DeliveryRecord) -> str:
    budget = "∞" if obj.max_attempts is None else str(obj.max_attempts)
    return f"{obj.attempts}/{budget}"


# ---------------------------------------------------------------- events


class EventRecordAdmin(_ReadOnly, _EventAdminBase):
    list_display = ("id", "name", "occurred_at_shown", "actor_label", "deliveries_summary")
    list_display_links = ("id", "name")
    list_filter = (EventNameFilter, DeliveryStatusOfEventFilter, ReceiverKeyFilter)
    search_fields = ("name", "correlation_id")
    ordering = ("-id",)
    show_full_result_count = False
    inlines = (DeliveryInline,)
    actions = ("replay_selected_events", "cancel_owed_deliveries")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "name",
                    "version",
                    "occurred_at_shown",
                    "recorded_at_shown",
                    "delivery_counts",
                )
            },
        ),
        ("Payload", {"fields": ("payload_pretty", "scope_pretty")}),
        ("Actor", {"fields": ("actor", "actor_key", "actor_label")}),
        (
            "Causality",
            {"fields": ("correlation_id", "causation_link", "dedupe_key", "suppressed_reason")},
        ),
        ("Retention", {"fields": ("retention_seconds", "delete_when", "prune_after_shown")}),
    )
    readonly_fields = (
        "delivery_counts",
        "payload_pretty",
        "scope_pretty",
        "causation_link",
        "occurred_at_shown",
        "recorded_at_shown",
        "prune_after_shown",
    )
    occurred_at_shown = _shown_to_the_second("occurred_at", "occurred at")
    recorded_at_shown = _shown_to_the_second("recorded_at", "recorded at")
    prune_after_shown = _shown_to_the_second("prune_after", "prune after")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _EventChangeList

    # columns and fields ----------------------------------------------------

    @admin.display(description="deliveries")
    def deliveries_summary(self, obj: EventRecord) -> SafeString:
        counts = getattr(obj, "_dde_delivery_counts", None)
        if counts is None:
            counts = _counts_by_event([obj.pk])[obj.pk]
        return _summary(counts)

    @admin.display(description="deliveries")
    def delivery_counts(self, obj: EventRecord) -> SafeString:
        counts = _counts_by_event([obj.pk])[obj.pk]
        total = sum(counts.values())
        url = _deliveries_url(self.admin_site.name, event__id__exact=obj.pk)
        if url is None or not total:
            return _summary(counts)
        return format_html(
            '{} — <a href="{}">see all {} in the deliveries list</a>',
            _summary(counts),
            url,
            total,
        )

    @admin.display(description="payload")
    def payload_pretty(self, obj: EventRecord) -> SafeString:
        return _pre(obj.payload)

    @admin.display(description="scope")
    def scope_pretty(self, obj: EventRecord) -> SafeString:
        return _pre(obj.scope)

    @admin.display(description="causation")
    def causation_link(self, obj: EventRecord) -> SafeString | str:
        if obj.causation_id is None:
            return "-"
        url = _event_url(self.admin_site.name, obj.causation_id)
        if url is None:
            return f"#{obj.causation_id}"
        return format_html('<a href="{}">event #{}</a>', url, obj.causation_id)

    # actions ---------------------------------------------------------------

    @admin.action(description="Replay selected events", permissions=["change"])
    def replay_selected_events(self, request: HttpRequest, queryset: QuerySet[EventRecord]) -> None:
        event_ids = _ids_of(queryset)
        try:
            with transaction.atomic(using=database_alias()):
                left = DeliveryRecord.objects.filter(
                    event_id__in=event_ids, status__in=OWED_VALUES
                ).count()
                result = replay_events(event_ids)
        except REFUSED as exc:
            self.message_user(request, f"Nothing was replayed: {exc}", messages.ERROR)
            return
        reopened, added = result["reopened"], result["added"]
        text = (
            f"Replayed {_plural(len(event_ids), 'event', 'events')}: "
            f"{_plural(reopened, 'delivery', 'deliveries')} reopened, {added} added"
        )
        if left:
            text += f"; {left} still owed or in flight " + (
                "was left as it was" if left == 1 else "were left as they were"
            )
        level = messages.SUCCESS if reopened or added else messages.WARNING
        self.message_user(request, text + ".", level)

    @admin.action(description="Cancel owed deliveries of selected events", permissions=["change"])
    def cancel_owed_deliveries(self, request: HttpRequest, queryset: QuerySet[EventRecord]) -> None:
        event_ids = _ids_of(queryset)
        try:
            with transaction.atomic(using=database_alias()):
                result = cancel_deliveries(event_ids)
                total = DeliveryRecord.objects.filter(event_id__in=event_ids).count()
        except REFUSED as exc:
            self.message_user(request, f"Nothing was cancelled: {exc}", messages.ERROR)
            return
        _report_cancel(
            self,
            request,
            result,
            settled=total - result["cancelled"] - result["in_flight"],
            of=f" of {_plural(len(event_ids), 'event', 'events')}",
        )


# ---------------------------------------------------------------- deliveries


class DeliveryRecordAdmin(_ReadOnly, _DeliveryAdminBase):
    list_display = (
        "id",
        "event_link",
        "receiver_key",
        "target",
        "status_badge",
        "attempts_display",
        "due_at_shown",
        "available_at_shown",
        "completed_at_shown",
        "error_preview",
    )
    list_filter = (
        "status",
        ReceiverKeyFilter,
        LaneFilter,
        DeliveryEventNameFilter,
        ErrorTypeFilter,
        TimeRangeFilter,
    )
    list_select_related = ("event",)
    search_fields = ("receiver_key", "target", "last_error")
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("requeue_selected_dead", "retry_selected_now", "cancel_selected_deliveries")
    fieldsets = (
        (None, {"fields": ("id", "event_link", "receiver_key", "target", "status_badge")}),
        (
            "Attempts",
            {"fields": ("attempts", "max_attempts", "error_type", "last_error_full")},
        ),
        (
            "Times",
            {
                "fields": (
                    "due_at_shown",
                    "available_at_shown",
                    "expires_at_shown",
                    "completed_at_shown",
                    "succeeded_at_shown",
                )
            },
        ),
        ("Claim", {"fields": ("claimed_by", "claimed_at_shown", "lease_expires_at_shown")}),
    )
    readonly_fields = (
        "event_link",
        "status_badge",
        "last_error_full",
        "due_at_shown",
        "available_at_shown",
        "expires_at_shown",
        "completed_at_shown",
        "succeeded_at_shown",
        "claimed_at_shown",
        "lease_expires_at_shown",
    )
    due_at_shown = _shown_to_the_second("due_at", "due at")
    expires_at_shown = _shown_to_the_second("expires_at", "expires at")
    completed_at_shown = _shown_to_the_second("completed_at", "completed at")
    succeeded_at_shown = _shown_to_the_second("succeeded_at", "succeeded at")
    claimed_at_shown = _shown_to_the_second("claimed_at", "claimed at")
    lease_expires_at_shown = _shown_to_the_second("lease_expires_at", "lease expires at")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ViewOnlyChangeList

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not _settled(obj):
            return fieldsets
        # A settled row is never claimed again: its next-attempt time means nothing.
        return [
            (
                name,
                {**options, "fields": [f for f in options["fields"] if f != "available_at_shown"]},
            )
            for name, options in fieldsets
        ]

    def get_urls(self) -> list[URLPattern]:
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_dashboard",
        )
        return [dashboard, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The outbox dashboard; ``?fragment=1`` answers its figures alone, which the page
        fetches every few seconds to refresh itself."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        figures = dashboard_context(outbox_dashboard(), self.admin_site.name)
        refresh = _refresh_seconds(request)
        if request.GET.get("fragment"):
            return TemplateResponse(
                request, "django_domain_events/admin/dashboard_figures.html", figures
            )
        context = {
            **self.admin_site.each_context(request),
            **figures,
            "title": "Outbox dashboard",
            "opts": self.opts,
            "refresh_seconds": refresh,
            "fragment_url": f"{request.path}?{urlencode({'fragment': 1})}",
            "deliveries_url": _deliveries_url(self.admin_site.name),
        }
        return TemplateResponse(request, "django_domain_events/admin/dashboard.html", context)

    @admin.display(description="available at")
    def available_at_shown(self, obj: DeliveryRecord) -> str:
        return "-" if _settled(obj) else when(obj.available_at)

    # columns and fields ----------------------------------------------------

    @admin.display(description="event", ordering="event_id")
    def event_link(self, obj: DeliveryRecord) -> SafeString | str:
        label = f"{obj.event.name} #{obj.event_id}"
        url = _event_url(self.admin_site.name, obj.event_id)
        if url is None:
            return label
        return format_html('<a href="{}">{}</a>', url, label)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: DeliveryRecord) -> SafeString:
        return _status(obj.status)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: DeliveryRecord) -> str:
        return _attempts(obj)

    @admin.display(description="last error")
    def error_preview(self, obj: DeliveryRecord) -> str:
        return Truncator(obj.last_error).chars(ERROR_PREVIEW_CHARS)

    @admin.display(description="last error")
    def last_error_full(self, obj: DeliveryRecord) -> SafeString | str:
        if not obj.last_error:
            return "-"
        return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', obj.last_error)

    # actions ---------------------------------------------------------------

    @admin.action(description="Requeue selected dead deliveries", permissions=["change"])
    def requeue_selected_dead(
        self, request: HttpRequest, queryset: QuerySet[DeliveryRecord]
    ) -> None:
        delivery_ids = _ids_of(queryset)
        try:
            requeued = requeue_dead(delivery_ids=delivery_ids)
        except REFUSED as exc:
            self.message_user(request, f"Nothing was requeued: {exc}", messages.ERROR)
            return
        skipped = len(delivery_ids) - requeued
        if not requeued:
            rows = _plural(skipped, "selected row", "selected rows")
            self.message_user(
                request, f"Nothing was requeued: none of the {rows} was dead.", messages.WARNING
            )
            return
        text = f"Requeued {_plural(requeued, 'dead delivery', 'dead deliveries')}"
        if skipped:
            text += (
                f"; {_plural(skipped, 'selected row was', 'selected rows were')} not dead and "
                f"{'was' if skipped == 1 else 'were'} skipped"
            )
        self.message_user(request, text + ".", messages.SUCCESS)

    @admin.action(description="Retry selected failed deliveries now", permissions=["change"])
    def retry_selected_now(self, request: HttpRequest, queryset: QuerySet[DeliveryRecord]) -> None:
        delivery_ids = _ids_of(queryset)
        try:
            retried = retry_now(delivery_ids)
        except REFUSED as exc:
            self.message_user(request, f"Nothing was retried: {exc}", messages.ERROR)
            return
        skipped = len(delivery_ids) - retried
        if not retried:
            rows = _plural(skipped, "selected row", "selected rows")
            self.message_user(
                request,
                f"Nothing was retried: none of the {rows} was failed and waiting out its backoff.",
                messages.WARNING,
            )
            return
        text = f"Retrying {_plural(retried, 'failed delivery', 'failed deliveries')} now"
        if skipped:
            text += (
                f"; {_plural(skipped, 'selected row was', 'selected rows were')} not failed "
                f"and waiting out a backoff, and {'was' if skipped == 1 else 'were'} skipped"
            )
        self.message_user(request, text + ".", messages.SUCCESS)

    @admin.action(description="Cancel selected deliveries", permissions=["change"])
    def cancel_selected_deliveries(
        self, request: HttpRequest, queryset: QuerySet[DeliveryRecord]
    ) -> None:
        pairs = list(queryset.order_by().values_list("pk", "event_id").distinct())
        delivery_ids = sorted({pk for pk, _ in pairs})
        event_ids = sorted({event_id for _, event_id in pairs})
        try:
            result = cancel_deliveries(event_ids, delivery_ids=delivery_ids)
        except REFUSED as exc:
            self.message_user(request, f"Nothing was cancelled: {exc}", messages.ERROR)
            return
        _report_cancel(
            self,
            request,
            result,
            settled=len(delivery_ids) - result["cancelled"] - result["in_flight"],
            of="",
        )


# ---------------------------------------------------------------- schedules


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


class TickScheduleFilter(admin.SimpleListFilter):
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


def _tick_status(value: str) -> SafeString:
    if value == TickStatus.FAILED.value:
        return format_html('<span style="color: #ba2121; font-weight: bold">{}</span>', value)
    return _status(value)


def _keys_text(keys: list[str], one: str, many: str) -> str:
    return f"{', '.join(keys)} {one if len(keys) == 1 else many}"


class ScheduleRecordAdmin(_ReadOnly, _ScheduleAdminBase):
    """The ``@recurring`` schedules' cursors, with Pause and Resume (the operations
    ``pause_schedule`` and ``resume_schedule``, so a pause holds on every relay)."""

    list_display = (
        "key_shown",
        "spec",
        "paused_shown",
        "next_tick_at_shown",
        "last_tick_at_shown",
        "ticks_link",
    )
    list_display_links = ("key_shown",)
    list_filter = (PausedFilter,)
    search_fields = ("key",)
    ordering = ("key",)
    actions = ("pause_selected_schedules", "resume_selected_schedules")
    fields = (
        "key_shown",
        "spec",
        "paused_shown",
        "next_tick_at_shown",
        "last_tick_at_shown",
        "created_at_shown",
        "ticks_link",
    )
    readonly_fields = fields
    next_tick_at_shown = _shown_to_the_second("next_tick_at", "next tick")
    last_tick_at_shown = _shown_to_the_second("last_tick_at", "last tick")
    created_at_shown = _shown_to_the_second("created_at", "created at")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ViewOnlyChangeList

    @admin.display(description="key", ordering="key")
    def key_shown(self, obj: ScheduleRecord) -> str:
        if schedules.get(obj.key) is None:
            return f"{obj.key} (not declared)"
        return obj.key

    @admin.display(description="paused", ordering="paused_at")
    def paused_shown(self, obj: ScheduleRecord) -> str:
        if obj.paused_at is None:
            return "no"
        return f"paused since {when(obj.paused_at)}"

    @admin.display(description="ticks")
    def ticks_link(self, obj: ScheduleRecord) -> SafeString | str:
        try:
            url = reverse(f"{self.admin_site.name}:django_domain_events_tickrecord_changelist")
        except NoReverseMatch:
            return "-"
        return format_html('<a href="{}?{}">its ticks</a>', url, urlencode({"schedule": obj.key}))

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_selected_schedules(
        self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]
    ) -> None:
        self._change(request, queryset, pause_schedule, "Paused", "paused", "already paused")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_selected_schedules(
        self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]
    ) -> None:
        self._change(request, queryset, resume_schedule, "Resumed", "resumed", "not paused")

    def _change(
        self,
        request: HttpRequest,
        queryset: QuerySet[ScheduleRecord],
        change: Callable[[str], bool],
        done: str,
        verb: str,
        unchanged: str,
    ) -> None:
        """Pause or resume the selected schedules all together, or none: an undeclared
        one among them refuses the lot, saying which."""
        keys = sorted(queryset.order_by().values_list("key", flat=True))
        try:
            with transaction.atomic(using=database_alias()):
                changed = [key for key in keys if change(key)]
        except ValueError as exc:
            self.message_user(request, f"Nothing was {verb}: {exc}", messages.ERROR)
            return
        left = _keys_text(
            [key for key in keys if key not in changed], f"was {unchanged}", f"were {unchanged}"
        )
        if not changed:
            self.message_user(request, f"Nothing was {verb}: {left}.", messages.WARNING)
            return
        text = f"{done} {', '.join(changed)}" + (f"; {left}" if len(changed) < len(keys) else "")
        self.message_user(request, text + ".", messages.SUCCESS)


class TickRecordAdmin(_ReadOnly, _TickAdminBase):
    """Each tick of each schedule: fired (with its event), skipped or failed, and why."""

    list_display = (
        "id",
        "schedule_key",
        "ticks_shown",
        "status_badge",
        "event_link",
        "reason_preview",
    )
    list_display_links = ("id", "ticks_shown")
    list_filter = ("status", TickScheduleFilter)
    list_select_related = ("event",)
    search_fields = ("schedule_key", "reason")
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "id",
        "schedule_key",
        "tick_shown",
        "skipped_from_shown",
        "status_badge",
        "event_link",
        "reason_full",
        "recorded_at_shown",
    )
    readonly_fields = fields
    tick_shown = _shown_to_the_second("tick", "tick")
    skipped_from_shown = _shown_to_the_second("skipped_from", "skipped from")
    recorded_at_shown = _shown_to_the_second("recorded_at", "recorded at")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ViewOnlyChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet[TickRecord]:
        # The event is shown by name and id only: don't read its payload for the link.
        return super().get_queryset(request).defer("event__payload", "event__scope")

    @admin.display(description="tick", ordering="tick")
    def ticks_shown(self, obj: TickRecord) -> str:
        """The tick, or the run of ticks a skipped row stands for."""
        if obj.skipped_from is not None and obj.skipped_from != obj.tick:
            return f"{when(obj.skipped_from)} to {when(obj.tick)}"
        return when(obj.tick)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: TickRecord) -> SafeString:
        return _tick_status(obj.status)

    @admin.display(description="event", ordering="event_id")
    def event_link(self, obj: TickRecord) -> SafeString | str:
        event = obj.event
        if event is None:
            return "-"
        label = f"{event.name} #{event.pk}"
        url = _event_url(self.admin_site.name, event.pk)
        if url is None:
            return label
        return format_html('<a href="{}">{}</a>', url, label)

    @admin.display(description="reason")
    def reason_preview(self, obj: TickRecord) -> str:
        return Truncator(obj.reason).chars(ERROR_PREVIEW_CHARS) or "-"

    @admin.display(description="reason")
    def reason_full(self, obj: TickRecord) -> SafeString | str:
        if not obj.reason:
            return "-"
        return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', obj.reason)


# ---------------------------------------------------------------- dashboard

#: How often the dashboard fetches its figures again; ``?refresh=N`` overrides it.
DASHBOARD_REFRESH_SECONDS = 10
#: Rows of the dead-letter charts; the rest are summed in a last bar.
DEAD_BARS = 10

_OWED_PARAM = ",".join(OWED_VALUES)
_CHART_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c05600",
    "dead": "#ba2121",
    "owed": "#1565c0",
    "scheduled": "#6a1b9a",
}


def _refresh_seconds(request: HttpRequest) -> int:
    try:
        asked = int(request.GET.get("refresh", DASHBOARD_REFRESH_SECONDS))
    except ValueError:
        asked = DASHBOARD_REFRESH_SECONDS
    return min(max(asked, 1), 3600)


def _t(moment: datetime) -> str:
    """A time as a changelist filter takes it (ISO 8601, with its offset when aware)."""
    return moment.isoformat()


def _age(now: datetime, oldest: datetime | None) -> str:
    if oldest is None:
        return "-"
    seconds = max(int((now - oldest).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def _segment(
    css: str, count: int, url: str | None, title: str, x: float, y: float, w: float, h: float
) -> dict[str, Any]:
    return {
        "css": css,
        "count": count,
        "url": url,
        "title": title,
        "x": f"{x:.1f}",
        "y": f"{y:.1f}",
        "width": f"{w:.1f}",
        "height": f"{h:.1f}",
        "colour": _CHART_COLOURS[css],
    }


def _columns(
    name: str,
    title: str,
    bars: list[tuple[str, list[tuple[str, int, str | None, str]]]],
    ticks: dict[int, str],
    *,
    width: int = 720,
    height: int = 170,
) -> dict[str, Any]:
    """A column chart: one column per bar, each a stack of (css, count, url, title)
    segments, drawn bottom up; ``ticks`` labels some columns under the axis."""
    top, bottom = 14, 22
    plot = height - top - bottom
    peak = max([sum(seg[1] for seg in stack) for _, stack in bars] + [1])
    slot = width / len(bars)
    gap = min(2.0, slot * 0.2)
    columns = []
    for index, (label, stack) in enumerate(bars):
        x = index * slot + gap / 2
        base: float = top + plot
        segments = []
        for css, count, url, seg_title in stack:
            if not count:
                continue
            h = max(plot * count / peak, 1.5)
            base -= h
            segments.append(_segment(css, count, url, seg_title, x, base, slot - gap, h))
        total = sum(seg[1] for seg in stack)
        columns.append(
            {
                "label": label,
                "total": total,
                "segments": segments,
                "tick": ticks.get(index),
                "tick_x": f"{x + (slot - gap) / 2:.1f}",
            }
        )
    return {
        "name": name,
        "title": title,
        "width": width,
        "height": height,
        "axis_y": top + plot,
        "tick_y": height - 6,
        "peak": peak,
        "columns": columns,
        "horizontal": False,
    }


def _rows_chart(
    name: str, title: str, rows: list[tuple[str, int, str | None]], css: str, width: int = 720
) -> dict[str, Any]:
    """A bar per row, label on the left, for categories with long names."""
    row_height, label_width = 22, 300
    peak = max([n for _, n, _ in rows] + [1])
    span = width - label_width - 60
    bars = []
    for index, (label, count, url) in enumerate(rows):
        y = index * row_height + 3
        w = max(span * count / peak, 1.5)
        bars.append(
            {
                "label": label,
                "total": count,
                "label_y": f"{y + 13:.1f}",
                "count_x": f"{label_width + w + 6:.1f}",
                "segments": [_segment(css, count, url, f"{label}: {count}", label_width, y, w, 16)],
            }
        )
    return {
        "name": name,
        "title": title,
        "width": width,
        "height": max(len(rows), 1) * row_height + 6,
        "label_x": label_width - 8,
        "columns": bars,
        "horizontal": True,
    }


def _top(
    counts: Iterable[DeadCount], url_of: Callable[[str], str | None], others_url: str | None
) -> list[tuple[str, int, str | None]]:
    listed = list(counts)
    rows = [(c.name or "(no error recorded)", c.dead, url_of(c.name)) for c in listed[:DEAD_BARS]]
    rest = sum(c.dead for c in listed[DEAD_BARS:])
    if rest:
        rows.append((f"{len(listed) - DEAD_BARS} more", rest, others_url))
    return rows


def dashboard_context(data: Dashboard, site_name: str) -> dict[str, Any]:
    """What the dashboard templates draw from ``outbox_dashboard()``: totals, tables and
    charts, each figure with the changelist URL of the rows behind it."""
    now, health = data.now, data.health

    def url(**params: Any) -> str | None:
        return _deliveries_url(site_name, **params)

    owed_now = {"status__in": _OWED_PARAM, "due_at__lte": _t(now)}
    ahead = {"status__exact": DeliveryStatus.PENDING.value, "due_at__gt": _t(now)}
    dead = {"status__exact": DeliveryStatus.DEAD.value}
    claimed = {"status__exact": DeliveryStatus.CLAIMED.value}
    totals = [
        ("owed", "owed", health.owed, url(**owed_now)),
        ("scheduled", "scheduled", health.scheduled, url(**ahead)),
        ("claimed", "claimed", health.claimed, url(**claimed)),
        ("dead", "dead", health.dead, url(**dead)),
        (
            "lapsed_leases",
            "lapsed leases",
            health.lapsed_leases,
            url(**claimed, available_at__lte=_t(now)),
        ),
    ]
    lane_of = {key: lane for lane, keys in registry.lanes().items() for key in keys}
    receivers = [
        {
            "key": r.key,
            "lane": lane_of.get(r.key, "default"),
            "owed": r.owed,
            "owed_url": url(**owed_now, receiver=r.key),
            "scheduled": r.scheduled,
            "scheduled_url": url(**ahead, receiver=r.key),
            "claimed": r.claimed,
            "claimed_url": url(**claimed, receiver=r.key),
            "dead": r.dead,
            "dead_url": url(**dead, receiver=r.key),
            "age": _age(now, r.oldest_owed_at),
        }
        for r in health.receivers
    ]
    lanes = [
        {
            "lane": lane.lane,
            "owed": lane.owed,
            "owed_url": url(**owed_now, lane=lane.lane),
            "scheduled": lane.scheduled,
            "scheduled_url": url(**ahead, lane=lane.lane),
            "claimed": lane.claimed,
            "claimed_url": url(**claimed, lane=lane.lane),
            "dead": lane.dead,
            "dead_url": url(**dead, lane=lane.lane),
            "age": _age(now, lane.oldest_owed_at),
            "pauses": [f"{pause.worker_id} until {when(pause.until)}" for pause in lane.pauses],
        }
        for lane in health.lanes
    ]

    minutes = []
    for minute in data.minutes:
        span = {"completed_at__gte": _t(minute.start), "completed_at__lt": _t(minute.end)}
        at = when(minute.start)[11:16]
        minutes.append(
            (
                at,
                [
                    (
                        "succeeded",
                        minute.succeeded,
                        url(status__exact="succeeded", **span),
                        f"{at}: {minute.succeeded} succeeded",
                    ),
                    (
                        "failed",
                        minute.failed,
                        url(
                            status__exact="failed",
                            claimed_at__gte=_t(minute.start),
                            claimed_at__lt=_t(minute.end),
                        ),
                        f"{at}: {minute.failed} failed, waiting to retry",
                    ),
                    (
                        "dead",
                        minute.dead,
                        url(status__exact="dead", **span),
                        f"{at}: {minute.dead} dead",
                    ),
                ],
            )
        )
    minute_ticks = {i: minutes[i][0] for i in range(0, len(minutes), 10)}
    minute_ticks[len(minutes) - 1] = minutes[-1][0]

    ages = []
    for age in data.ages:
        span = {"due_at__lte": _t(age.due_until)}
        if age.due_after is not None:
            span["due_at__gt"] = _t(age.due_after)
        ages.append(
            (
                age.label,
                [
                    (
                        "owed",
                        age.owed,
                        url(status__in=_OWED_PARAM, **span),
                        f"{age.label}: {age.owed}",
                    )
                ],
            )
        )

    days = []
    for index, day in enumerate(data.days):
        label = "today" if index == 0 else when(day.start)[5:10]
        start = {"due_at__gt": _t(now)} if index == 0 else {"due_at__gte": _t(day.start)}
        days.append(
            (
                label,
                [
                    (
                        "scheduled",
                        day.scheduled,
                        url(status__exact="pending", due_at__lt=_t(day.end), **start),
                        f"{when(day.start)} to {when(day.end)}: {day.scheduled}",
                    )
                ],
            )
        )

    charts = [
        _columns(
            "minutes",
            "Deliveries per minute, the last hour",
            minutes,
            minute_ticks,
        ),
        _columns("ages", "Owed backlog by age", ages, dict(enumerate(a[0] for a in ages))),
        _columns(
            "days",
            "Scheduled work by due day, the next 7 days",
            days,
            dict(enumerate(d[0] for d in days)),
        ),
        _rows_chart(
            "dead_receivers",
            "Dead letters by receiver",
            _top(data.dead_by_receiver, lambda key: url(**dead, receiver=key), url(**dead)),
            "dead",
        ),
        _rows_chart(
            "dead_types",
            "Dead letters by error type",
            _top(data.dead_by_error_type, lambda kind: url(**dead, error_type=kind), url(**dead)),
            "dead",
        ),
    ]
    return {
        "now": when(now),
        "time_zone": timezone.get_current_timezone_name()
        if settings.USE_TZ
        else settings.TIME_ZONE,
        "totals": totals,
        "oldest_age": _age(now, health.oldest_owed_at),
        "oldest_url": url(**owed_now, o="due_at"),
        "receivers": receivers,
        "lanes": lanes,
        "charts": {chart["name"]: chart for chart in charts},
        "chart_list": charts,
        "scheduled_later": data.scheduled_later,
        "scheduled_later_url": url(
            status__exact="pending", due_at__gte=_t(data.days[-1].end) if data.days else _t(now)
        ),
        "legend": [(css, _CHART_COLOURS[css]) for css in ("succeeded", "failed", "dead")],
    }


def _report_cancel(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    result: dict[str, int],
    *,
    settled: int,
    of: str,
) -> None:
    cancelled, in_flight = result["cancelled"], result["in_flight"]
    parts = [f"Cancelled {_plural(cancelled, 'delivery', 'deliveries')}{of}"]
    if in_flight:
        left = "was left to its worker" if in_flight == 1 else "were left to their workers"
        parts.append(f"{in_flight} in flight {left}")
    if settled > 0:
        verb = "was" if settled == 1 else "were"
        parts.append(f"{settled} already settled {verb} skipped")
    level = messages.SUCCESS if cancelled else messages.WARNING
    model_admin.message_user(request, "; ".join(parts) + ".", level)


class OutboxDashboardAdmin(admin.ModelAdmin):
    """The dashboard's entry on the admin index: it opens the deliveries admin's dashboard
    for whoever may view deliveries."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = DeliveryRecord._meta
        return bool(request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        opts = DeliveryRecord._meta
        name = f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dashboard"
        return HttpResponseRedirect(reverse(name))


if apps.is_installed("django.contrib.admin"):
    admin.site.register(EventRecord, EventRecordAdmin)
    admin.site.register(DeliveryRecord, DeliveryRecordAdmin)
    admin.site.register(OutboxDashboard, OutboxDashboardAdmin)
    admin.site.register(ScheduleRecord, ScheduleRecordAdmin)
    admin.site.register(TickRecord, TickRecordAdmin)
    from . import inbox_admin  # noqa: F401 - registers the dead inbox entries' admin

__all__ = [
    "DeliveryInline",
    "DeliveryRecordAdmin",
    "EventRecordAdmin",
    "OutboxDashboardAdmin",
    "ScheduleRecordAdmin",
    "TickRecordAdmin",
]
