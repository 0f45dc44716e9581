"""What the operators' actions share: the errors an operation refuses with, the selected
ids, and the report of a cancel (the events and the deliveries lists both cancel)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ..codec import PayloadUpgradeFailed
from ..models import DeliveryRecord
from .display import plural

#: What an operation raises for a selection it refuses (an event no longer declared or
#: pruned meanwhile, a payload that no longer decodes): reported, with nothing applied.
REFUSED = (LookupError, ValueError, TypeError, PayloadUpgradeFailed)


def ids_of(queryset: QuerySet[Any]) -> list[int]:
    """The selected rows' ids, sorted (the order operations lock in)."""
    return sorted(queryset.order_by().values_list("pk", flat=True).distinct())


def may_cancel(request: HttpRequest) -> bool:
    """Whether the user may cancel deliveries: the change permission on deliveries,
    whichever list the cancel starts from."""
    opts = DeliveryRecord._meta
    return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


def report_cancel(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    result: dict[str, int],
    *,
    settled: int,
    of: str,
) -> None:
    """Say what a cancel did: cancelled, left to their workers, skipped as settled."""
    cancelled, in_flight = result["cancelled"], result["in_flight"]
    parts = [f"Cancelled {plural(cancelled, 'delivery', 'deliveries')}{of}"]
    if in_flight:
        left = "was left to its worker" if in_flight == 1 else "were left to their workers"
        parts.append(f"{in_flight} in flight {left}")
    if settled > 0:
        verb = "was" if settled == 1 else "were"
        parts.append(f"{settled} already settled {verb} skipped")
    level = messages.SUCCESS if cancelled else messages.WARNING
    model_admin.message_user(request, "; ".join(parts) + ".", level)
