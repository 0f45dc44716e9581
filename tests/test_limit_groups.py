"""Limits shared by a named group of receivers (LIMIT_GROUPS) and by a lane (LANE_LIMITS)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import RetryAfter, fire, outbox_health, receiver, run_relay
from django_domain_events.conf import get as settings_now
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.delivery.claim_rows import Claim
from django_domain_events.models import DeliveryRecord, DeliveryStatus, LimitRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import needs_postgresql

pytestmark = pytest.mark.django_db(transaction=True)

SMS = {"sms": {"rate_limit": "2/s", "concurrency_limit": 3}}  # a burst of one token


def fire_each(*events: object) -> None:
    with transaction.atomic():
        for evt in events:
            fire(evt)


def keys(now: object, limit: int = 50, worker: str = "w", lease: float = 60) -> list[str]:
    claims = claim_batch(worker_id=worker, now=now, lease=lease, limit=limit)
    return sorted(c.receiver_key for c in claims)


@override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": {"sms": {"concurrency_limit": 3}}})
def test_a_group_concurrency_is_shared_by_its_receivers_across_relays() -> None:
    receiver(Pinged, key="t.a", limit_group="sms")(lambda evt: None)
    receiver(OrderPlaced, key="t.b", limit_group="sms")(lambda evt: None)
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(4)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(4)))
    now = timezone.now() + timedelta(seconds=1)
    first = keys(now, lease=30)
    assert first.count("t.free") == 4 and len(first) == 7  # 3 of the group, in rank order
    assert first[:3] == ["t.a", "t.a", "t.a"]  # the pings were fired first
    assert keys(now + timedelta(seconds=5), worker="w2") == []  # the group is full
    # The first relay died: its rows' lease lapsed, the group's places come back.
    again = keys(now + timedelta(seconds=31), worker="w3")
    assert len([key for key in again if key != "t.free"]) == 3


@override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": SMS})
def test_a_group_rate_is_one_bucket_and_a_receiver_keeps_its_own_limit_too() -> None:
    receiver(Pinged, key="t.a", limit_group="sms", concurrency_limit=1)(lambda evt: None)
    receiver(OrderPlaced, key="t.b", limit_group="sms")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(3)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now) == ["t.a"]  # its own limit first: one token in the group's bucket
    assert keys(now, worker="w2") == []  # the bucket is spent for both receivers
    # The next token goes to t.b: t.a's own limit (one at a time) is held by its running row.
    assert keys(now + timedelta(seconds=0.5), worker="w3") == ["t.b"]
    waiting = DeliveryRecord.objects.filter(status=DeliveryStatus.PENDING)
    assert waiting.count() == 4 and {r.attempts for r in waiting} == {0}  # nothing spent
    assert LimitRecord.objects.filter(key="group:sms").exists()


@override_settings(DJANGO_DOMAIN_EVENTS={"LANE_LIMITS": {"bulk": {"concurrency_limit": 2}}})
def test_a_lane_limit_holds_every_receiver_of_the_lane_and_no_other() -> None:
    receiver(Pinged, key="t.x", lane="bulk")(lambda evt: None)
    receiver(OrderPlaced, key="t.y", lane="bulk")(lambda evt: None)
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(3)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    now = timezone.now() + timedelta(seconds=1)
    bulk = claim_batch(worker_id="w", now=now, lease=60, limit=50, lane="bulk")
    assert [c.receiver_key for c in bulk] == ["t.x", "t.x"]
    assert claim_batch(worker_id="w2", now=now, lease=60, limit=50, lane="bulk") == []
    assert keys(now, worker="w3") == ["t.free"] * 3  # every lane: the bulk lane is full


@override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": {"sms": {"concurrency_limit": 5}}})
def test_retry_after_from_one_receiver_pauses_the_whole_group_for_every_relay() -> None:
    def busy(evt: Pinged) -> None:
        raise RetryAfter(30, "gateway says slow down")

    receiver(Pinged, key="t.a", limit_group="sms")(busy)
    receiver(OrderPlaced, key="t.b", limit_group="sms")(lambda evt: None)
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(Pinged(n=1))
    run_relay(passes=1)
    fire_each(OrderPlaced(order_id=1))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now, worker="other") == ["t.free"]  # t.b waits with its group
    (group,) = [s for s in outbox_health().limits if s.key == "group:sms"]
    assert group.paused_until is not None and group.kind == "group"
    assert keys(now + timedelta(seconds=40), worker="later") == ["t.a", "t.b"]


@override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": SMS})
def test_health_events_status_prometheus_and_admin_show_the_group(admin_client: object) -> None:
    receiver(Pinged, key="t.a", limit_group="sms")(lambda evt: None)
    receiver(OrderPlaced, key="t.b", limit_group="sms")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(2)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(2)))
    keys(timezone.now() + timedelta(seconds=1))  # one row: the bucket held one token
    (group,) = outbox_health().limits
    assert (group.key, group.rate_limit, group.concurrency_limit) == ("group:sms", "2/s", 3)
    assert (group.running, group.waiting, group.members) == (1, 3, ("t.a", "t.b"))
    out = StringIO()
    call_command("events_status", stdout=out)
    assert "limit group:sms: rate=2/s tokens=" in out.getvalue()
    assert "concurrency=3 running=1 waiting=3 receivers=t.a,t.b" in out.getvalue()
    out = StringIO()
    call_command("events_status", "--format", "json", stdout=out)
    assert json.loads(out.getvalue())["limits"][0]["members"] == ["t.a", "t.b"]
    page = admin_client.get("/admin/django_domain_events/limitrecord/")  # type: ignore[attr-defined]
    text = page.content.decode()
    assert "group:sms" in text and "group: t.a, t.b" in text and "at most 3 at once" in text
    listed = admin_client.get(  # type: ignore[attr-defined]
        "/admin/django_domain_events/deliveryrecord/?limit_group=sms&status__exact=claimed"
    )
    assert listed.status_code == 200 and "1 delivery" in listed.content.decode()
    prometheus = pytest.importorskip("prometheus_client")
    from django_domain_events.contrib.prometheus import register

    metrics = prometheus.CollectorRegistry()
    register(metrics)
    exposed = prometheus.generate_latest(metrics).decode()
    assert 'limit_running{receiver="group:sms"} 1.0' in exposed
    assert 'limit_waiting{receiver="group:sms"} 3.0' in exposed


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"LIMIT_GROUPS": {"sms": {"rate_limit": "50"}}}, r"\['sms'\]\['rate_limit'\] must be"),
        ({"LIMIT_GROUPS": {"sms": {}}}, r"must be a dict with 'rate_limit'"),
        ({"LIMIT_GROUPS": {"sms": {"rate": "5/s"}}}, r"must be a dict with 'rate_limit'"),
        ({"LIMIT_GROUPS": {"sms": {"rate_limit": None}}}, r"limits nothing"),
        ({"LANE_LIMITS": {"bulk": {"concurrency_limit": 0}}}, r"must be an int >= 1"),
        ({"LANE_LIMITS": ["bulk"]}, r"LANE_LIMITS'\] must be a dict of lane name"),
        ({"LIMIT_GROUPS": {"": {"concurrency_limit": 1}}}, r"the name must be a non-empty"),
    ],
)
def test_a_bad_group_or_lane_limit_is_refused_naming_the_value(
    setting: dict[str, object], message: str
) -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS=setting):
        with pytest.raises(ImproperlyConfigured, match=message):
            settings_now()
        errors = [m for m in run_checks(databases=[]) if m.id == "django_domain_events.E001"]
        assert errors and any(__import__("re").search(message, m.msg) for m in errors)


def test_an_unknown_group_is_a_check_error_naming_the_group_and_the_fix() -> None:
    receiver(Pinged, key="t.a", limit_group="smss")(lambda evt: None)
    with override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": SMS}):
        (error,) = [m for m in run_checks(databases=[]) if m.id == "django_domain_events.E022"]
    assert "'smss'" in error.msg and "Did you mean 'sms'?" in error.msg
    assert "LIMIT_GROUPS['smss']" in str(error.hint)


def test_a_lane_limit_on_no_declared_lane_is_a_warning() -> None:
    receiver(Pinged, key="t.a", lane="bulk")(lambda evt: None)
    with override_settings(DJANGO_DOMAIN_EVENTS={"LANE_LIMITS": {"blk": {"rate_limit": "1/s"}}}):
        (warning,) = [m for m in run_checks(databases=[]) if m.id == "django_domain_events.W007"]
    assert "'blk'" in warning.msg


@pytest.mark.parametrize("value", ["", " ", 3, "x" * 65])
def test_a_bad_limit_group_option_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"limit_group=\) must name a group of LIMIT_GROUPS"):
        receiver(Pinged, key="t.bad", limit_group=value)(lambda evt: None)  # type: ignore[arg-type]


@needs_postgresql
@override_settings(DJANGO_DOMAIN_EVENTS={"LIMIT_GROUPS": {"sms": {"rate_limit": "50/s"}}})
def test_a_claim_spends_all_its_rates_or_none_when_another_relay_spends_one_first() -> None:
    # PostgreSQL spends rates without a lock, each bucket by compare-and-set. A claim of
    # t.a spends its own bucket, then the group's; another relay claiming t.b (another
    # lane, the same group) spends the group's in between: the first claim's spend of its
    # own bucket is undone with it, and its rows go back unstarted.
    receiver(Pinged, key="t.a", lane="a", limit_group="sms", rate_limit="50/s")(lambda e: None)
    receiver(OrderPlaced, key="t.b", lane="b", limit_group="sms")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(20)), *(OrderPlaced(order_id=n) for n in range(20)))
    now = timezone.now() + timedelta(seconds=1)
    other: dict[str, list[Claim]] = {}
    spends = []

    def other_relay() -> None:
        try:
            other["claims"] = claim_batch(worker_id="w1", now=now, lease=60, limit=50, lane="b")
        finally:
            connection.close()

    def between_spends(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().startswith("UPDATE django_domain_events_limit"):
            spends.append(params[2])
            if len(spends) == 2:  # its own bucket spent, the group's next
                thread = threading.Thread(target=other_relay)
                thread.start()
                thread.join(30)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(between_spends):
        mine = claim_batch(worker_id="w2", now=now, lease=60, limit=50, lane="a")
    assert spends == ["t.a", "group:sms"]
    assert mine == [] and [c.receiver_key for c in other["claims"]] == ["t.b"] * 10
    assert LimitRecord.objects.get(key="t.a").tokens == 10.0  # its spend undone
    assert LimitRecord.objects.get(key="group:sms").tokens == 0.0  # the other relay's
    waiting = DeliveryRecord.objects.filter(receiver_key="t.a", status=DeliveryStatus.PENDING)
    assert waiting.count() == 20 and {r.attempts for r in waiting} == {0}
