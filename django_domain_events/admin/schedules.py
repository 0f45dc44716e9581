"""The ``@recurring`` schedules' cursors, with Pause and Resume, and each tick they
fired, skipped or failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ..models import ScheduleRecord, TickRecord, database_alias
from ..operations import pause_schedule, resume_schedule
from ..recurrence import schedules
from .display import (
    event_link,
    full_text,
    preview,
    shown_to_the_second,
    tick_status_badge,
    when,
)
from .filters import PausedFilter, TickScheduleFilter
from .readonly import ReadOnly

if TYPE_CHECKING:
    _ScheduleAdminBase = admin.ModelAdmin[ScheduleRecord]
    _TickAdminBase = admin.ModelAdmin[TickRecord]
else:
    _ScheduleAdminBase = _TickAdminBase = admin.ModelAdmin


def keys_text(keys: list[str], one: str, many: str) -> str:
    """``a, b were paused``."""
    return f"{', '.join(keys)} {one if len(keys) == 1 else many}"


class ScheduleRecordAdmin(ReadOnly, _ScheduleAdminBase):
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
    next_tick_at_shown = shown_to_the_second("next_tick_at", "next tick")
    last_tick_at_shown = shown_to_the_second("last_tick_at", "last tick")
    created_at_shown = shown_to_the_second("created_at", "created at")

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
        left = keys_text(
            [key for key in keys if key not in changed], f"was {unchanged}", f"were {unchanged}"
        )
        if not changed:
            self.message_user(request, f"Nothing was {verb}: {left}.", messages.WARNING)
            return
        text = f"{done} {', '.join(changed)}" + (f"; {left}" if len(changed) < len(keys) else "")
        self.message_user(request, text + ".", messages.SUCCESS)


class TickRecordAdmin(ReadOnly, _TickAdminBase):
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
    tick_shown = shown_to_the_second("tick", "tick")
    skipped_from_shown = shown_to_the_second("skipped_from", "skipped from")
    recorded_at_shown = shown_to_the_second("recorded_at", "recorded at")

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
        return tick_status_badge(obj.status)

    @admin.display(description="event", ordering="event_id")
    def event_link(self, obj: TickRecord) -> SafeString | str:
        return event_link(self.admin_site.name, obj.event, obj.event_id)

    @admin.display(description="reason")
    def reason_preview(self, obj: TickRecord) -> str:
        return preview(obj.reason) or "-"

    @admin.display(description="reason")
    def reason_full(self, obj: TickRecord) -> SafeString | str:
        return full_text(obj.reason)
