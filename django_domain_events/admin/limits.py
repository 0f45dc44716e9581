"""The receivers' rate and concurrency limits: declared, used now, and what waits for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from .. import clock
from ..introspect import LimitStatus, limit_status
from ..models import DeliveryRecord, DeliveryStatus, LimitRecord, database_alias
from .display import when
from .readonly import ReadOnly

if TYPE_CHECKING:
    _LimitAdminBase = admin.ModelAdmin[LimitRecord]
else:
    _LimitAdminBase = admin.ModelAdmin


def _status(row: LimitRecord) -> LimitStatus | None:
    """The row's limit as ``outbox_health()`` reports it (None: no longer declared)."""
    alias = database_alias()
    now = clock.now()
    waiting = (
        DeliveryRecord.objects.using(alias)
        .filter(receiver_key=row.key, status__in=[DeliveryStatus.PENDING, DeliveryStatus.FAILED])
        .filter(available_at__lte=now)
        .count()
    )
    found = [s for s in limit_status(alias, now, {row.key: waiting}) if s.key == row.key]
    return found[0] if found else None


class LimitRecordAdmin(ReadOnly, _LimitAdminBase):
    """Each limited receiver: its limits, the rows running and waiting, its pause."""

    list_display = ("key", "limits_shown", "running_shown", "waiting_shown", "paused_shown")
    search_fields = ("key",)
    ordering = ("key",)

    @admin.display(description="limits")
    def limits_shown(self, row: LimitRecord) -> str:
        status = _status(row)
        if status is None:
            return "not declared by this process"
        parts = []
        if status.rate_limit is not None:
            parts.append(f"rate {status.rate_limit} ({status.tokens or 0:.1f} tokens now)")
        if status.concurrency_limit is not None:
            parts.append(f"at most {status.concurrency_limit} at once")
        return ", ".join(parts)

    @admin.display(description="running now")
    def running_shown(self, row: LimitRecord) -> str:
        status = _status(row)
        return "-" if status is None else str(status.running)

    @admin.display(description="waiting (due, unclaimed)")
    def waiting_shown(self, row: LimitRecord) -> str:
        status = _status(row)
        return "-" if status is None else str(status.waiting)

    @admin.display(description="paused until")
    def paused_shown(self, row: LimitRecord) -> str:
        status = _status(row)
        return "-" if status is None or status.paused_until is None else when(status.paused_until)
