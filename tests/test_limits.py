"""rate_limit= and concurrency_limit=: held in the database, whichever relay claims."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import RetryAfter, fire, receiver, run_relay
from django_domain_events.delivery import limits
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.models import DeliveryRecord, DeliveryStatus, LimitRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import needs_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def fire_each(*events: object) -> None:
    with transaction.atomic():
        for evt in events:
            fire(evt)


def keys(now: object, limit: int = 50, worker: str = "w", lease: float = 60) -> list[str]:
    return [
        c.receiver_key for c in claim_batch(worker_id=worker, now=now, lease=lease, limit=limit)
    ]


def test_a_rate_limit_leaves_rows_past_it_owed_and_the_rest_of_the_lane_runs() -> None:
    receiver(Pinged, key="t.sms", rate_limit="2/s")(lambda evt: None)  # burst: one token
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(5)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(3)))
    now = timezone.now() + timedelta(seconds=1)
    assert sorted(keys(now)) == ["t.free", "t.free", "t.free", "t.sms"]
    assert keys(now, worker="w2") == []  # no token left, whichever relay asks
    waiting = DeliveryRecord.objects.filter(receiver_key="t.sms", status=DeliveryStatus.PENDING)
    assert waiting.count() == 4 and {r.attempts for r in waiting} == {0}  # nothing spent
    assert keys(now + timedelta(seconds=0.5), worker="w3") == ["t.sms"]  # the next token


def test_a_busy_rate_is_granted_in_handfuls_not_a_row_per_token() -> None:
    # 50/s: the bucket holds 10 tokens (a fifth of a second), and is granted only once it
    # has gathered 5 again, so four busy relays do not each lock it for every new token.
    receiver(Pinged, key="t.sms", rate_limit="50/s")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(30)))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now) == ["t.sms"] * 10  # the full bucket
    limits._empty_until.clear()  # another relay, which has not seen the bucket spent
    assert keys(now + timedelta(seconds=0.04), worker="w2") == []  # 2 tokens: not yet
    wait = limits.seconds_to_token()
    assert wait is not None and 0.04 < wait <= 0.06  # until it holds 5
    limits._empty_until.clear()
    assert keys(now + timedelta(seconds=0.1), worker="w3") == ["t.sms"] * 5
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.CLAIMED).count() == 15


def test_a_concurrency_limit_counts_the_rows_under_a_live_lease() -> None:
    receiver(Pinged, key="t.crm", concurrency_limit=2)(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(5)))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now, lease=30) == ["t.crm", "t.crm"]
    assert keys(now + timedelta(seconds=10), worker="w2") == []
    # The first worker died: once its lease lapsed, its rows no longer hold the limit.
    assert keys(now + timedelta(seconds=31), worker="w3") == ["t.crm", "t.crm"]


def test_a_finished_row_frees_its_place() -> None:
    receiver(Pinged, key="t.crm", concurrency_limit=1)(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(3)))
    run_relay(passes=3)
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 3


def test_retry_after_from_a_limited_receiver_pauses_it_for_every_relay() -> None:
    def busy(evt: Pinged) -> None:
        raise RetryAfter(30, "gateway says slow down")

    receiver(Pinged, key="t.gateway", concurrency_limit=5)(busy)
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(Pinged(n=1))
    run_relay(passes=1)
    fire_each(Pinged(n=2), OrderPlaced(order_id=1))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now, worker="other") == ["t.free"]  # the fresh row waits with the group
    assert keys(now + timedelta(seconds=40), worker="later") == ["t.gateway", "t.gateway"]


@pytest.mark.parametrize("rate", ["50", "50/d", "0/s", "fast", 50, "-1/s"])
def test_a_bad_rate_limit_is_refused_naming_the_form(rate: object) -> None:
    with pytest.raises(ValueError, match=r"rate_limit=\) must be a count per second"):
        receiver(Pinged, key="t.bad", rate_limit=rate)(lambda evt: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_a_bad_concurrency_limit_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"concurrency_limit=\) must be an int >= 1"):
        receiver(Pinged, key="t.bad", concurrency_limit=value)(lambda evt: None)  # type: ignore[arg-type]


def test_events_status_and_health_show_each_limit_its_use_and_what_waits() -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    from django_domain_events import outbox_health

    receiver(Pinged, key="t.sms", rate_limit="2/s", concurrency_limit=3)(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(4)))
    keys(timezone.now() + timedelta(seconds=1))  # one row claimed: the bucket held one token
    (limit,) = outbox_health().limits
    assert (limit.key, limit.rate_limit, limit.concurrency_limit) == ("t.sms", "2/s", 3)
    assert (limit.running, limit.waiting) == (1, 3)
    out = StringIO()
    call_command("events_status", stdout=out)
    assert "limit t.sms: rate=2/s tokens=" in out.getvalue()
    assert "concurrency=3 running=1 waiting=3" in out.getvalue()
    out = StringIO()
    call_command("events_status", "--format", "json", stdout=out)
    assert json.loads(out.getvalue())["limits"][0]["waiting"] == 3


def test_prometheus_reports_each_limit() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from django_domain_events.contrib.prometheus import register

    receiver(Pinged, key="t.crm", concurrency_limit=2)(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(3)))
    keys(timezone.now() + timedelta(seconds=1))
    registry = CollectorRegistry()
    register(registry)
    text = generate_latest(registry).decode()
    assert 'limit_running{receiver="t.crm"} 2.0' in text
    assert 'limit_waiting{receiver="t.crm"} 1.0' in text
    assert 'limit_concurrency{receiver="t.crm"} 2.0' in text


def test_the_admin_lists_each_limit(admin_client: object) -> None:
    receiver(Pinged, key="t.crm", concurrency_limit=2)(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(3)))
    keys(timezone.now() + timedelta(seconds=1))
    page = admin_client.get("/admin/django_domain_events/limitrecord/")  # type: ignore[attr-defined]
    assert page.status_code == 200
    text = page.content.decode()
    assert "t.crm" in text and "at most 2 at once" in text


def _holding_limit_row(key: str, held: threading.Event, done: threading.Event) -> None:
    """Another claim's transaction: holds the limit row ``key`` locked until ``done``."""
    try:
        with transaction.atomic():
            list(LimitRecord.objects.select_for_update().filter(key=key))
            held.set()
            done.wait(30)
    finally:
        connection.close()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite holds no row lock")
def test_a_rate_held_by_another_claim_costs_a_statement_or_two_and_is_left_to_its_holder() -> None:
    # 100/s: the bucket holds 20 tokens and is granted from 10, gathered in 0.1 s. A relay
    # that finds it held asks again 0.05 s later, not at its next claim: four busy relays
    # each asking at every claim locked it twice as often as it was granted. MariaDB's
    # claim skips the locked row; PostgreSQL's reads it, claims, fails to spend it (one
    # statement that skips the lock) and hands the rows back.
    receiver(Pinged, key="t.sms", rate_limit="100/s")(lambda evt: None)
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(60)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(9)))
    now = timezone.now() + timedelta(seconds=1)
    assert "t.sms" in keys(now, limit=1)  # the limit's row is written
    held, done = threading.Event(), threading.Event()
    other = threading.Thread(target=_holding_limit_row, args=("t.sms", held, done))
    other.start()
    try:
        assert held.wait(10)
        with CaptureQueriesContext(connection) as queries:
            first = keys(now + timedelta(seconds=1), limit=3, worker="w2")
            wait = limits.seconds_to_token()
            second = keys(now + timedelta(seconds=1.04), limit=3, worker="w2")
    finally:
        done.set()
        other.join(10)
    assert first == second == ["t.free"] * 3  # the held limit's rows wait
    assert wait is not None and 0.03 < wait <= 0.05  # an idle relay sleeps that long
    on_limits = [q["sql"] for q in queries if "django_domain_events_limit" in q["sql"]]
    # The first claim's skipped lock alone (no "does it exist?"), or its read and its
    # spend; the second: nothing.
    assert len(on_limits) == (2 if connection.vendor == "postgresql" else 1), on_limits
    waiting = DeliveryRecord.objects.filter(receiver_key="t.sms", status=DeliveryStatus.PENDING)
    assert waiting.count() == 59 and {r.attempts for r in waiting} == {0}  # none taken
    # Past the wait, its holder gone, the bucket is asked and granted again.
    assert keys(now + timedelta(seconds=1.06), worker="w3").count("t.sms") == 20


@needs_postgresql
def test_a_rate_spent_by_another_relay_between_read_and_spend_hands_its_rows_back() -> None:
    # PostgreSQL takes a rate without locking it: read, claim, spend by compare-and-set.
    # Another relay's whole claim runs between this one's claim and its spend: the bucket
    # is no longer what was read, so this claim spends nothing and hands its rows back,
    # and no more rows are claimed than the bucket held.
    receiver(Pinged, key="t.sms", rate_limit="50/s")(lambda evt: None)  # 10 tokens at most
    receiver(OrderPlaced, key="t.free")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(40)))
    fire_each(*(OrderPlaced(order_id=n) for n in range(4)))
    now = timezone.now() + timedelta(seconds=1)
    other: dict[str, list[str]] = {}

    def other_relay() -> None:
        try:
            other["keys"] = keys(now, worker="w1")
        finally:
            connection.close()

    def before_spend(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().startswith("UPDATE django_domain_events_limit") and not other:
            thread = threading.Thread(target=other_relay)
            thread.start()
            thread.join(30)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(before_spend):
        mine = keys(now, worker="w2")
    assert other["keys"].count("t.sms") == 10  # the bucket, all of it
    assert mine.count("t.sms") == 0 and mine.count("t.free") == 4 - other["keys"].count("t.free")
    claimed = DeliveryRecord.objects.filter(receiver_key="t.sms", status=DeliveryStatus.CLAIMED)
    assert set(claimed.values_list("claimed_by", flat=True)) == {"w1"} and claimed.count() == 10
    waiting = DeliveryRecord.objects.filter(receiver_key="t.sms", status=DeliveryStatus.PENDING)
    assert waiting.count() == 30 and {r.attempts for r in waiting} == {0}
    assert LimitRecord.objects.get(key="t.sms").tokens == 0.0


def test_a_limit_row_deleted_meanwhile_is_written_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver(Pinged, key="t.sms", rate_limit="100/s")(lambda evt: None)
    fire_each(*(Pinged(n=n) for n in range(40)))
    now = timezone.now() + timedelta(seconds=1)
    assert keys(now, limit=1) == ["t.sms"]
    LimitRecord.objects.filter(key="t.sms").delete()  # e.g. by hand, in a shell
    monkeypatch.setattr(limits, "SEEN_SECONDS", 0.0)  # as once SEEN_SECONDS have passed
    assert keys(now + timedelta(seconds=1), limit=1, worker="w2") == ["t.sms"]
    assert LimitRecord.objects.filter(key="t.sms").count() == 1


@needs_postgresql
def test_two_relays_claiming_the_rest_of_a_limited_lane_at_once_take_disjoint_rows() -> None:
    # Each other receiver's rows are read apart and merged (PostgreSQL): a claim holding
    # its rows locked, in a transaction not yet committed, must neither block a second
    # relay's claim nor hand it the same rows.
    for key, event in (("t.a", OrderPlaced), ("t.b", Pinged)):
        receiver(event, key=key, lane="bulk")(lambda evt: None)
    receiver(Pinged, key="t.sms", lane="bulk", rate_limit="1/s")(lambda evt: None)
    fire_each(*(OrderPlaced(order_id=n) for n in range(6)), *(Pinged(n=n) for n in range(6)))
    now = timezone.now() + timedelta(seconds=1)
    held, release, got = threading.Event(), threading.Event(), {}

    def first() -> None:
        with transaction.atomic():
            got["first"] = claim_batch(worker_id="w1", now=now, lease=60, limit=4, lane="bulk")
            held.set()
            got["waited out"] = not release.wait(30)  # the second claim blocked on it
        connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.wait(30)
        second = claim_batch(worker_id="w2", now=now, lease=60, limit=4, lane="bulk")
    finally:
        release.set()
        thread.join(30)
    assert not got["waited out"]
    first_ids = {c.id for c in got["first"]}
    assert len(first_ids) == 4 and first_ids.isdisjoint(c.id for c in second)
    # The first took the one token and 3 of the 12 others' rows; the second, with no
    # token left, takes a full batch of the other 9.
    assert [c.receiver_key for c in got["first"]].count("t.sms") == 1
    assert len(second) == 4 and "t.sms" not in {c.receiver_key for c in second}
