"""The admin's schedules and ticks: read-only lists, and the Pause and Resume actions."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.messages import constants as message_levels
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_domain_events import clock, fire_due_ticks, pause_schedule, recurring
from django_domain_events.admin import when
from django_domain_events.models import EventRecord, ScheduleRecord, TickRecord, TickStatus
from django_domain_events.recurrence import aware, schedules
from tests.app.events import ReportDue
from tests.test_admin import admin_client_, run_action, sent_messages, staff_client, text

__all__ = ["admin_client_"]  # the fixture, shared with test_admin.py

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULES_URL = reverse("admin:django_domain_events_schedulerecord_changelist")
TICKS_URL = reverse("admin:django_domain_events_tickrecord_changelist")


def declare(key: str, *, fails: bool = False) -> str:
    @recurring(every=timedelta(minutes=1), key=key)
    def build(tick: datetime) -> ReportDue:
        if fails:
            raise RuntimeError("the report server is down")
        return ReportDue(tick=tick.isoformat())

    return key


@pytest.fixture
def ticked() -> datetime:
    """Three schedules with fired, skipped and failed ticks; one no longer declared."""
    base = aware(clock.now()).replace(second=0, microsecond=0) - timedelta(hours=1)
    declare("adm.report")
    declare("adm.flaky", fails=True)
    declare("adm.gone")
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + timedelta(minutes=3, seconds=5))
    schedules.remove("adm.gone")
    return base


def test_schedules_list_shows_each_cursor(admin_client_: Client, ticked: datetime) -> None:
    response = admin_client_.get(SCHEDULES_URL)
    assert response.status_code == 200
    page = text(response)
    assert "Select schedule to view" in page
    for key in ("adm.report", "adm.flaky", "adm.gone"):
        assert key in page
    assert "every 0:01:00" in page
    assert "adm.gone (not declared)" in page
    assert when(clock.normalize(ticked + timedelta(minutes=3))) in page  # the last tick
    assert "schedulerecord/add/" not in response.content.decode()


def test_pause_and_resume_actions(admin_client_: Client, ticked: datetime) -> None:
    response = run_action(admin_client_, SCHEDULES_URL, "pause_selected_schedules", ["adm.report"])
    assert sent_messages(response) == [(message_levels.SUCCESS, "Paused adm.report.")]
    row = ScheduleRecord.objects.get(key="adm.report")
    assert row.paused_at is not None and row.next_tick_at is None
    assert "paused since" in text(response)

    response = run_action(
        admin_client_, SCHEDULES_URL, "pause_selected_schedules", ["adm.report", "adm.flaky"]
    )
    assert sent_messages(response) == [
        (message_levels.SUCCESS, "Paused adm.flaky; adm.report was already paused.")
    ]

    response = run_action(admin_client_, SCHEDULES_URL, "resume_selected_schedules", ["adm.report"])
    assert sent_messages(response) == [(message_levels.SUCCESS, "Resumed adm.report.")]
    assert ScheduleRecord.objects.get(key="adm.report").paused_at is None
    response = run_action(admin_client_, SCHEDULES_URL, "resume_selected_schedules", ["adm.report"])
    assert sent_messages(response) == [
        (message_levels.WARNING, "Nothing was resumed: adm.report was not paused.")
    ]


def test_an_undeclared_schedule_is_refused_and_nothing_applied(
    admin_client_: Client, ticked: datetime
) -> None:
    response = run_action(
        admin_client_, SCHEDULES_URL, "pause_selected_schedules", ["adm.report", "adm.gone"]
    )
    [(level, message)] = sent_messages(response)
    assert level == message_levels.ERROR
    assert message.startswith("Nothing was paused: No @recurring schedule has the key 'adm.gone'")
    assert not ScheduleRecord.objects.filter(paused_at__isnull=False).exists()


def test_schedule_actions_need_the_change_permission(ticked: datetime) -> None:
    viewer = staff_client("view_schedulerecord")
    page = viewer.get(SCHEDULES_URL)
    assert page.status_code == 200
    assert "pause_selected_schedules" not in page.content.decode()
    viewer.post(
        SCHEDULES_URL,
        {"action": "pause_selected_schedules", "_selected_action": ["adm.report"], "index": "0"},
    )
    assert ScheduleRecord.objects.get(key="adm.report").paused_at is None
    changer = staff_client("view_schedulerecord", "change_schedulerecord")
    response = run_action(changer, SCHEDULES_URL, "pause_selected_schedules", ["adm.report"])
    assert sent_messages(response) == [(message_levels.SUCCESS, "Paused adm.report.")]


def test_schedule_page_is_read_only(admin_client_: Client, ticked: datetime) -> None:
    url = reverse("admin:django_domain_events_schedulerecord_change", args=["adm.report"])
    response = admin_client_.get(url)
    assert response.status_code == 200
    page = text(response)
    assert "View schedule" in page and "every 0:01:00" in page
    assert 'name="_save"' not in response.content.decode()
    before = ScheduleRecord.objects.get(key="adm.report")
    admin_client_.post(url, {"spec": "every 0:05:00"})
    assert ScheduleRecord.objects.get(key="adm.report").spec == before.spec
    add = reverse("admin:django_domain_events_schedulerecord_add")
    assert admin_client_.get(add).status_code == 403


def test_ticks_list_links_events_and_filters_by_status_and_schedule(
    admin_client_: Client, ticked: datetime
) -> None:
    response = admin_client_.get(TICKS_URL)
    assert response.status_code == 200
    page = text(response)
    assert "Select tick to view" in page
    rows = response.context["cl"].result_list
    assert {(t.schedule_key, t.status) for t in rows} == {
        ("adm.report", "fired"),
        ("adm.report", "skipped"),
        ("adm.flaky", "failed"),
        ("adm.flaky", "skipped"),
        ("adm.gone", "fired"),
        ("adm.gone", "skipped"),
    }
    fired = TickRecord.objects.get(schedule_key="adm.report", status=TickStatus.FIRED)
    event = reverse("admin:django_domain_events_eventrecord_change", args=[fired.event_id])
    assert f'href="{event}"' in response.content.decode()
    assert "RuntimeError: the report server is down" in page

    failed = admin_client_.get(TICKS_URL, {"status__exact": "failed"})
    assert [t.schedule_key for t in failed.context["cl"].result_list] == ["adm.flaky"]
    mine = admin_client_.get(TICKS_URL, {"schedule": "adm.report"})
    assert {t.status for t in mine.context["cl"].result_list} == {"fired", "skipped"}
    filters = text(admin_client_.get(TICKS_URL))
    assert "adm.report" in filters and "adm.gone (not declared)" in filters

    page = admin_client_.get(
        reverse("admin:django_domain_events_tickrecord_change", args=[fired.pk])
    )
    assert page.status_code == 200
    assert "View tick" in text(page) and f"ReportDue #{fired.event_id}" in text(page)
    assert 'name="_save"' not in page.content.decode()
    assert (
        admin_client_.get(reverse("admin:django_domain_events_tickrecord_add")).status_code == 403
    )


def test_ticks_list_queries_do_not_grow_with_rows(admin_client_: Client) -> None:
    declare("adm.report")
    base = aware(clock.now()).replace(second=0, microsecond=0) - timedelta(hours=3)
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + timedelta(minutes=1, seconds=5))
    with CaptureQueriesContext(connection) as few:
        admin_client_.get(TICKS_URL)
    for minute in range(2, 40):
        fire_due_ticks(now=base + timedelta(minutes=minute, seconds=5))
    assert EventRecord.objects.count() == 39
    with CaptureQueriesContext(connection) as many:
        admin_client_.get(TICKS_URL)
    assert len(many) == len(few)


def test_admin_pause_is_the_operation(admin_client_: Client, ticked: datetime) -> None:
    pause_schedule("adm.flaky")
    response = admin_client_.get(SCHEDULES_URL, {"paused": "yes"})
    assert [s.key for s in response.context["cl"].result_list] == ["adm.flaky"]
