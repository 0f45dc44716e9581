"""The outbox dashboard's page: the figures of ``outbox_dashboard()`` as totals, tables
and charts, each figure linked to the deliveries list filtered to the rows behind it.

:func:`dashboard_context` builds the page from one small function per figure or chart,
each given a :class:`_Links` that turns filters into changelist URLs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from ..dashboard import Dashboard, DeadCount, outbox_dashboard
from ..declare import registry
from ..introspect import LaneBacklog, LimitStatus, ReceiverBacklog
from ..models import OWED_VALUES, DeliveryRecord, DeliveryStatus
from .charts import CHART_COLOURS, Column, columns, rows_chart
from .display import deliveries_url, when

#: How often the dashboard fetches its figures again; ``?refresh=N`` overrides it.
DASHBOARD_REFRESH_SECONDS = 10
#: Rows of the dead-letter charts; the rest are summed in a last bar.
DEAD_BARS = 10

_OWED_PARAM = ",".join(OWED_VALUES)
_WAITING_PARAM = f"{DeliveryStatus.PENDING.value},{DeliveryStatus.FAILED.value}"


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


@dataclass(frozen=True)
class _Links:
    """The deliveries list's URL for each kind of figure, at one moment."""

    site_name: str
    now: datetime

    def url(self, **params: Any) -> str | None:
        return deliveries_url(self.site_name, **params)

    @property
    def owed(self) -> dict[str, str]:
        return {"status__in": _OWED_PARAM, "due_at__lte": _t(self.now)}

    @property
    def scheduled(self) -> dict[str, str]:
        return {"status__exact": DeliveryStatus.PENDING.value, "due_at__gt": _t(self.now)}

    @property
    def claimed(self) -> dict[str, str]:
        return {"status__exact": DeliveryStatus.CLAIMED.value}

    @property
    def dead(self) -> dict[str, str]:
        return {"status__exact": DeliveryStatus.DEAD.value}


def _totals(data: Dashboard, links: _Links) -> list[tuple[str, str, int, str | None]]:
    """The five headline figures: (css, label, count, link)."""
    health, url = data.health, links.url
    lapsed = url(**links.claimed, available_at__lte=_t(data.now))
    return [
        ("owed", "owed", health.owed, url(**links.owed)),
        ("scheduled", "scheduled", health.scheduled, url(**links.scheduled)),
        ("claimed", "claimed", health.claimed, url(**links.claimed)),
        ("dead", "dead", health.dead, url(**links.dead)),
        ("lapsed_leases", "lapsed leases", health.lapsed_leases, lapsed),
    ]


def _row(figures: ReceiverBacklog | LaneBacklog, links: _Links, **where: str) -> dict[str, Any]:
    """A table row's counts (of a receiver or a lane), each linked to its rows."""
    url = links.url
    return {
        "owed": figures.owed,
        "owed_url": url(**links.owed, **where),
        "scheduled": figures.scheduled,
        "scheduled_url": url(**links.scheduled, **where),
        "claimed": figures.claimed,
        "claimed_url": url(**links.claimed, **where),
        "dead": figures.dead,
        "dead_url": url(**links.dead, **where),
        "age": _age(links.now, figures.oldest_owed_at),
    }


def _receivers(data: Dashboard, links: _Links) -> list[dict[str, Any]]:
    """The table of receivers, with the lane each is declared on."""
    lane_of = {key: lane for lane, keys in registry.lanes().items() for key in keys}
    return [
        {
            "key": r.key,
            "lane": lane_of.get(r.key, "not declared by this relay"),
            **_row(r, links, receiver=r.key),
        }
        for r in data.health.receivers
    ]


def _lanes(data: Dashboard, links: _Links) -> list[dict[str, Any]]:
    """The table of lanes, with the relays pausing each."""
    return [
        {
            "lane": lane.lane,
            **_row(lane, links, lane=lane.lane),
            "pauses": [f"{pause.worker_id} until {when(pause.until)}" for pause in lane.pauses],
        }
        for lane in data.health.lanes
    ]


def _held_keys(data: Dashboard, links: _Links) -> list[dict[str, Any]]:
    """Ordered keys held behind a head that cannot run, each linked to its rows."""
    return [
        {
            "receiver": held.receiver_key,
            "key": held.order_key,
            "head": held.delivery_id,
            "why": held.why,
            "waiting": held.waiting,
            "url": links.url(receiver=held.receiver_key, order_key=held.order_key),
        }
        for held in data.health.held_keys
    ]


def _limits(data: Dashboard, links: _Links) -> list[dict[str, Any]]:
    """The table of limits: each declared limit, its use now and the rows waiting for it,
    the counts linked to those rows."""
    url = links.url
    waiting = {"status__in": _WAITING_PARAM, "due_at__lte": _t(links.now)}
    return [
        {
            "key": limit.key,
            "members": "" if limit.kind == "receiver" else ", ".join(limit.members) or "-",
            "rate": limit.rate_limit or "-",
            "tokens": "-" if limit.tokens is None else f"{limit.tokens:.1f}",
            "concurrency": "-" if limit.concurrency_limit is None else limit.concurrency_limit,
            "running": limit.running,
            "running_url": url(**links.claimed, **_limit_rows(limit)),
            "waiting": limit.waiting,
            "waiting_url": url(**waiting, **_limit_rows(limit)),
            "paused_until": when(limit.paused_until),
        }
        for limit in data.health.limits
    ]


def _limit_rows(limit: LimitStatus) -> dict[str, str]:
    """The deliveries list's filter for a limit's rows: its receiver, group or lane."""
    if limit.kind == "group":
        return {"limit_group": limit.key.removeprefix("group:")}
    if limit.kind == "lane":
        return {"lane": limit.key.removeprefix("lane:")}
    return {"receiver": limit.key}


def _minutes_chart(data: Dashboard, links: _Links) -> dict[str, Any]:
    """Deliveries per minute over the last hour: succeeded, failed and dead stacked."""
    url = links.url
    bars: list[Column] = []
    for minute in data.minutes:
        span = {"completed_at__gte": _t(minute.start), "completed_at__lt": _t(minute.end)}
        tried = {"claimed_at__gte": _t(minute.start), "claimed_at__lt": _t(minute.end)}
        at = when(minute.start)[11:16]
        bars.append(
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
                        url(status__exact="failed", **tried),
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
    ticks = {i: bars[i][0] for i in range(0, len(bars), 10)}
    ticks[len(bars) - 1] = bars[-1][0]
    return columns("minutes", "Deliveries per minute, the last hour", bars, ticks)


def _ages_chart(data: Dashboard, links: _Links) -> dict[str, Any]:
    """The owed backlog by how long it has been due."""
    bars: list[Column] = []
    for age in data.ages:
        span = {"due_at__lte": _t(age.due_until)}
        if age.due_after is not None:
            span["due_at__gt"] = _t(age.due_after)
        link = links.url(status__in=_OWED_PARAM, **span)
        bars.append((age.label, [("owed", age.owed, link, f"{age.label}: {age.owed}")]))
    return columns("ages", "Owed backlog by age", bars, dict(enumerate(a[0] for a in bars)))


def _days_chart(data: Dashboard, links: _Links) -> dict[str, Any]:
    """The work scheduled for each of the next seven days."""
    bars: list[Column] = []
    for index, day in enumerate(data.days):
        label = "today" if index == 0 else when(day.start)[5:10]
        start = {"due_at__gt": _t(data.now)} if index == 0 else {"due_at__gte": _t(day.start)}
        link = links.url(status__exact="pending", due_at__lt=_t(day.end), **start)
        title = f"{when(day.start)} to {when(day.end)}: {day.scheduled}"
        bars.append((label, [("scheduled", day.scheduled, link, title)]))
    title = "Scheduled work by due day, the next 7 days"
    return columns("days", title, bars, dict(enumerate(d[0] for d in bars)))


def _top(
    counts: Iterable[DeadCount], url_of: Callable[[str], str | None], others_url: str | None
) -> list[tuple[str, int, str | None]]:
    listed = list(counts)
    rows = [(c.name or "(no error recorded)", c.dead, url_of(c.name)) for c in listed[:DEAD_BARS]]
    rest = sum(c.dead for c in listed[DEAD_BARS:])
    if rest:
        rows.append((f"{len(listed) - DEAD_BARS} more", rest, others_url))
    return rows


def _dead_charts(data: Dashboard, links: _Links) -> list[dict[str, Any]]:
    """Dead letters by receiver and by error type, the most first."""
    url, dead = links.url, links.dead
    by_receiver = _top(data.dead_by_receiver, lambda key: url(**dead, receiver=key), url(**dead))
    by_type = _top(data.dead_by_error_type, lambda kind: url(**dead, error_type=kind), url(**dead))
    return [
        rows_chart("dead_receivers", "Dead letters by receiver", by_receiver, "dead"),
        rows_chart("dead_types", "Dead letters by error type", by_type, "dead"),
    ]


def _time_zone() -> str:
    if settings.USE_TZ:
        return timezone.get_current_timezone_name()
    return str(settings.TIME_ZONE)


def dashboard_context(data: Dashboard, site_name: str) -> dict[str, Any]:
    """What the dashboard templates draw from ``outbox_dashboard()``: totals, tables and
    charts, each figure with the changelist URL of the rows behind it."""
    now = data.now
    links = _Links(site_name, now)
    charts = [
        _minutes_chart(data, links),
        _ages_chart(data, links),
        _days_chart(data, links),
        *_dead_charts(data, links),
    ]
    later_from = _t(data.days[-1].end) if data.days else _t(now)
    return {
        "now": when(now),
        "time_zone": _time_zone(),
        "totals": _totals(data, links),
        "oldest_age": _age(now, data.health.oldest_owed_at),
        "oldest_url": links.url(**links.owed, o="due_at"),
        "receivers": _receivers(data, links),
        "lanes": _lanes(data, links),
        "held_keys": _held_keys(data, links),
        "limits": _limits(data, links),
        "charts": {chart["name"]: chart for chart in charts},
        "chart_list": charts,
        "scheduled_later": data.scheduled_later,
        "scheduled_later_url": links.url(status__exact="pending", due_at__gte=later_from),
        "legend": [(css, CHART_COLOURS[css]) for css in ("succeeded", "failed", "dead")],
    }


def _refresh_seconds(request: HttpRequest) -> int:
    try:
        asked = int(request.GET.get("refresh", DASHBOARD_REFRESH_SECONDS))
    except ValueError:
        asked = DASHBOARD_REFRESH_SECONDS
    return min(max(asked, 1), 3600)


def dashboard_view(model_admin: admin.ModelAdmin[Any], request: HttpRequest) -> HttpResponse:
    """The dashboard page, or with ``?fragment=1`` its figures alone (what the page
    fetches to refresh itself), for whoever may view deliveries."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    figures = dashboard_context(outbox_dashboard(), model_admin.admin_site.name)
    if request.GET.get("fragment"):
        return TemplateResponse(
            request, "django_domain_events/admin/dashboard_figures.html", figures
        )
    context = {
        **model_admin.admin_site.each_context(request),
        **figures,
        "title": "Outbox dashboard",
        "opts": model_admin.opts,
        "refresh_seconds": _refresh_seconds(request),
        "fragment_url": f"{request.path}?{urlencode({'fragment': 1})}",
        "deliveries_url": deliveries_url(model_admin.admin_site.name),
    }
    return TemplateResponse(request, "django_domain_events/admin/dashboard.html", context)


class OutboxDashboardAdmin(admin.ModelAdmin):
    """The dashboard's entry on the admin index: it opens the deliveries admin's dashboard
    for whoever may view deliveries, and has no page of its own (no change, history or
    delete view: the entry is a proxy with no rows to show)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = DeliveryRecord._meta
        return bool(request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        from django.urls import path

        opts = self.opts
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name=f"{opts.app_label}_{opts.model_name}_changelist")]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        opts = DeliveryRecord._meta
        name = f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dashboard"
        return HttpResponseRedirect(reverse(name))
