"""The admin dashboard's data: figures, buckets, links' filters, and a fixed query count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_domain_events import drain_outbox, fire, outbox_health, receiver
from django_domain_events.admin.display import when
from django_domain_events.dashboard import outbox_dashboard
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.test_admin import row, staff_client

pytestmark = pytest.mark.django_db


def fire_one(evt: object) -> int:
    with transaction.atomic():
        event_id = fire(evt)
    assert event_id is not None
    return event_id


def rows(**filters: Any) -> int:
    return DeliveryRecord.objects.filter(**filters).count()


@pytest.mark.parametrize(
    ("last_error", "error_type"),
    [
        ("", ""),
        ("ValueError: the mail server said no", "ValueError"),
        ("KeyError", "KeyError"),
        ("expired: still owed when its lifetime ended", "expired"),
        ("x" * 300, "x" * 100),
        ("ConnectionError: refused: port 25", "ConnectionError"),
    ],
)
def test_error_type_is_last_error_up_to_its_first_colon(last_error: str, error_type: str) -> None:
    receiver(OrderPlaced, key="dash.any")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    DeliveryRecord.objects.filter(event_id=event_id).update(last_error=last_error)
    assert DeliveryRecord.objects.get(event_id=event_id).error_type == error_type


# the data ------------------------------------------------------------------------


def ok(evt: object) -> None:
    return None


def failing(evt: object) -> None:
    raise ValueError("the mail server said no")


def refused(evt: object) -> None:
    raise PermissionError("closed")


def seed_outbox() -> int:
    """Succeeded, dead (two error types), failed, owed, scheduled and slow-lane rows;
    returns the event id of the owed row, due now."""
    receiver(OrderPlaced, key="dash.ok")(ok)
    receiver(OrderPlaced, key="dash.mailer", max_attempts=1)(failing)
    receiver(OrderPlaced, key="dash.flaky", max_attempts=5)(refused)
    receiver(OrderPlaced, key="dash.reminder", due=timedelta(days=2, hours=1))(ok)
    receiver(Pinged, key="dash.slow", lane="slow", max_attempts=1)(refused)
    for order_id in (1, 2, 3):
        fire_one(OrderPlaced(order_id=order_id))
    fire_one(Pinged(n=1))
    # The flaky rows wait out their backoff; mailer and slow are dead after one attempt.
    drain_outbox(respect_backoff=True)
    return fire_one(Pinged(n=2))


@pytest.fixture
def outbox() -> dict[str, int]:
    return {"pinged": seed_outbox()}


def test_the_figures_match_health_and_the_rows(outbox: dict[str, int]) -> None:
    data = outbox_dashboard()
    assert data.health == outbox_health(now=data.now)
    assert len(data.minutes) == 60 and len(data.ages) == 5 and len(data.days) == 7
    assert data.minutes[-1].start <= data.now < data.minutes[-1].end
    assert sum(m.succeeded for m in data.minutes) == rows(status="succeeded") == 3
    assert sum(m.dead for m in data.minutes) == rows(status="dead") == 4
    assert sum(m.failed for m in data.minutes) == rows(status="failed") == 3
    assert [a.owed for a in data.ages] == [4, 0, 0, 0, 0]
    assert sum(a.owed for a in data.ages) == data.health.owed
    assert [d.scheduled for d in data.days] == [0, 0, 3, 0, 0, 0, 0]
    assert data.scheduled_later == 0
    assert [(c.name, c.dead) for c in data.dead_by_receiver] == [
        ("dash.mailer", 3),
        ("dash.slow", 1),
    ]
    assert [(c.name, c.dead) for c in data.dead_by_error_type] == [
        ("ValueError", 3),
        ("PermissionError", 1),
    ]


def test_ages_days_and_later(outbox: dict[str, int]) -> None:
    now = timezone.now()
    owed = row(outbox["pinged"], "dash.slow")
    DeliveryRecord.objects.filter(pk=owed.pk).update(due_at=now - timedelta(minutes=30))
    DeliveryRecord.objects.filter(receiver_key="dash.flaky").update(due_at=now - timedelta(days=3))
    receiver(OrderPlaced, key="dash.much_later", due=timedelta(days=20))(ok)
    fire_one(OrderPlaced(order_id=9))
    data = outbox_dashboard(now=now)
    assert [a.owed for a in data.ages] == [0, 0, 1, 0, 3]
    assert data.scheduled_later == 1
    assert sum(d.scheduled for d in data.days) + data.scheduled_later == data.health.scheduled


def _dashboard_queries() -> int:
    with CaptureQueriesContext(connection) as captured:
        outbox_dashboard()
    return len(captured.captured_queries)


def test_the_query_count_does_not_grow_with_the_rows() -> None:
    empty = _dashboard_queries()
    receiver(OrderPlaced, key="dash.ok")(ok)
    receiver(OrderPlaced, key="dash.mailer", max_attempts=1)(failing)
    receiver(OrderPlaced, key="dash.flaky", max_attempts=5)(refused)
    receiver(OrderPlaced, key="dash.reminder", due=timedelta(days=3))(ok)
    receiver(OrderPlaced, key="dash.much_later", due=timedelta(days=30))(ok)
    for order_id in range(60):
        fire_one(OrderPlaced(order_id=order_id))
    drain_outbox(respect_backoff=True)
    for order_id in range(20):
        fire_one(OrderPlaced(order_id=order_id))
    assert rows() == 400
    assert _dashboard_queries() == empty == 10


# the page ------------------------------------------------------------------------


DASHBOARD_URL = reverse("admin:django_domain_events_deliveryrecord_dashboard")


def test_the_page_and_its_fragment(admin_client, outbox: dict[str, int]) -> None:
    response = admin_client.get(DASHBOARD_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<h1>Outbox dashboard</h1>" in html
    assert "django_domain_events/dashboard.js" in html
    assert html.count('class="dde-bar"') == 60 + 5 + 7 + 2 + 2
    assert 'data-figure="dead"><span class="dde-figure">4</span>' in html
    fragment = admin_client.get(DASHBOARD_URL, {"fragment": "1"})
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert "<html" not in body and "<h1>" not in body
    assert body.count('class="dde-bar"') == 60 + 5 + 7 + 2 + 2


def test_a_viewer_sees_it_and_others_get_403(outbox: dict[str, int]) -> None:
    viewer = staff_client("view_deliveryrecord")
    assert viewer.get(DASHBOARD_URL).status_code == 200
    assert staff_client("change_deliveryrecord").get(DASHBOARD_URL).status_code == 200
    for client in (staff_client(), staff_client("view_eventrecord")):
        assert client.get(DASHBOARD_URL).status_code == 403
        assert client.get(DASHBOARD_URL, {"fragment": "1"}).status_code == 403
    # Not logged in: the admin's login page.
    response = Client().get(DASHBOARD_URL)
    assert response.status_code == 302 and "/login/" in response["Location"]
    # The app page links to it for those who may see it.
    app_page = reverse("admin:app_list", args=["django_domain_events"])
    assert DASHBOARD_URL in viewer.get(app_page).content.decode()


def test_the_admin_index_lists_the_dashboard_for_who_may_see_it() -> None:
    entry = reverse("admin:django_domain_events_outboxdashboard_changelist")
    viewer = staff_client("view_deliveryrecord")
    index = viewer.get(reverse("admin:index")).content.decode()
    assert entry in index and "Outbox dashboard" in index
    response = viewer.get(entry)
    assert response.status_code == 302 and response["Location"] == DASHBOARD_URL
    other = staff_client("view_eventrecord")
    assert entry not in other.get(reverse("admin:index")).content.decode()
    assert other.get(entry).status_code == 403


def test_page_queries_do_not_grow_with_rows(admin_client) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(DASHBOARD_URL, {"fragment": "1"}).status_code == 200
        return len(captured.captured_queries)

    receiver(OrderPlaced, key="dash.ok")(ok)
    receiver(OrderPlaced, key="dash.mailer", max_attempts=1)(failing)
    queries()  # the session, the user: loaded once
    empty = queries()
    for order_id in range(30):
        fire_one(OrderPlaced(order_id=order_id))
    drain_outbox()
    assert queries() == empty


# limits --------------------------------------------------------------------------


def slow_down(evt: object) -> None:
    from django_domain_events import RetryAfter

    raise RetryAfter(600, "the gateway says slow down")


def seed_limits() -> None:
    """A rate-and-concurrency limit with one row running and three waiting, and a
    concurrency limit paused by its receiver's RetryAfter."""
    from django_domain_events import deliver_pending
    from django_domain_events.delivery.claim import claim_batch

    receiver(OrderPlaced, key="dash.gateway", concurrency_limit=2)(slow_down)
    fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    receiver(Pinged, key="dash.sms", rate_limit="2/s", concurrency_limit=3)(ok)
    for n in range(4):
        fire_one(Pinged(n=n))
    claimed = claim_batch(worker_id="w", now=timezone.now(), lease=600, limit=50)
    assert [c.receiver_key for c in claimed] == ["dash.sms"]  # the bucket's one token


def limit_cells(html: str, key: str) -> dict[str, str]:
    """The figures of one line of the limits table: ``data-figure`` to its text."""
    import re

    line = re.search(rf'<tr data-limit="{re.escape(key)}">(.*?)</tr>', html, re.S)
    assert line is not None, html
    cells = re.findall(r'data-figure="(\w+)"[^>]*>(.*?)</td>', line.group(1), re.S)
    return {name: re.sub(r"<[^>]+>", "", text).strip() for name, text in cells}


@pytest.mark.django_db(transaction=True)
def test_the_limits_table_shows_each_limit_its_use_and_what_waits(admin_client) -> None:
    seed_limits()
    body = admin_client.get(DASHBOARD_URL, {"fragment": "1"}).content.decode()
    sms = limit_cells(body, "dash.sms")
    assert (sms["rate"], sms["concurrency"], sms["running"], sms["waiting"]) == (
        "2/s",
        "3",
        "1",
        "3",
    )
    assert 0 <= float(sms["tokens"]) <= 1 and sms["paused_until"] == "-"
    gateway = limit_cells(body, "dash.gateway")
    assert (gateway["rate"], gateway["tokens"], gateway["concurrency"]) == ("-", "-", "2")
    assert (gateway["running"], gateway["waiting"]) == ("0", "1")
    (paused,) = [s.paused_until for s in outbox_health().limits if s.key == "dash.gateway"]
    assert paused is not None and gateway["paused_until"] == when(paused)
    # Each count links to its rows in the deliveries list.
    assert "receiver=dash.sms" in body and "status__in=pending%2Cfailed" in body


@pytest.mark.django_db(transaction=True)
def test_without_limits_the_dashboard_says_so(admin_client) -> None:
    receiver(OrderPlaced, key="dash.ok")(ok)
    body = admin_client.get(DASHBOARD_URL, {"fragment": "1"}).content.decode()
    assert 'id="dde-limits"' not in body and "No limit is declared" in body


@pytest.mark.django_db(transaction=True)
def test_limits_cost_the_dashboard_two_queries_whatever_the_rows() -> None:
    receiver(Pinged, key="dash.sms", rate_limit="2/s", concurrency_limit=3)(ok)
    few = _dashboard_queries()
    seed_limits()
    for n in range(30):
        fire_one(Pinged(n=n))
    assert _dashboard_queries() == few == 12
