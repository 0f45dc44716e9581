"""The admin at its edges: crafted query strings, the dashboard entry's missing pages,
one permission for a cancel wherever it starts, no payload read for a list, and the
dashboard's query count as the docs state it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_domain_events import clock, fire_due_ticks, recurring
from django_domain_events.dashboard import outbox_dashboard
from django_domain_events.delivery.ticks import sync_schedules
from django_domain_events.models import DeliveryRecord
from tests.app.events import ReportDue
from tests.test_admin import (
    DELIVERIES_URL,
    EVENTS_URL,
    admin_client_,
    outcomes,
    run_action,
    staff_client,
)

__all__ = ["admin_client_", "outcomes"]  # the fixtures

pytestmark = pytest.mark.django_db

TICKS_URL = reverse("admin:django_domain_events_tickrecord_changelist")

CRAFTED = [
    (DELIVERIES_URL, "due_at__lte=garbage"),
    (DELIVERIES_URL, "completed_at__gte=2026-13-45T99:00:00"),
    (DELIVERIES_URL, "claimed_at__lt=%00"),
    (DELIVERIES_URL, "receiver=%00x"),
    (DELIVERIES_URL, "error_type=%00x"),
    (DELIVERIES_URL, "event_name=%00x"),
    (EVENTS_URL, "receiver=%00x"),
    (EVENTS_URL, "event_name=%00x"),
    (EVENTS_URL, "delivery_status=%00x"),
    (TICKS_URL, "schedule=%00x"),
    (DELIVERIES_URL, "q=%00"),
    (EVENTS_URL, "q=%00"),
]


@pytest.mark.parametrize(("url", "query"), CRAFTED)
def test_a_crafted_filter_value_is_ignored(admin_client_: Client, outcomes, url, query) -> None:
    plain = admin_client_.get(url)
    response = admin_client_.get(f"{url}?{query}")
    assert response.status_code == 200
    listed = [obj.pk for obj in response.context["cl"].result_list]
    assert listed == [obj.pk for obj in plain.context["cl"].result_list]


def test_a_good_bound_beside_a_bad_one_still_filters(admin_client_: Client, outcomes) -> None:
    response = admin_client_.get(
        DELIVERIES_URL, {"due_at__lte": "2000-01-01T00:00:00+00:00", "due_at__gt": "x"}
    )
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_the_dashboard_entry_has_no_page_of_its_own(admin_client_: Client, outcomes) -> None:
    pk = DeliveryRecord.objects.values_list("pk", flat=True).first()
    base = "/admin/django_domain_events/outboxdashboard"
    for page in (f"{pk}/change/", f"{pk}/history/", f"{pk}/delete/", f"{pk}/", "add/"):
        response = admin_client_.get(f"{base}/{page}")
        assert response.status_code in (301, 302, 404), page
        if response.status_code != 404:  # Django's catch-all redirect, to a 404
            assert admin_client_.get(response["Location"]).status_code == 404, page
    entry = reverse("admin:django_domain_events_outboxdashboard_changelist")
    assert admin_client_.get(entry).status_code == 302


def test_cancel_from_either_list_needs_the_deliveries_change_permission(outcomes) -> None:
    events_only = staff_client("view_eventrecord", "change_eventrecord")
    run_action(events_only, EVENTS_URL, "cancel_owed_deliveries", [outcomes["first"]])
    assert not DeliveryRecord.objects.filter(status="cancelled").exists()

    deliveries = staff_client("view_eventrecord", "change_deliveryrecord")
    response = run_action(deliveries, EVENTS_URL, "cancel_owed_deliveries", [outcomes["first"]])
    assert response.status_code == 200
    assert DeliveryRecord.objects.filter(event_id=outcomes["first"], status="cancelled").exists()


def test_the_deliveries_list_reads_no_payload(admin_client_: Client, outcomes) -> None:
    with CaptureQueriesContext(connection) as captured:
        response = admin_client_.get(DELIVERIES_URL)
    assert response.status_code == 200 and len(response.context["cl"].result_list) > 3
    listed = [q["sql"] for q in captured.captured_queries if "receiver_key" in q["sql"]]
    assert listed
    assert not [sql for sql in listed if re.search(r"\bpayload\b", sql)]


def _dashboard_queries() -> int:
    with CaptureQueriesContext(connection) as captured:
        outbox_dashboard()
    return len(captured.captured_queries)


def test_the_dashboard_costs_ten_queries_and_up_to_two_more_with_schedules() -> None:
    assert _dashboard_queries() == 10

    @recurring(every=timedelta(hours=1), key="edges.hourly")
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    assert _dashboard_queries() == 11  # the cursor rows
    now = clock.now()
    sync_schedules(now)
    assert fire_due_ticks(now + timedelta(hours=1, minutes=1)) == 1
    assert _dashboard_queries() == 12  # and their newest ticks
