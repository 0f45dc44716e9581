"""The rate and concurrency limits of receivers, groups and lanes: declared, used now,
and what waits for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import Count

from .. import clock
from ..delivery import limits
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
    members = [k for lm in limits.every_declared() if lm.key == row.key for k in lm.members]
    waiting = (
        DeliveryRecord.objects.using(alias)
        .filter(receiver_key__in=members)
        .filter(status__in=[DeliveryStatus.PENDING, DeliveryStatus.FAILED])
        .filter(available_at__lte=now)
        .values("receiver_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    by_key = {counted["receiver_key"]: counted["n"] for counted in waiting}
    found = [s for s in limit_status(alias, now, by_key) if s.key == row.key]
    return found[0] if found else None


class LimitRecordAdmin(ReadOnly, _LimitAdminBase):
    """Each limit (a receiver's, a group's, a lane's): the receivers it holds, its limits,
    the rows running and waiting, its pause."""

    list_display = (
        "key",
        "holds_shown",
        "limits_shown",
        "running_shown",
        "waiting_shown",
        "paused_shown",
    )
    search_fields = ("key",)
    ordering = ("key",)

    @admin.display(description="holds")
    def holds_shown(self, row: LimitRecord) -> str:
        status = _status(row)
        if status is None or status.kind == "receiver":
            return "this receiver" if status is not None else "-"
        return f"{status.kind}: {', '.join(status.members) or 'no receiver'}"

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
