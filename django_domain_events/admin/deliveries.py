"""The deliveries list: every row of every receiver, filtered by status, receiver, lane,
event name, error type and time range, with Requeue, Retry now and Cancel, and the
outbox dashboard at ``dashboard/`` beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.safestring import SafeString

from ..models import DeliveryRecord
from ..operations import cancel_deliveries, requeue_dead, retry_now
from .actions import REFUSED, ids_of, may_cancel, report_cancel
from .dashboard import dashboard_view
from .display import DeliveryColumns, event_link, full_text, plural, settled, shown_to_the_second
from .filters import (
    DeliveryEventNameFilter,
    ErrorTypeFilter,
    LaneFilter,
    LimitGroupFilter,
    OrderKeyFilter,
    ReceiverKeyFilter,
    TimeRangeFilter,
)
from .readonly import ReadOnly

if TYPE_CHECKING:
    _DeliveryAdminBase = admin.ModelAdmin[DeliveryRecord]
else:
    _DeliveryAdminBase = admin.ModelAdmin


@dataclass(frozen=True)
class _Act:
    """An action on the selected rows that applies to some of them, and its wording."""

    run: Callable[[list[int]], int]  # the operation: how many rows it changed
    verb: str  # "Nothing was {verb}"
    wanted: str  # "none of the selected rows {wanted}"
    unwanted: str  # "N selected rows were {unwanted} were skipped"
    done: Callable[[int], str]  # what it did, as a sentence's start


_REQUEUE = _Act(
    run=lambda ids: requeue_dead(delivery_ids=ids),
    verb="requeued",
    wanted="was dead",
    unwanted="not dead and",
    done=lambda n: f"Requeued {plural(n, 'dead delivery', 'dead deliveries')}",
)
_RETRY = _Act(
    run=lambda ids: retry_now(ids),
    verb="retried",
    wanted="was failed and waiting out its backoff",
    unwanted="not failed and waiting out a backoff, and",
    done=lambda n: f"Retrying {plural(n, 'failed delivery', 'failed deliveries')} now",
)


class DeliveryRecordAdmin(ReadOnly, DeliveryColumns, _DeliveryAdminBase):
    """Every delivery row, newest first, with the actions on dead, failed and owed rows."""

    list_display = ("id", "event_link", *DeliveryColumns.COLUMNS, "order_key")
    list_filter = (
        "status",
        ReceiverKeyFilter,
        LaneFilter,
        LimitGroupFilter,
        DeliveryEventNameFilter,
        ErrorTypeFilter,
        OrderKeyFilter,
        TimeRangeFilter,
    )
    list_select_related = ("event",)
    search_fields = ("receiver_key", "target", "order_key", "last_error")
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("requeue_selected_dead", "retry_selected_now", "cancel_selected_deliveries")
    fieldsets = (
        (
            None,
            {"fields": ("id", "event_link", "receiver_key", "target", "order_key", "status_badge")},
        ),
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
    expires_at_shown = shown_to_the_second("expires_at", "expires at")
    succeeded_at_shown = shown_to_the_second("succeeded_at", "succeeded at")
    claimed_at_shown = shown_to_the_second("claimed_at", "claimed at")
    lease_expires_at_shown = shown_to_the_second("lease_expires_at", "lease expires at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeliveryRecord]:
        # The event is shown by name and id only: don't read its payload for the link.
        return super().get_queryset(request).defer("event__payload", "event__scope")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not settled(obj):
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
        return dashboard_view(self, request)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """The change permission on deliveries, as from the events list."""
        return may_cancel(request)

    # columns and fields ----------------------------------------------------

    @admin.display(description="event", ordering="event_id")
    def event_link(self, obj: DeliveryRecord) -> SafeString | str:
        return event_link(self.admin_site.name, obj.event, obj.event_id)

    @admin.display(description="last error")
    def last_error_full(self, obj: DeliveryRecord) -> SafeString | str:
        return full_text(obj.last_error)

    # actions ---------------------------------------------------------------

    @admin.action(description="Requeue selected dead deliveries", permissions=["change"])
    def requeue_selected_dead(
        self, request: HttpRequest, queryset: QuerySet[DeliveryRecord]
    ) -> None:
        self._act_on_selected(request, ids_of(queryset), _REQUEUE)

    @admin.action(description="Retry selected failed deliveries now", permissions=["change"])
    def retry_selected_now(self, request: HttpRequest, queryset: QuerySet[DeliveryRecord]) -> None:
        self._act_on_selected(request, ids_of(queryset), _RETRY)

    def _act_on_selected(self, request: HttpRequest, delivery_ids: list[int], act: _Act) -> None:
        """Run ``act`` on the selected rows and say what it did, and what it skipped."""
        try:
            done = act.run(delivery_ids)
        except REFUSED as exc:
            self.message_user(request, f"Nothing was {act.verb}: {exc}", messages.ERROR)
            return
        skipped = len(delivery_ids) - done
        if not done:
            rows = plural(skipped, "selected row", "selected rows")
            self.message_user(
                request,
                f"Nothing was {act.verb}: none of the {rows} {act.wanted}.",
                messages.WARNING,
            )
            return
        text = act.done(done)
        if skipped:
            text += (
                f"; {plural(skipped, 'selected row was', 'selected rows were')} {act.unwanted} "
                f"{'was' if skipped == 1 else 'were'} skipped"
            )
        self.message_user(request, text + ".", messages.SUCCESS)

    @admin.action(description="Cancel selected deliveries", permissions=["cancel"])
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
        report_cancel(
            self,
            request,
            result,
            settled=len(delivery_ids) - result["cancelled"] - result["in_flight"],
            of="",
        )
