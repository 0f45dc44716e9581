"""The event log: each event with its deliveries' counts, its payload, cause and actor,
and the actions Replay and Cancel owed deliveries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import OWED_VALUES, DeliveryRecord, EventRecord, database_alias
from ..operations import cancel_deliveries, replay_events
from .actions import REFUSED, ids_of, may_cancel, report_cancel
from .display import (
    DeliveryColumns,
    deliveries_url,
    event_url,
    plural,
    pretty_json,
    shown_to_the_second,
    summary,
)
from .filters import DeliveryStatusOfEventFilter, EventNameFilter, ReceiverKeyFilter
from .readonly import ReadOnly, ViewOnlyChangeList

if TYPE_CHECKING:
    _EventAdminBase = admin.ModelAdmin[EventRecord]
    _DeliveryInlineBase = admin.TabularInline[DeliveryRecord, EventRecord]
else:
    _EventAdminBase = admin.ModelAdmin
    _DeliveryInlineBase = admin.TabularInline

#: Rows of an event shown inline on its page; the rest are a link away.
INLINE_DELIVERIES = 50


def counts_by_event(event_ids: Iterable[int]) -> dict[int, dict[str, int]]:
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


class _EventChangeList(ViewOnlyChangeList):
    """Attaches the page's delivery counts in one query, not one per row."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        # The list shows no payload: don't read every row's JSON for it.
        return super().get_queryset(request, exclude_parameters).defer("payload", "scope")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        page = list(self.result_list)  # evaluates and caches the page's rows
        counts = counts_by_event(e.pk for e in page)
        for record in page:
            record._dde_delivery_counts = counts.get(record.pk, {})


class _FirstDeliveries(BaseInlineFormSet):
    """An event's first deliveries, so an event with thousands of rows still opens."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_first_deliveries"):
            self._first_deliveries = super().get_queryset()[:INLINE_DELIVERIES]
        return self._first_deliveries


class DeliveryInline(DeliveryColumns, _DeliveryInlineBase):
    """An event's deliveries on its page: the first :data:`INLINE_DELIVERIES`, each a
    link to its own page."""

    model = DeliveryRecord
    formset = _FirstDeliveries
    fk_name = "event"
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    ordering = ("id",)
    fields = DeliveryColumns.COLUMNS
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


class EventRecordAdmin(ReadOnly, _EventAdminBase):
    """The event log, newest first, with Replay and Cancel owed deliveries."""

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
    occurred_at_shown = shown_to_the_second("occurred_at", "occurred at")
    recorded_at_shown = shown_to_the_second("recorded_at", "recorded at")
    prune_after_shown = shown_to_the_second("prune_after", "prune after")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _EventChangeList

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancelling changes delivery rows: the deliveries list's permission, here too."""
        return may_cancel(request)

    # columns and fields ----------------------------------------------------

    @admin.display(description="deliveries")
    def deliveries_summary(self, obj: EventRecord) -> SafeString:
        counts = getattr(obj, "_dde_delivery_counts", None)
        if counts is None:
            counts = counts_by_event([obj.pk])[obj.pk]
        return summary(counts)

    @admin.display(description="deliveries")
    def delivery_counts(self, obj: EventRecord) -> SafeString:
        counts = counts_by_event([obj.pk])[obj.pk]
        total = sum(counts.values())
        url = deliveries_url(self.admin_site.name, event__id__exact=obj.pk)
        if url is None or not total:
            return summary(counts)
        return format_html(
            '{} — <a href="{}">see all {} in the deliveries list</a>',
            summary(counts),
            url,
            total,
        )

    @admin.display(description="payload")
    def payload_pretty(self, obj: EventRecord) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="scope")
    def scope_pretty(self, obj: EventRecord) -> SafeString:
        return pretty_json(obj.scope)

    @admin.display(description="causation")
    def causation_link(self, obj: EventRecord) -> SafeString | str:
        if obj.causation_id is None:
            return "-"
        url = event_url(self.admin_site.name, obj.causation_id)
        if url is None:
            return f"#{obj.causation_id}"
        return format_html('<a href="{}">event #{}</a>', url, obj.causation_id)

    # actions ---------------------------------------------------------------

    @admin.action(description="Replay selected events", permissions=["change"])
    def replay_selected_events(self, request: HttpRequest, queryset: QuerySet[EventRecord]) -> None:
        event_ids = ids_of(queryset)
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
            f"Replayed {plural(len(event_ids), 'event', 'events')}: "
            f"{plural(reopened, 'delivery', 'deliveries')} reopened, {added} added"
        )
        if left:
            text += f"; {left} still owed or in flight " + (
                "was left as it was" if left == 1 else "were left as they were"
            )
        level = messages.SUCCESS if reopened or added else messages.WARNING
        self.message_user(request, text + ".", level)

    @admin.action(description="Cancel owed deliveries of selected events", permissions=["cancel"])
    def cancel_owed_deliveries(self, request: HttpRequest, queryset: QuerySet[EventRecord]) -> None:
        event_ids = ids_of(queryset)
        try:
            with transaction.atomic(using=database_alias()):
                result = cancel_deliveries(event_ids)
                total = DeliveryRecord.objects.filter(event_id__in=event_ids).count()
        except REFUSED as exc:
            self.message_user(request, f"Nothing was cancelled: {exc}", messages.ERROR)
            return
        report_cancel(
            self,
            request,
            result,
            settled=total - result["cancelled"] - result["in_flight"],
            of=f" of {plural(len(event_ids), 'event', 'events')}",
        )
