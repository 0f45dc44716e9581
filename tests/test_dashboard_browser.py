"""The admin dashboard in a real browser: its figures, its charts, its links, its refresh.

Headless Chromium through Playwright, with the ``browser`` and ``page`` fixtures of
``conftest.py`` (an operator logged in). ``DDE_DASHBOARD_SCREENSHOT=/path.png`` saves a
screenshot of the page (how ``docs/images/dashboard.png`` is made).
"""

from __future__ import annotations

import os
import random
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from django_domain_events import drain_outbox, outbox_health, receiver
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import CHROMIUM
from tests.support import fire_one
from tests.test_dashboard import failing, ok, seed_outbox

if not CHROMIUM.exists() and os.environ.get("CI") != "true":
    pytest.skip(
        f"browser tests need Debian's chromium at {CHROMIUM}; they always run under CI=true",
        allow_module_level=True,
    )

expect.set_options(timeout=30_000)

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "/admin/django_domain_events/deliveryrecord/dashboard/"


@pytest.fixture
def outbox() -> None:
    """Succeeded, dead (two error types), failed, owed, scheduled and slow-lane rows."""
    seed_outbox()


def rows(**filters: Any) -> int:
    return DeliveryRecord.objects.filter(**filters).count()


def figure(page: Page, name: str) -> str:
    return page.locator(f".dde-totals [data-figure={name}] .dde-figure").inner_text()


def test_figures_charts_and_tables(page: Page, live_server: Any, outbox: None) -> None:
    page.goto(f"{live_server.url}{DASHBOARD}")
    expect(page.locator("h1")).to_have_text("Outbox dashboard")
    health = outbox_health()
    assert (health.owed, health.dead) == (4, 4)  # owed: 3 failed, 1 pending
    assert health.scheduled == 3
    for name in ("owed", "scheduled", "claimed", "dead", "lapsed_leases"):
        assert figure(page, name) == str(getattr(health, name)), name
    for backlog in health.receivers:
        line = page.locator(f"#dde-receivers tr[data-receiver='{backlog.key}']")
        for name in ("owed", "scheduled", "claimed", "dead"):
            expect(line.locator(f"[data-figure={name}]")).to_have_text(str(getattr(backlog, name)))
    for lane in health.lanes:
        line = page.locator(f"#dde-lanes tr[data-lane='{lane.lane}']")
        expect(line.locator("[data-figure=owed]")).to_have_text(str(lane.owed))
        expect(line.locator("[data-figure=dead]")).to_have_text(str(lane.dead))

    # A bar per minute of the last hour, per age bucket, per day of the week ahead.
    expect(page.locator("#dde-chart-minutes g.dde-bar")).to_have_count(60)
    expect(page.locator("#dde-chart-ages g.dde-bar")).to_have_count(5)
    expect(page.locator("#dde-chart-days g.dde-bar")).to_have_count(7)
    expect(page.locator("#dde-chart-dead_receivers g.dde-bar")).to_have_count(2)
    expect(page.locator("#dde-chart-dead_types g.dde-bar")).to_have_count(2)

    # The bars hold the counts the rows give.
    hour_ago = timezone.now() - timedelta(hours=1)

    def summed(selector: str) -> int:
        return sum(
            int(n)
            for n in page.locator(selector).evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('data-count'))"
            )
        )

    assert summed("#dde-chart-minutes a.dde-succeeded") == rows(
        status="succeeded", completed_at__gte=hour_ago
    )
    assert summed("#dde-chart-minutes a.dde-dead") == rows(status="dead")
    assert summed("#dde-chart-minutes a.dde-failed") == rows(status="failed") == 3
    assert summed("#dde-chart-ages a.dde-owed") == health.owed
    assert summed("#dde-chart-days a.dde-scheduled") == health.scheduled
    day = page.locator("#dde-chart-days g.dde-bar").nth(2)
    expect(day).to_have_attribute("data-total", "3")
    dead_bars = page.locator("#dde-chart-dead_receivers g.dde-bar")
    expect(dead_bars.nth(0)).to_have_attribute("data-label", "dash.mailer")
    expect(dead_bars.nth(0)).to_have_attribute("data-total", str(rows(receiver_key="dash.mailer")))
    types = page.locator("#dde-chart-dead_types g.dde-bar")
    expect(types.nth(0)).to_have_attribute("data-label", "ValueError")
    expect(types.nth(0)).to_have_attribute("data-total", "3")
    expect(types.nth(1)).to_have_attribute("data-label", "PermissionError")
    expect(types.nth(1)).to_have_attribute("data-total", "1")

    screenshot = os.environ.get("DDE_DASHBOARD_SCREENSHOT")
    if screenshot:
        _an_hour_of_traffic()
        page.reload()
        page.screenshot(path=screenshot, full_page=True)


def _an_hour_of_traffic() -> None:
    """More rows, their times spread over the last hour and the week ahead: the picture
    in docs/images/dashboard.png."""
    rng = random.Random(14)
    receiver(OrderPlaced, key="shop.send_receipt")(ok)
    receiver(OrderPlaced, key="shop.notify_crm", max_attempts=1)(
        lambda evt: (_ for _ in ()).throw(ConnectionError("crm.example.com refused"))
    )
    receiver(OrderPlaced, key="shop.expire_offer", due=timedelta(hours=30))(ok)
    for order_id in range(400):
        fire_one(OrderPlaced(order_id=order_id))
    drain_outbox(respect_backoff=True)
    now = timezone.now()
    for pk in DeliveryRecord.objects.filter(completed_at__isnull=False).values_list(
        "pk", flat=True
    ):
        at = now - timedelta(seconds=rng.triangular(0, 3600, 600))
        DeliveryRecord.objects.filter(pk=pk).update(completed_at=at, succeeded_at=at)
    for pk in DeliveryRecord.objects.filter(status="pending", due_at__gt=now).values_list(
        "pk", flat=True
    )[:150]:
        due = now + timedelta(hours=rng.uniform(30, 150))
        DeliveryRecord.objects.filter(pk=pk).update(due_at=due, available_at=due)
    from django_domain_events import tally

    tally.recount()
    for order_id in range(40):
        fire_one(Pinged(n=order_id))
    late = DeliveryRecord.objects.filter(status="pending", due_at__lte=timezone.now())
    for pk in late.values_list("pk", flat=True)[:25]:
        due = now - timedelta(minutes=rng.choice([3, 5, 15, 40, 90]))
        DeliveryRecord.objects.filter(pk=pk).update(due_at=due, available_at=due)


def test_it_refreshes_without_a_reload(page: Page, live_server: Any) -> None:
    receiver(OrderPlaced, key="dash.mailer", max_attempts=1)(failing)
    receiver(OrderPlaced, key="dash.ok")(ok)
    page.goto(f"{live_server.url}{DASHBOARD}?refresh=1")
    expect(page.locator(".dde-totals [data-figure=dead] .dde-figure")).to_have_text("0")
    page.evaluate("window.ddeSamePage = true")

    fire_one(OrderPlaced(order_id=1))
    drain_outbox()

    expect(page.locator(".dde-totals [data-figure=dead] .dde-figure")).to_have_text("1")
    expect(
        page.locator("#dde-receivers tr[data-receiver='dash.mailer'] [data-figure=dead]")
    ).to_have_text("1")
    assert page.evaluate("window.ddeSamePage") is True  # swapped in, not reloaded
    assert int(page.locator("#dde-dashboard").get_attribute("data-refreshes") or 0) >= 1
    expect(page.locator("#dde-chart-minutes a.dde-succeeded")).to_have_count(1)


def _listed(page: Page) -> int:
    return page.locator("#result_list tbody tr").count()


def _follow(page: Page, live_server: Any, link: Any, expected: int) -> None:
    """Click ``link`` on the dashboard; the deliveries list it lands on holds ``expected``."""
    link.click()
    page.wait_for_url(re.compile(r"/deliveryrecord/\?"))
    expect(page.locator("#result_list tbody tr")).to_have_count(expected)
    page.goto(f"{live_server.url}{DASHBOARD}")


def test_each_chart_links_to_its_rows(page: Page, live_server: Any, outbox: None) -> None:
    page.goto(f"{live_server.url}{DASHBOARD}")
    succeeded = page.locator("#dde-chart-minutes a.dde-succeeded").last
    _follow(page, live_server, succeeded, int(succeeded.get_attribute("data-count") or 0))
    dead = page.locator("#dde-chart-minutes a.dde-dead").last
    _follow(page, live_server, dead, int(dead.get_attribute("data-count") or 0))
    _follow(page, live_server, page.locator("#dde-chart-minutes a.dde-failed").last, 3)
    _follow(page, live_server, page.locator("#dde-chart-ages a.dde-owed").first, 4)
    _follow(page, live_server, page.locator("#dde-chart-days g.dde-bar").nth(2).locator("a"), 3)
    mailer = page.locator("#dde-chart-dead_receivers g.dde-bar[data-label='dash.mailer'] a")
    _follow(page, live_server, mailer, rows(receiver_key="dash.mailer", status="dead"))
    refused_type = page.locator("#dde-chart-dead_types g.dde-bar[data-label='PermissionError'] a")
    _follow(page, live_server, refused_type, 1)
    _follow(page, live_server, page.locator(".dde-totals [data-figure=dead]"), 4)
    _follow(page, live_server, page.locator(".dde-totals [data-figure=scheduled]"), 3)
    _follow(
        page, live_server, page.locator("#dde-lanes tr[data-lane=slow] [data-figure=dead] a"), 1
    )

    # The list says which time range it shows, and offers to drop it.
    page.locator("#dde-chart-minutes a.dde-failed").last.click()
    page.wait_for_url(re.compile(r"claimed_at__gte="))
    expect(page.locator("#changelist-filter")).to_contain_text("claimed at >=")
    page.locator("#changelist-filter").get_by_role("link", name="Any time").click()
    page.wait_for_url(re.compile(r"status__exact=failed$"))
    expect(page.locator("#result_list tbody tr")).to_have_count(3)


def test_the_app_page_and_the_deliveries_list_link_to_it(page: Page, live_server: Any) -> None:
    page.goto(f"{live_server.url}/admin/django_domain_events/")
    page.locator("#dde-dashboard-link").get_by_role("link", name="Dashboard").click()
    page.wait_for_url(re.compile(r"/dashboard/$"))
    expect(page.locator("h1")).to_have_text("Outbox dashboard")
    page.goto(f"{live_server.url}/admin/django_domain_events/deliveryrecord/")
    page.locator(".object-tools").get_by_role("link", name="Dashboard").click()
    page.wait_for_url(re.compile(r"/dashboard/$"))


def test_each_limit_shows_its_use_and_links_to_its_rows(page: Page, live_server: Any) -> None:
    from tests.test_dashboard import seed_limits

    seed_limits()
    page.goto(f"{live_server.url}{DASHBOARD}")
    for limit in outbox_health().limits:
        line = page.locator(f"#dde-limits tr[data-limit='{limit.key}']")
        expect(line.locator("[data-figure=rate]")).to_have_text(limit.rate_limit or "-")
        expect(line.locator("[data-figure=concurrency]")).to_have_text(str(limit.concurrency_limit))
        expect(line.locator("[data-figure=running]")).to_have_text(str(limit.running))
        expect(line.locator("[data-figure=waiting]")).to_have_text(str(limit.waiting))
    paused = page.locator("#dde-limits tr[data-limit='dash.gateway'] [data-figure=paused_until]")
    expect(paused).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    sms = "#dde-limits tr[data-limit='dash.sms']"
    _follow(page, live_server, page.locator(f"{sms} [data-figure=waiting] a"), 3)
    _follow(page, live_server, page.locator(f"{sms} [data-figure=running] a"), 1)
