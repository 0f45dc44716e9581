"""The admin: read-only pages, registry-built filters, search, and the operator's actions."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import constants as message_levels
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_domain_events import (
    Constant,
    DeliveryStatus,
    claim_batch,
    drain_outbox,
    fire,
    receiver,
    registry,
)
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, Pinged

pytestmark = pytest.mark.django_db

EVENTS_URL = reverse("admin:django_domain_events_eventrecord_changelist")
DELIVERIES_URL = reverse("admin:django_domain_events_deliveryrecord_changelist")
ORDER_PLACED = "testapp.OrderPlaced"
PINGED = "testapp.Pinged"


# helpers -----------------------------------------------------------------------


def fire_one(evt: object) -> int:
    with transaction.atomic():
        event_id = fire(evt)
    assert event_id is not None
    return event_id


def failing(evt: object) -> None:
    raise ValueError("the mail server said no")


def ok(evt: object) -> None:
    return None


def row(event_id: int, key: str) -> DeliveryRecord:
    return DeliveryRecord.objects.get(event_id=event_id, receiver_key=key)


def ids_on_page(response) -> list[int]:
    return sorted(obj.pk for obj in response.context["cl"].result_list)


def sent_messages(response) -> list[tuple[int, str]]:
    """The messages an action left, as shown on the page it redirected to."""
    assert response.redirect_chain, "an action redirects back to the changelist"
    return [(m.level, str(m)) for m in response.context["messages"]]


def text(response) -> str:
    """The page's text with tags removed and whitespace collapsed."""
    collapsed = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))
    return unescape(collapsed.replace(" ,", ","))


def run_action(client: Client, url: str, action: str, ids: list[int], **extra: str):
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0"}
    return client.post(url, {**data, **extra}, follow=True)


def staff_client(*codenames: str) -> Client:
    user = get_user_model().objects.create_user(
        username=f"staff-{'-'.join(codenames) or 'none'}", password="pw", is_staff=True
    )
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(
                content_type__app_label="django_domain_events", codename=codename
            )
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client_() -> Client:
    user = get_user_model().objects.create_superuser(username="root", password="pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def outcomes() -> dict[str, int]:
    """Two OrderPlaced events and a Pinged: succeeded, dead, pending and slow-lane rows."""
    receiver(OrderPlaced, key="adm.ok")(ok)
    receiver(OrderPlaced, key="adm.bad", max_attempts=1)(failing)
    receiver(OrderPlaced, key="adm.later", due=timedelta(hours=1))(ok)
    receiver(
        OrderPlaced,
        key="adm.fan",
        targets=lambda evt, ctx: ["alice@example.com", "bob@example.com"],
    )(ok)
    receiver(Pinged, key="adm.slow", lane="slow", max_attempts=1)(failing)
    first = fire_one(OrderPlaced(order_id=1))
    second = fire_one(OrderPlaced(order_id=2))
    pinged = fire_one(Pinged(n=3))
    drain_outbox()
    EventRecord.objects.filter(pk=second).update(correlation_id="checkout-42")
    return {"first": first, "second": second, "pinged": pinged}


# pages -------------------------------------------------------------------------


def test_changelists_render_with_counts_links_and_registry_filters(admin_client_, outcomes):
    response = admin_client_.get(EVENTS_URL)
    assert response.status_code == 200
    page = text(response)
    assert "Select event to view" in page
    # Two succeeded fan-out rows and adm.ok, adm.bad dead, adm.later still pending.
    assert "1 pending, 3 succeeded, 1 dead" in page
    assert "1 dead" in page  # the Pinged event
    for name in (ORDER_PLACED, "testapp.OrderShipped", PINGED):
        assert f"?event_name={name}" in response.content.decode()

    response = admin_client_.get(DELIVERIES_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Select delivery to view" in text(response)
    assert len(response.context["cl"].result_list) == 11
    event_url = reverse("admin:django_domain_events_eventrecord_change", args=[outcomes["first"]])
    assert f'href="{event_url}"' in html
    assert f"{ORDER_PLACED} #{outcomes['first']}" in html
    assert "1/1" in html and "0/5" in html  # attempts / max attempts
    assert "ValueError" in html and "the mail server said no" in html
    # The filters come from the registry: receiver keys, lanes, event names; and statuses.
    for param in ("receiver=adm.ok", "receiver=adm.slow", "lane=slow", "lane=default"):
        assert f"?{param}" in html
    assert "?status__exact=dead" in html


def test_index_offers_view_not_change(admin_client_):
    response = admin_client_.get(reverse("admin:index"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Domain events" in html
    assert ">View<" in html
    assert "deliveryrecord/add/" not in html and "eventrecord/add/" not in html


def test_delivery_filters(admin_client_, outcomes):
    def filtered(query: str) -> list[int]:
        response = admin_client_.get(f"{DELIVERIES_URL}?{query}")
        assert response.status_code == 200
        return ids_on_page(response)

    dead = sorted(DeliveryRecord.objects.filter(status="dead").values_list("pk", flat=True))
    assert len(dead) == 3
    assert filtered("status__exact=dead") == dead
    assert filtered("status__exact=pending") == sorted(
        DeliveryRecord.objects.filter(receiver_key="adm.later").values_list("pk", flat=True)
    )
    assert filtered("receiver=adm.fan") == sorted(
        DeliveryRecord.objects.filter(receiver_key="adm.fan").values_list("pk", flat=True)
    )
    slow = [row(outcomes["pinged"], "adm.slow").pk]
    assert filtered("lane=slow") == slow
    assert len(filtered("lane=default")) == 10
    assert filtered("lane=nobody-declared-this") == []
    assert filtered(f"event_name={PINGED}") == slow
    assert len(filtered(f"event_name={ORDER_PLACED}")) == 10
    # Filters combine: the dead rows of the default lane's adm.bad.
    assert filtered("status__exact=dead&lane=default&receiver=adm.bad") == sorted(
        DeliveryRecord.objects.filter(receiver_key="adm.bad").values_list("pk", flat=True)
    )
    # Counts beside each choice ("Show counts"), the registry's filters included.
    response = admin_client_.get(f"{DELIVERIES_URL}?_facets=1")
    assert response.status_code == 200
    assert "adm.fan (4)" in text(response) and "slow (1)" in text(response)
    # The event page's "see all" link.
    assert filtered(f"event__id__exact={outcomes['pinged']}") == slow


def test_event_filters(admin_client_, outcomes):
    def filtered(query: str) -> list[int]:
        response = admin_client_.get(f"{EVENTS_URL}?{query}")
        assert response.status_code == 200
        return ids_on_page(response)

    orders = sorted([outcomes["first"], outcomes["second"]])
    assert filtered(f"event_name={ORDER_PLACED}") == orders
    assert filtered(f"event_name={PINGED}") == [outcomes["pinged"]]
    assert filtered("event_name=testapp.OrderShipped") == []
    assert filtered("delivery_status=dead") == sorted([*orders, outcomes["pinged"]])
    assert filtered("delivery_status=pending") == orders
    assert filtered("delivery_status=cancelled") == []
    assert filtered("receiver=adm.slow") == [outcomes["pinged"]]
    assert filtered("receiver=adm.fan&delivery_status=pending") == orders
    response = admin_client_.get(f"{EVENTS_URL}?_facets=1")
    assert response.status_code == 200
    page = text(response)
    assert f"{ORDER_PLACED} (2)" in page and "dead (3)" in page and "adm.slow (1)" in page


def test_search(admin_client_, outcomes):
    def searched(url: str, q: str) -> list[int]:
        response = admin_client_.get(url, {"q": q})
        assert response.status_code == 200
        return ids_on_page(response)

    fan = sorted(DeliveryRecord.objects.filter(receiver_key="adm.fan").values_list("pk", flat=True))
    assert searched(DELIVERIES_URL, "adm.fan") == fan
    alice = DeliveryRecord.objects.get(target="alice@example.com", event_id=outcomes["first"])
    bob = DeliveryRecord.objects.get(target="bob@example.com", event_id=outcomes["first"])
    assert alice.pk in searched(DELIVERIES_URL, "alice@")
    assert bob.pk not in searched(DELIVERIES_URL, "alice@")
    assert len(searched(DELIVERIES_URL, "mail server said")) == 3
    assert searched(DELIVERIES_URL, "nothing-matches-this") == []

    assert searched(EVENTS_URL, "Pinged") == [outcomes["pinged"]]
    assert searched(EVENTS_URL, "checkout-42") == [outcomes["second"]]


# read-only ---------------------------------------------------------------------


def test_add_and_delete_are_forbidden(admin_client_, outcomes):
    for model in ("eventrecord", "deliveryrecord"):
        add = reverse(f"admin:django_domain_events_{model}_add")
        assert admin_client_.get(add).status_code == 403
        assert admin_client_.post(add, {}).status_code == 403
    event_id = outcomes["first"]
    delivery = row(event_id, "adm.ok")
    for model, pk in (("eventrecord", event_id), ("deliveryrecord", delivery.pk)):
        delete = reverse(f"admin:django_domain_events_{model}_delete", args=[pk])
        assert admin_client_.get(delete).status_code == 403
        assert admin_client_.post(delete, {"post": "yes"}).status_code == 403
    assert EventRecord.objects.filter(pk=event_id).exists()
    assert DeliveryRecord.objects.filter(pk=delivery.pk).exists()
    # Nor is there a bulk delete.
    response = admin_client_.get(DELIVERIES_URL)
    assert "delete_selected" not in response.content.decode()
    response = run_action(admin_client_, DELIVERIES_URL, "delete_selected", [delivery.pk])
    assert DeliveryRecord.objects.filter(pk=delivery.pk).exists()


def test_change_views_are_read_only(admin_client_, outcomes):
    event_id = outcomes["first"]
    url = reverse("admin:django_domain_events_eventrecord_change", args=[event_id])
    response = admin_client_.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "<input" not in re.sub(r'<input type="hidden"[^>]*>', "", html.split("<main")[1])
    page = text(response)
    assert "View event" in page
    # Its deliveries inline, each linking to its own page, and a link to all of them.
    for key in ("adm.ok", "adm.bad", "adm.later", "adm.fan"):
        assert key in page
    assert "alice@example.com" in page
    assert f"{DELIVERIES_URL}?event__id__exact={event_id}" in html
    assert "see all 5 in the deliveries list" in page
    assert '"order_id": 1' in page  # the payload, pretty-printed
    delivery = row(event_id, "adm.bad")
    delivery_url = reverse("admin:django_domain_events_deliveryrecord_change", args=[delivery.pk])
    assert delivery_url in html

    response = admin_client_.post(url, {"name": "forged", "payload": "{}"})
    assert response.status_code == 403
    record = EventRecord.objects.get(pk=event_id)
    assert record.name == ORDER_PLACED and record.payload["order_id"] == 1

    response = admin_client_.get(delivery_url)
    assert response.status_code == 200
    assert 'name="_save"' not in response.content.decode()
    assert "the mail server said no" in text(response)
    response = admin_client_.post(delivery_url, {"status": "pending", "attempts": "0"})
    assert response.status_code == 403
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DEAD and delivery.attempts == 1


def test_event_page_shows_only_the_first_deliveries(admin_client_):
    receiver(OrderPlaced, key="adm.many", targets=lambda evt, ctx: [f"t{i}" for i in range(60)])(ok)
    event_id = fire_one(OrderPlaced(order_id=9))
    url = reverse("admin:django_domain_events_eventrecord_change", args=[event_id])
    response = admin_client_.get(url)
    assert response.status_code == 200
    page = text(response)
    assert "see all 60 in the deliveries list" in page
    assert "Deliveries (the first 50 of 60)" in page
    assert "60 pending" in page
    targets = set(re.findall(r"\bt\d+\b", page))
    assert len(targets) == 50


# actions -----------------------------------------------------------------------


def test_requeue_selected_dead_deliveries(admin_client_, outcomes):
    dead = list(DeliveryRecord.objects.filter(status="dead").order_by("pk"))
    chosen = [dead[0].pk, dead[1].pk, row(outcomes["first"], "adm.ok").pk]
    response = run_action(admin_client_, DELIVERIES_URL, "requeue_selected_dead", chosen)
    assert sent_messages(response) == [
        (
            message_levels.SUCCESS,
            "Requeued 2 dead deliveries; 1 selected row was not dead and was skipped.",
        )
    ]
    for delivery in dead[:2]:
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts, delivery.last_error) == ("pending", 0, "")
    dead[2].refresh_from_db()
    assert dead[2].status == "dead"
    assert row(outcomes["first"], "adm.ok").status == "succeeded"

    response = run_action(
        admin_client_,
        DELIVERIES_URL,
        "requeue_selected_dead",
        [row(outcomes["first"], "adm.ok").pk],
    )
    assert sent_messages(response) == [
        (message_levels.WARNING, "Nothing was requeued: none of the 1 selected row was dead.")
    ]


def test_requeue_on_every_row_a_filter_picked_out(admin_client_, outcomes):
    """Select all across pages acts on the filtered rows, not only the ticked ones."""
    one = row(outcomes["pinged"], "adm.slow")
    response = run_action(
        admin_client_,
        f"{DELIVERIES_URL}?status__exact=dead&lane=default",
        "requeue_selected_dead",
        [one.pk],
        select_across="1",
    )
    assert sent_messages(response) == [(message_levels.SUCCESS, "Requeued 2 dead deliveries.")]
    assert set(DeliveryRecord.objects.filter(status="dead").values_list("pk", flat=True)) == {
        one.pk
    }


def test_cancel_selected_deliveries_reports_in_flight_and_settled(admin_client_):
    receiver(OrderPlaced, key="adm.done")(ok)
    for key in ("adm.later", "adm.later2", "adm.held"):
        receiver(OrderPlaced, key=key, due=timedelta(hours=1))(ok)
    event_id = fire_one(OrderPlaced(order_id=5))
    other = fire_one(OrderPlaced(order_id=6))
    drain_outbox()
    held = row(event_id, "adm.held")
    claims = claim_batch(
        worker_id="w", now=timezone.now() + timedelta(hours=2), lease=600, limit=1, ids=[held.pk]
    )
    assert [c.id for c in claims] == [held.pk]

    chosen = [row(event_id, k).pk for k in ("adm.done", "adm.later", "adm.later2", "adm.held")]
    response = run_action(admin_client_, DELIVERIES_URL, "cancel_selected_deliveries", chosen)
    assert sent_messages(response) == [
        (
            message_levels.SUCCESS,
            "Cancelled 2 deliveries; 1 in flight was left to its worker; "
            "1 already settled was skipped.",
        )
    ]
    statuses = {k: row(event_id, k).status for k in ("adm.done", "adm.later", "adm.later2")}
    assert statuses == {
        "adm.done": "succeeded",
        "adm.later": "cancelled",
        "adm.later2": "cancelled",
    }
    assert row(event_id, "adm.held").status == "claimed"
    # Rows of the same event and receiver that were not selected are untouched.
    assert row(other, "adm.later").status == "pending"

    response = run_action(
        admin_client_, DELIVERIES_URL, "cancel_selected_deliveries", [row(event_id, "adm.done").pk]
    )
    assert sent_messages(response) == [
        (message_levels.WARNING, "Cancelled 0 deliveries; 1 already settled was skipped.")
    ]


def test_cancel_on_the_rows_a_receiver_filter_picked_out(admin_client_):
    """Seed 000: the admin's Cancel selected deliveries after a status or receiver filter."""
    receiver(OrderPlaced, key="offers.expire_offer", due=timedelta(hours=48))(ok)
    receiver(OrderPlaced, key="offers.remind", due=timedelta(hours=24))(ok)
    events = [fire_one(OrderPlaced(order_id=i)) for i in range(3)]
    response = run_action(
        admin_client_,
        f"{DELIVERIES_URL}?receiver=offers.expire_offer&status__exact=pending",
        "cancel_selected_deliveries",
        [row(events[0], "offers.expire_offer").pk],
        select_across="1",
    )
    assert sent_messages(response) == [(message_levels.SUCCESS, "Cancelled 3 deliveries.")]
    for event_id in events:
        assert row(event_id, "offers.expire_offer").status == "cancelled"
        assert row(event_id, "offers.remind").status == "pending"
    # Nothing cancelled is ever claimed, even after its due time.
    outcome = drain_outbox(now=timezone.now() + timedelta(hours=49))
    assert {status: n for status, n in outcome.items() if n} == {DeliveryStatus.SUCCEEDED: 3}


def test_cancel_owed_deliveries_of_selected_events(admin_client_):
    receiver(OrderPlaced, key="adm.done")(ok)
    receiver(OrderPlaced, key="adm.flaky", max_attempts=3)(failing)
    receiver(OrderPlaced, key="adm.later", due=timedelta(hours=1))(ok)
    receiver(OrderPlaced, key="adm.held", due=timedelta(hours=1))(ok)
    first = fire_one(OrderPlaced(order_id=1))
    second = fire_one(OrderPlaced(order_id=2))
    untouched = fire_one(OrderPlaced(order_id=3))
    drain_outbox(respect_backoff=True)
    assert row(first, "adm.flaky").status == "failed"
    held = row(second, "adm.held")
    claim_batch(
        worker_id="w", now=timezone.now() + timedelta(hours=2), lease=600, limit=1, ids=[held.pk]
    )

    response = run_action(admin_client_, EVENTS_URL, "cancel_owed_deliveries", [first, second])
    assert sent_messages(response) == [
        (
            message_levels.SUCCESS,
            "Cancelled 5 deliveries of 2 events; 1 in flight was left to its worker; "
            "2 already settled were skipped.",
        )
    ]
    assert {r.receiver_key: r.status for r in DeliveryRecord.objects.filter(event_id=first)} == {
        "adm.done": "succeeded",
        "adm.flaky": "cancelled",
        "adm.later": "cancelled",
        "adm.held": "cancelled",
    }
    assert row(second, "adm.held").status == "claimed"
    assert row(untouched, "adm.later").status == "pending"


def test_replay_selected_events(admin_client_, outcomes):
    first = outcomes["first"]
    response = run_action(admin_client_, EVENTS_URL, "replay_selected_events", [first])
    # adm.ok, adm.bad and the two fan-out rows reopen; adm.later is still owed.
    assert sent_messages(response) == [
        (
            message_levels.SUCCESS,
            "Replayed 1 event: 4 deliveries reopened, 0 added; "
            "1 still owed or in flight was left as it was.",
        )
    ]
    statuses = set(DeliveryRecord.objects.filter(event_id=first).values_list("status", flat=True))
    assert statuses == {"pending"}
    assert row(first, "adm.bad").attempts == 0

    # A receiver declared since is added.
    receiver(Pinged, key="adm.new")(ok)
    response = run_action(admin_client_, EVENTS_URL, "replay_selected_events", [outcomes["pinged"]])
    assert sent_messages(response) == [
        (message_levels.SUCCESS, "Replayed 1 event: 1 delivery reopened, 1 added.")
    ]
    assert row(outcomes["pinged"], "adm.new").status == "pending"


def test_replay_error_is_reported_and_nothing_is_half_applied(admin_client_, outcomes):
    gone = EventRecord.objects.create(
        name="testapp.NoLongerDeclared",
        payload={},
        occurred_at=timezone.now(),
        recorded_at=timezone.now(),
    )
    first = outcomes["first"]
    before = dict(DeliveryRecord.objects.filter(event_id=first).values_list("pk", "status"))
    response = run_action(admin_client_, EVENTS_URL, "replay_selected_events", [first, gone.pk])
    [(level, message)] = sent_messages(response)
    assert level == message_levels.ERROR
    assert message.startswith("Nothing was replayed: ")
    assert "testapp.NoLongerDeclared" in message and "no longer declared" in message
    after = dict(DeliveryRecord.objects.filter(event_id=first).values_list("pk", "status"))
    assert after == before


# permissions -------------------------------------------------------------------


def test_view_permission_alone_sees_the_pages_but_no_actions(outcomes):
    client = staff_client("view_eventrecord", "view_deliveryrecord")
    for url in (EVENTS_URL, DELIVERIES_URL):
        response = client.get(url)
        assert response.status_code == 200
        assert response.context["action_form"] is None
        assert 'name="action"' not in response.content.decode()
    event_url = reverse("admin:django_domain_events_eventrecord_change", args=[outcomes["first"]])
    response = client.get(event_url)
    assert response.status_code == 200
    page = text(response)
    assert "adm.bad" in page  # the inline is visible to a viewer too
    assert "the first 50" not in page

    dead = list(DeliveryRecord.objects.filter(status="dead").values_list("pk", flat=True))
    run_action(client, DELIVERIES_URL, "requeue_selected_dead", dead)
    run_action(client, EVENTS_URL, "cancel_owed_deliveries", [outcomes["first"]])
    assert DeliveryRecord.objects.filter(status="dead").count() == 3
    assert not DeliveryRecord.objects.filter(status="cancelled").exists()


def test_no_permission_no_pages(outcomes):
    client = staff_client()
    assert client.get(DELIVERIES_URL).status_code == 403
    assert client.get(EVENTS_URL).status_code == 403


def test_change_permission_runs_the_actions(outcomes):
    client = staff_client("change_deliveryrecord")
    response = client.get(DELIVERIES_URL)
    assert response.status_code == 200
    choices = [value for value, _ in response.context["action_form"].fields["action"].choices]
    assert choices[1:] == [
        "requeue_selected_dead",
        "retry_selected_now",
        "cancel_selected_deliveries",
    ]
    # Change permission on deliveries opens nothing for editing either.
    delivery = row(outcomes["first"], "adm.bad")
    url = reverse("admin:django_domain_events_deliveryrecord_change", args=[delivery.pk])
    assert client.post(url, {"status": "pending"}).status_code == 403

    response = run_action(client, DELIVERIES_URL, "requeue_selected_dead", [delivery.pk])
    assert sent_messages(response) == [(message_levels.SUCCESS, "Requeued 1 dead delivery.")]
    delivery.refresh_from_db()
    assert delivery.status == "pending"
    # Events need their own change permission.
    assert client.get(EVENTS_URL).status_code == 403
    client = staff_client("view_eventrecord")
    response = run_action(client, EVENTS_URL, "cancel_owed_deliveries", [outcomes["first"]])
    assert not DeliveryRecord.objects.filter(status="cancelled").exists()


# performance -------------------------------------------------------------------


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_changelist_queries_do_not_grow_with_rows(admin_client_):
    receiver(OrderPlaced, key="adm.a")(ok)
    receiver(OrderPlaced, key="adm.b", max_attempts=1)(failing)
    for i in range(5):
        fire_one(OrderPlaced(order_id=i))
    drain_outbox()
    assert DeliveryRecord.objects.count() == 10
    small = {url: _queries(admin_client_, url) for url in (DELIVERIES_URL, EVENTS_URL)}
    for i in range(45):
        fire_one(OrderPlaced(order_id=i))
    drain_outbox()
    assert DeliveryRecord.objects.count() == 100
    large = {url: _queries(admin_client_, url) for url in (DELIVERIES_URL, EVENTS_URL)}
    assert large == small
    response = admin_client_.get(EVENTS_URL)
    assert len(response.context["cl"].result_list) == 50
    assert text(response).count("1 succeeded, 1 dead") == 50


def test_registry_filters_follow_declarations(admin_client_):
    response = admin_client_.get(DELIVERIES_URL)
    assert "?lane=later-lane" not in response.content.decode()
    receiver(OrderPlaced, key="adm.latecomer", lane="later-lane")(ok)
    assert "later-lane" in registry.lanes()
    response = admin_client_.get(DELIVERIES_URL)
    html = response.content.decode()
    assert "?lane=later-lane" in html and "?receiver=adm.latecomer" in html


# details for a first-time operator ---------------------------------------------------


def _second(moment) -> str:
    return (
        timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
        if settings.USE_TZ
        else (moment.strftime("%Y-%m-%d %H:%M:%S"))
    )


def test_times_are_shown_to_the_second(admin_client_, outcomes):
    moment = timezone.now().replace(microsecond=0) - timedelta(seconds=17)
    delivery = row(outcomes["first"], "adm.bad")
    DeliveryRecord.objects.filter(pk=delivery.pk).update(
        due_at=moment, completed_at=moment + timedelta(seconds=3)
    )
    EventRecord.objects.filter(pk=outcomes["first"]).update(occurred_at=moment)
    page = text(admin_client_.get(DELIVERIES_URL))
    assert _second(moment) in page and _second(moment + timedelta(seconds=3)) in page
    url = reverse("admin:django_domain_events_deliveryrecord_change", args=[delivery.pk])
    page = text(admin_client_.get(url))
    assert f"Due at: {_second(moment)}" in page
    assert f"Completed at: {_second(moment + timedelta(seconds=3))}" in page
    page = text(admin_client_.get(EVENTS_URL))
    assert _second(moment) in page
    event_url = reverse("admin:django_domain_events_eventrecord_change", args=[outcomes["first"]])
    assert f"Occurred at: {_second(moment)}" in text(admin_client_.get(event_url))


def test_available_at_is_hidden_on_settled_rows(admin_client_, outcomes):
    def page_of(delivery: DeliveryRecord) -> str:
        url = reverse("admin:django_domain_events_deliveryrecord_change", args=[delivery.pk])
        return text(admin_client_.get(url))

    settled = row(outcomes["first"], "adm.bad")
    owed = row(outcomes["first"], "adm.later")
    assert "Available at" not in page_of(settled)
    assert f"Available at: {_second(owed.available_at)}" in page_of(owed)
    response = admin_client_.get(f"{DELIVERIES_URL}?receiver=adm.bad")
    cells = re.findall(
        r'<td class="field-available_at_shown">([^<]*)</td>', response.content.decode()
    )
    assert cells == ["-", "-"]
    response = admin_client_.get(f"{DELIVERIES_URL}?receiver=adm.later")
    cells = re.findall(
        r'<td class="field-available_at_shown">([^<]*)</td>', response.content.decode()
    )
    assert cells and "-" not in cells


def _failed_rows() -> tuple[int, int, int]:
    # A long, unjittered wait after every failure, so a drain runs each row once.
    receiver(OrderPlaced, key="adm.flaky", max_attempts=5, retry=Constant(1800))(failing)
    receiver(OrderPlaced, key="adm.done")(ok)
    first = fire_one(OrderPlaced(order_id=1))
    second = fire_one(OrderPlaced(order_id=2))
    drain_outbox(respect_backoff=True)
    waiting = row(first, "adm.flaky")
    assert waiting.status == "failed"
    return waiting.pk, row(second, "adm.flaky").pk, row(first, "adm.done").pk


def test_retry_now_moves_failed_rows_waiting_out_their_backoff(admin_client_):
    waiting, other, done = _failed_rows()
    before = DeliveryRecord.objects.get(pk=waiting)
    response = run_action(admin_client_, DELIVERIES_URL, "retry_selected_now", [waiting, done])
    assert sent_messages(response) == [
        (
            message_levels.SUCCESS,
            "Retrying 1 failed delivery now; 1 selected row was not failed and waiting out "
            "a backoff, and was skipped.",
        )
    ]
    after = DeliveryRecord.objects.get(pk=waiting)
    assert after.status == "failed" and after.available_at <= timezone.now()
    assert (after.attempts, after.due_at, after.last_error) == (
        before.attempts,
        before.due_at,
        before.last_error,
    )
    assert DeliveryRecord.objects.get(pk=other).available_at > timezone.now()
    assert DeliveryRecord.objects.get(pk=done).status == "succeeded"
    # Due now: the next relay pass (which respects backoff) runs it again.
    drain_outbox(respect_backoff=True)
    assert DeliveryRecord.objects.get(pk=waiting).attempts == 2
    assert DeliveryRecord.objects.get(pk=other).attempts == 1

    response = run_action(admin_client_, DELIVERIES_URL, "retry_selected_now", [done])
    assert sent_messages(response) == [
        (
            message_levels.WARNING,
            "Nothing was retried: none of the 1 selected row was failed and waiting out its "
            "backoff.",
        )
    ]


def test_retry_now_compares_and_sets_on_failed():
    from django_domain_events.operations import retry_now

    waiting, other, _ = _failed_rows()
    # Cancelled between the operator's selection and the write: left cancelled.
    DeliveryRecord.objects.filter(pk=other).update(status="cancelled")
    assert retry_now([waiting, other]) == 1
    assert DeliveryRecord.objects.get(pk=other).status == "cancelled"
    assert retry_now([waiting]) == 0  # due already: nothing to move
    with pytest.raises(TypeError):
        retry_now("12")  # type: ignore[arg-type]


def test_retry_now_needs_the_change_permission():
    waiting, _, _ = _failed_rows()
    before = DeliveryRecord.objects.get(pk=waiting).available_at
    viewer = staff_client("view_deliveryrecord")
    run_action(viewer, DELIVERIES_URL, "retry_selected_now", [waiting])
    assert DeliveryRecord.objects.get(pk=waiting).available_at == before
    changer = staff_client("change_deliveryrecord")
    run_action(changer, DELIVERIES_URL, "retry_selected_now", [waiting])
    assert DeliveryRecord.objects.get(pk=waiting).available_at < before


def test_receiver_filter_lists_keys_only_rows_carry(admin_client_, outcomes):
    from django_domain_events import registry

    registry.forget("adm.bad")  # dead rows remain
    registry.forget("adm.later")  # an owed row remains
    registry.forget("adm.ok")  # only succeeded rows remain: not listed, still filters
    html = admin_client_.get(DELIVERIES_URL).content.decode()
    assert "?receiver=adm.bad" in html and "adm.bad (not declared)" in html
    assert "?receiver=adm.later" in html and "adm.later (not declared)" in html
    assert "?receiver=adm.fan" in html and "adm.fan (not declared)" not in html
    assert "?receiver=adm.ok" not in html
    response = admin_client_.get(f"{DELIVERIES_URL}?receiver=adm.bad")
    assert ids_on_page(response) == sorted(
        DeliveryRecord.objects.filter(receiver_key="adm.bad").values_list("pk", flat=True)
    )
    response = admin_client_.get(f"{DELIVERIES_URL}?receiver=adm.ok")
    assert len(ids_on_page(response)) == 2


def test_error_type_and_time_range_filters(admin_client_, outcomes):
    DeliveryRecord.objects.filter(receiver_key="adm.slow").update(last_error="KeyError: 'x'")
    html = admin_client_.get(DELIVERIES_URL).content.decode()
    assert "?error_type=ValueError" in html and "?error_type=KeyError" in html
    response = admin_client_.get(DELIVERIES_URL, {"error_type": "ValueError"})
    assert ids_on_page(response) == sorted(
        DeliveryRecord.objects.filter(receiver_key="adm.bad").values_list("pk", flat=True)
    )
    now = timezone.now()
    window = {
        "completed_at__gte": (now - timedelta(minutes=5)).isoformat(),
        "completed_at__lt": (now + timedelta(minutes=1)).isoformat(),
    }
    response = admin_client_.get(DELIVERIES_URL, {"status__exact": "dead", **window})
    assert len(ids_on_page(response)) == 3
    page = text(response)
    assert "By time range" in page and "completed at >=" in page and "Any time" in page
    early = {"completed_at__lt": (now - timedelta(minutes=5)).isoformat()}
    assert ids_on_page(admin_client_.get(DELIVERIES_URL, early)) == []
