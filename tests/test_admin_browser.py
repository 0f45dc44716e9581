"""The admin in a real browser: log in, filter dead deliveries, requeue them, read an event;
pause a schedule and read its ticks.

Runs headless Chromium (Debian's ``/usr/bin/chromium``, which ``.ci/run`` installs)
through Playwright against pytest-django's live server. Without Chromium the module is
skipped, except under ``CI=true``, where it must run.

``DDE_ADMIN_SCREENSHOT=/path.png`` saves a screenshot of the deliveries list.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from playwright.sync_api import Page, expect

from django_domain_events import clock, drain_outbox, fire, fire_due_ticks, receiver, recurring
from django_domain_events.models import DeliveryRecord, ScheduleRecord
from django_domain_events.recurrence import aware
from tests.app.events import OrderPlaced, ReportDue
from tests.conftest import CHROMIUM

if not CHROMIUM.exists() and os.environ.get("CI") != "true":
    pytest.skip(
        f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium); "
        "they always run under CI=true",
        allow_module_level=True,
    )

pytestmark = pytest.mark.django_db(transaction=True)

# Generous waits: CI machines are small and may be busy (the defaults are 5 and 30 s).
expect.set_options(timeout=30_000)


def failing(evt: object) -> None:
    raise ValueError("the mail server said no")


def ok(evt: object) -> None:
    return None


def test_filter_dead_deliveries_and_requeue_them(page: Page, live_server: Any) -> None:
    receiver(OrderPlaced, key="browser.ok")(ok)
    receiver(OrderPlaced, key="browser.mailer", max_attempts=1)(failing)
    receiver(OrderPlaced, key="browser.later", due=timedelta(hours=1))(ok)
    for order_id in (1, 2):
        with transaction.atomic():
            fire(OrderPlaced(order_id=order_id))
    drain_outbox()
    dead = sorted(DeliveryRecord.objects.filter(status="dead").values_list("pk", flat=True))
    assert len(dead) == 2

    page.goto(f"{live_server.url}/admin/django_domain_events/deliveryrecord/")
    expect(page.locator("#result_list tbody tr")).to_have_count(6)
    screenshot = os.environ.get("DDE_ADMIN_SCREENSHOT")
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)

    # The status filter in the sidebar, as an operator would pick it.
    page.locator("#changelist-filter").get_by_role("link", name="dead", exact=True).click()
    page.wait_for_url(re.compile(r"status__exact=dead"))
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("browser.mailer")

    page.check("#action-toggle")
    page.select_option("select[name=action]", label="Requeue selected dead deliveries")
    page.click("button[name=index]")

    success = page.locator(".messagelist .success")
    expect(success).to_have_text("Requeued 2 dead deliveries.")
    statuses = dict(DeliveryRecord.objects.filter(pk__in=dead).values_list("pk", "status"))
    assert statuses == {pk: "pending" for pk in dead}
    expect(page.locator("#result_list tbody tr")).to_have_count(0)


def test_event_page_shows_its_deliveries(page: Page, live_server: Any) -> None:
    receiver(OrderPlaced, key="browser.ok")(ok)
    receiver(OrderPlaced, key="browser.fan", targets=lambda evt, ctx: ["alice@example.com", "bob"])(
        ok
    )
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=7))
    drain_outbox()

    page.goto(f"{live_server.url}/admin/django_domain_events/eventrecord/")
    # In the results: Django 6's admin puts the filters (which name the event too) first.
    page.locator("#result_list").get_by_role("link", name="testapp.OrderPlaced").first.click()
    page.wait_for_url(re.compile(rf"/eventrecord/{event_id}/change/"))
    expect(page.locator("h1")).to_contain_text("View event")
    inline = page.locator(".inline-group")
    expect(inline).to_contain_text("browser.ok")
    expect(inline).to_contain_text("alice@example.com")
    expect(inline.locator("tbody tr.has_original")).to_have_count(3)
    expect(page.locator(".field-delivery_counts")).to_contain_text("3 succeeded")
    # Nothing to edit or save.
    expect(page.locator("input[name=_save]")).to_have_count(0)
    expect(page.locator("form#eventrecord_form input:not([type=hidden])")).to_have_count(0)


def test_pause_a_schedule_and_read_its_ticks(page: Page, live_server: Any) -> None:
    @recurring(every=timedelta(minutes=1), key="browser.report")
    def report(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    base = aware(clock.now()).replace(second=0, microsecond=0) - timedelta(hours=1)
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + timedelta(minutes=3, seconds=5))  # skips two, fires one

    page.goto(f"{live_server.url}/admin/django_domain_events/schedulerecord/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("browser.report")
    expect(rows.first).to_contain_text("every 0:01:00")

    page.check("#action-toggle")
    page.select_option("select[name=action]", label="Pause selected schedules")
    page.click("button[name=index]")
    expect(page.locator(".messagelist .success")).to_have_text("Paused browser.report.")
    expect(rows.first).to_contain_text("paused since")
    assert ScheduleRecord.objects.get(key="browser.report").paused_at is not None

    rows.first.get_by_role("link", name="its ticks").click()
    page.wait_for_url(re.compile(r"/tickrecord/\?schedule=browser.report"))
    ticks = page.locator("#result_list tbody tr")
    expect(ticks).to_have_count(2)
    expect(ticks.filter(has_text="fired")).to_contain_text("testapp.ReportDue #")
    ticks.filter(has_text="skipped").locator("th a").click()
    page.wait_for_url(re.compile(r"/tickrecord/\d+/change/"))
    expect(page.locator("h1")).to_contain_text("View tick")
    expect(page.locator(".field-reason_full")).to_contain_text("catch_up='latest'")
    expect(page.locator("input[name=_save]")).to_have_count(0)
