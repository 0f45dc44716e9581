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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from .codec import PayloadUpgradeFailed
from .declare import registry
from .models import OWED_VALUES, DeliveryRecord, DeliveryStatus, EventRecord, database_alias
from .operations import cancel_deliveries, replay_events, requeue_dead

#: What an operation raises for a selection it refuses (an event no longer declared or
#: pruned meanwhile, a payload that no longer decodes): reported, with nothing applied.
REFUSED = (LookupError, ValueError, TypeError, PayloadUpgradeFailed)

if TYPE_CHECKING:
    _EventAdminBase = admin.ModelAdmin[EventRecord]
    _DeliveryAdminBase = admin.ModelAdmin[DeliveryRecord]
    _DeliveryInlineBase = admin.TabularInline[DeliveryRecord, EventRecord]
else:
    _EventAdminBase = _DeliveryAdminBase = admin.ModelAdmin
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
    """The declared durable receivers' keys."""

    title = "receiver"
    parameter_name = "receiver"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(r.key, r.key) for r in registry.receivers if r.durable]

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
        "due_at",
        "available_at",
        "completed_at",
        "error_preview",
    )
    readonly_fields = fields

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

    @admin.display(description="last error")
    def error_preview(self, obj: DeliveryRecord) -> str:
        return Truncator(obj.last_error).chars(ERROR_PREVIEW_CHARS)


def _attempts(obj: DeliveryRecord) -> str:
    budget = "∞" if obj.max_attempts is None else str(obj.max_attempts)
    return f"{obj.attempts}/{budget}"


# ---------------------------------------------------------------- events


class EventRecordAdmin(_ReadOnly, _EventAdminBase):
    list_display = ("id", "name", "occurred_at", "actor_label", "deliveries_summary")
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
                    "occurred_at",
                    "recorded_at",
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
        ("Retention", {"fields": ("retention_seconds", "delete_when", "prune_after")}),
    )
    readonly_fields = ("delivery_counts", "payload_pretty", "scope_pretty", "causation_link")

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
        "due_at",
        "available_at",
        "error_preview",
    )
    list_filter = ("status", ReceiverKeyFilter, LaneFilter, DeliveryEventNameFilter)
    list_select_related = ("event",)
    search_fields = ("receiver_key", "target", "last_error")
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("requeue_selected_dead", "cancel_selected_deliveries")
    fieldsets = (
        (None, {"fields": ("id", "event_link", "receiver_key", "target", "status_badge")}),
        (
            "Attempts",
            {"fields": ("attempts", "max_attempts", "last_error_full")},
        ),
        (
            "Times",
            {
                "fields": (
                    "due_at",
                    "available_at",
                    "expires_at",
                    "completed_at",
                    "succeeded_at",
                )
            },
        ),
        ("Claim", {"fields": ("claimed_by", "claimed_at", "lease_expires_at")}),
    )
    readonly_fields = ("event_link", "status_badge", "last_error_full")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ViewOnlyChangeList

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


if apps.is_installed("django.contrib.admin"):
    admin.site.register(EventRecord, EventRecordAdmin)
    admin.site.register(DeliveryRecord, DeliveryRecordAdmin)

__all__ = [
    "DeliveryInline",
    "DeliveryRecordAdmin",
    "EventRecordAdmin",
]
