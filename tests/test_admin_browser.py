"""The admin in a real browser: log in, filter dead deliveries, requeue them, read an event.

Runs headless Chromium (Debian's ``/usr/bin/chromium``, which ``.ci/run`` installs)
through Playwright against pytest-django's live server. Without Chromium the module is
skipped, except under ``CI=true``, where it must run.

``DDE_ADMIN_SCREENSHOT=/path.png`` saves a screenshot of the deliveries list.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from playwright.sync_api import Browser, Page, expect, sync_playwright

from django_domain_events import drain_outbox, fire, receiver
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced

CHROMIUM = Path("/usr/bin/chromium")

if not CHROMIUM.exists() and os.environ.get("CI") != "true":
    pytest.skip(
        f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium); "
        "they always run under CI=true",
        allow_module_level=True,
    )

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"
# Generous waits: CI machines are small and may be busy (the defaults are 5 and 30 s).
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)


def failing(evt: object) -> None:
    raise ValueError("the mail server said no")


def ok(evt: object) -> None:
    return None


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop running in this thread. The ORM calls the
    # test makes between browser steps are plain synchronous code, but Django then keeps
    # their connection apart from the thread's own (as it does for async code): close it
    # before the loop stops, or it would outlive the test and hold the test database.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
            connections.close_all()


@pytest.fixture
def page(browser: Browser, live_server: Any) -> Iterator[Page]:
    get_user_model().objects.create_superuser(username="operator", password=PASSWORD)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    opened.goto(f"{live_server.url}/admin/login/?next=/admin/")
    opened.fill("input[name=username]", "operator")
    opened.fill("input[name=password]", PASSWORD)
    opened.click("input[type=submit]")
    expect(opened.locator("#site-name")).to_contain_text("Django administration")
    expect(opened.locator("body")).to_contain_text("Domain events")
    try:
        yield opened
    finally:
        context.close()


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
