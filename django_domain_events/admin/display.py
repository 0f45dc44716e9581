"""How the admin shows a value: times to the second, status badges, links, long text.

Written once here and used by every admin page, so an event link, a status colour or
an error preview reads the same on the events, deliveries, schedules and ticks pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from ..models import TERMINAL_VALUES, DeliveryRecord, DeliveryStatus, EventRecord, TickStatus

#: Longest ``last_error`` (or tick reason) shown in a list before it is cut.
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


def plural(count: int, singular: str, plural: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{count} {singular if count == 1 else plural}"


def status_badge(value: str) -> SafeString:
    """A delivery or tick status in its colour (an unknown one plain)."""
    colour = _STATUS_COLOURS.get(value)
    if colour is None:
        return format_html("{}", value)
    return format_html('<span style="color: {}; font-weight: bold">{}</span>', colour, value)


def tick_status_badge(value: str) -> SafeString:
    """A tick status in its colour: a failed tick is red, unlike a delivery waiting to retry."""
    if value == TickStatus.FAILED.value:
        return format_html('<span style="color: #ba2121; font-weight: bold">{}</span>', value)
    return status_badge(value)


def summary(counts: dict[str, int]) -> SafeString:
    """An event's deliveries per status, in the lifecycle's order: ``2 succeeded, 1 dead``."""
    if not counts:
        return format_html("{}", "no deliveries")
    ordered = sorted(
        counts.items(),
        key=lambda kv: _STATUS_ORDER.index(kv[0]) if kv[0] in _STATUS_ORDER else 99,
    )
    return format_html_join(", ", "{} {}", ((n, status_badge(status)) for status, n in ordered))


def when(value: datetime | None) -> str:
    """A time to the second, in the current time zone: ``2026-12-03 09:01:02``."""
    if value is None:
        return "-"
    if settings.USE_TZ and timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def shown_to_the_second(field: str, description: str | None = None) -> Callable[..., str]:
    """A read-only column or field showing ``field`` to the second (Django's own format
    stops at the minute)."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def show(self: Any, obj: Any) -> str:
        return when(getattr(obj, field))

    show.__name__ = f"{field}_shown"
    return show


def settled(obj: DeliveryRecord) -> bool:
    """Whether a row has ended (its next-attempt time then means nothing)."""
    return obj.status in TERMINAL_VALUES


def attempts(obj: DeliveryRecord) -> str:
    """Attempts made of the budget: ``2/5``, ``2/∞``."""
    budget = "∞" if obj.max_attempts is None else str(obj.max_attempts)
    return f"{obj.attempts}/{budget}"


def preview(text: str) -> str:
    """The start of a long text, for a list column."""
    return Truncator(text).chars(ERROR_PREVIEW_CHARS)


def full_text(text: str) -> SafeString | str:
    """A long text (an error, a reason) whole, wrapped, on a row's page."""
    if not text:
        return "-"
    return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', text)


def pretty_json(value: Any) -> SafeString:
    """A stored JSON value, indented."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', text)


def event_url(site_name: str, event_id: int) -> str | None:
    """The event's page on this admin site, None when events are not registered there."""
    try:
        return reverse(f"{site_name}:django_domain_events_eventrecord_change", args=[event_id])
    except NoReverseMatch:
        return None


def event_link(site_name: str, event: EventRecord | None, event_id: int | None) -> SafeString | str:
    """``name #id``, linked to the event's page where there is one."""
    if event is None or event_id is None:
        return "-"
    label = f"{event.name} #{event_id}"
    url = event_url(site_name, event_id)
    if url is None:
        return label
    return format_html('<a href="{}">{}</a>', url, label)


def deliveries_url(site_name: str, **params: Any) -> str | None:
    """The deliveries list filtered by ``params``, None when it is not registered."""
    try:
        url = reverse(f"{site_name}:django_domain_events_deliveryrecord_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{urlencode(params)}" if params else url


class DeliveryColumns:
    """The columns a delivery row shows in the deliveries list and an event's inline."""

    COLUMNS = (
        "receiver_key",
        "target",
        "status_badge",
        "attempts_display",
        "due_at_shown",
        "available_at_shown",
        "completed_at_shown",
        "error_preview",
    )
    due_at_shown = shown_to_the_second("due_at", "due at")
    completed_at_shown = shown_to_the_second("completed_at", "completed at")

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: DeliveryRecord) -> SafeString:
        """The row's status in its colour."""
        return status_badge(obj.status)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: DeliveryRecord) -> str:
        """Attempts made of the budget."""
        return attempts(obj)

    @admin.display(description="available at")
    def available_at_shown(self, obj: DeliveryRecord) -> str:
        """When the row may next be claimed; nothing for a settled row."""
        return "-" if settled(obj) else when(obj.available_at)

    @admin.display(description="last error")
    def error_preview(self, obj: DeliveryRecord) -> str:
        """The start of the last error."""
        return preview(obj.last_error)
