"""The admin of dead inbox entries: consumed messages the inbox could not record.

Read-only like the rest of the admin: the raw message is shown as it arrived (headers,
attributes, body) with its reason. The one action, **Retry selected dead inbox
entries**, goes through ``inbox.retry_dead_messages`` (as ``dead_letters retry --inbox``
does) and needs the change permission; an entry that now records becomes an event and
leaves the list. Registered by the package's ``__init__`` when the admin is installed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ..inbox import DEAD, RECORDED, inbox_entry, retry_dead_messages
from ..models import DeadMessage
from .readonly import ReadOnly

if TYPE_CHECKING:
    _DeadMessageAdminBase = admin.ModelAdmin[DeadMessage]
else:
    _DeadMessageAdminBase = admin.ModelAdmin


class DeadMessageAdmin(ReadOnly, _DeadMessageAdminBase):
    """Dead inbox entries: filtered by subscription and type, searched by reason, id or
    source; the rows open view-only."""

    list_display = ("received_at", "subscription", "type", "source", "message_id", "reason")
    list_filter = ("subscription", "broker", "type")
    search_fields = ("reason", "message_id", "source", "type")
    ordering = ("-received_at", "-id")
    actions = ["retry_selected"]
    fields = (
        "subscription",
        "broker",
        "source",
        "message_id",
        "type",
        "reason",
        "received_at",
        "retried_at",
        "shown_attributes",
        "shown_headers",
        "shown_body",
    )
    readonly_fields = fields

    @admin.display(description="attributes")
    def shown_attributes(self, entry: DeadMessage) -> str:
        return format_html("<pre>{}</pre>", json.dumps(entry.attributes, indent=2))

    @admin.display(description="headers")
    def shown_headers(self, entry: DeadMessage) -> str:
        return format_html("<pre>{}</pre>", json.dumps(entry.headers, indent=2))

    @admin.display(description="body")
    def shown_body(self, entry: DeadMessage) -> str:
        shown = inbox_entry(entry)
        if "body" in shown:
            return format_html("<pre>{}</pre>", shown["body"][:20_000])
        return format_html("<pre>base64: {}</pre>", shown["body_base64"][:20_000])

    @admin.action(description="Retry selected dead inbox entries", permissions=["change"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[DeadMessage]) -> None:
        counts = retry_dead_messages(ids=list(queryset.values_list("pk", flat=True)))
        recorded, still = counts[RECORDED], counts[DEAD]
        level = messages.SUCCESS if recorded else messages.WARNING
        self.message_user(
            request,
            f"Recorded {recorded} as events; {still} could still not be recorded "
            "(their reason is updated).",
            level,
        )
