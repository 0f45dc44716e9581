"""Order per key (``@receiver(ordered_by=)``, ``delivery/ordering.py``): declaring, the
key stored at fire, the head-only claim on every database, and the operations."""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from django_domain_events import (
    DURABLE,
    INLINE,
    AnyEvent,
    Constant,
    DeliveryStatus,
    NotYet,
    cancel_deliveries,
    fire,
    outbox_health,
    prune_events,
    receiver,
    replay_events,
    requeue_dead,
)
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.delivery.run import attempt
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, Pinged

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "t.ordered"


def ordered(**options: Any) -> list[int]:
    """Declare the ordered receiver; returns the list its runs append order ids to."""
    ran: list[int] = []
    options.setdefault("ordered_by", lambda evt: evt.order_id % 10)

    def run(evt: OrderPlaced) -> None:
        ran.append(evt.order_id)

    receiver(OrderPlaced, key=KEY, **options)(run)
    return ran


def fire_orders(*order_ids: int) -> list[int]:
    """Fire one OrderPlaced per id, each in its own transaction; the rows' ids in order."""
    for order_id in order_ids:
        with transaction.atomic():
            fire(OrderPlaced(order_id=order_id))
    return list(DeliveryRecord.objects.order_by("-id").values_list("id", flat=True))[
        : len(order_ids)
    ][::-1]


def claim(seconds: float = 0, **options: Any) -> list[Any]:
    options.setdefault("limit", 50)
    now = timezone.now() + timedelta(seconds=seconds)
    return claim_batch(worker_id="w", now=now, lease=30, **options)


def run_all(seconds: float = 0) -> list[Any]:
    """Claim every claimable row and run each; the claims."""
    claims = claim(seconds)
    for c in claims:
        attempt(c, now=timezone.now() + timedelta(seconds=seconds))
    return claims


def status(pk: int) -> str:
    return DeliveryRecord.objects.get(pk=pk).status


# declaring -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"ordered_by": "order_id"}, TypeError, "ordered_by"),
        ({"ordered_by": lambda e: 1, "on_dead": "stop"}, ValueError, "'stop'"),
        ({"on_dead": "block"}, ValueError, "add ordered_by"),
        ({"ordered_by": lambda e: 1, "mode": INLINE}, ValueError, "DURABLE"),
    ],
)
def test_bad_declarations_are_refused_naming_the_value_and_the_fix(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        receiver(OrderPlaced, key=KEY, **options)(lambda evt: None)


# firing --------------------------------------------------------------------------


def test_the_key_is_computed_at_fire_and_stored_as_text() -> None:
    ordered(ordered_by=lambda evt: evt.order_id)
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    fire_orders(42)
    keys = dict(DeliveryRecord.objects.values_list("receiver_key", "order_key"))
    assert keys == {KEY: "42", "t.plain": None}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, TypeError),
        (True, TypeError),
        (1.5, TypeError),
        ("", ValueError),
        ("x" * 201, ValueError),
    ],
)
def test_a_bad_key_fails_the_fire_and_writes_nothing(value: object, error: type[Exception]) -> None:
    ordered(ordered_by=lambda evt: value)
    with pytest.raises(error, match="ordered_by of receiver 't.ordered'"), transaction.atomic():
        fire(OrderPlaced(order_id=1))
    assert not EventRecord.objects.exists()
    assert not DeliveryRecord.objects.exists()


def test_a_bad_key_fails_before_the_event_row_when_another_receiver_calls_user_code() -> None:
    ordered(ordered_by=lambda evt: None)
    receiver(OrderPlaced, key="t.fan", targets=lambda evt: ["a"])(lambda evt: None)
    # The caller catches the error and commits.
    with transaction.atomic(), contextlib.suppress(TypeError):
        fire(OrderPlaced(order_id=1))
    assert not EventRecord.objects.exists()


# the claim -----------------------------------------------------------------------


def test_only_each_keys_head_is_claimed_and_other_keys_are_not_held() -> None:
    ordered()
    a1, b1, a2, a3, b2 = fire_orders(1, 2, 11, 21, 12)
    assert [c.id for c in claim()] == [a1, b1]


def test_a_keys_next_row_is_claimable_once_its_head_succeeded() -> None:
    ran = ordered()
    fire_orders(1, 11, 21, 2)
    while run_all():
        pass
    assert ran == [1, 2, 11, 21]


def test_unordered_rows_are_not_held() -> None:
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    ordered()
    fire_orders(1, 11)
    keys = sorted((c.receiver_key, c.event_id) for c in claim())
    assert [k for k, _ in keys] == [KEY, "t.plain", "t.plain"]


def test_a_failing_head_holds_its_key_while_it_retries() -> None:
    failures = {1}

    def flaky(evt: OrderPlaced) -> None:
        if evt.order_id in failures:
            failures.discard(evt.order_id)
            raise RuntimeError("down")

    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", backoff_base_seconds=60)(flaky)
    head, second = fire_orders(1, 2)
    assert [c.id for c in run_all()] == [head]
    assert status(head) == DeliveryStatus.FAILED
    assert claim() == []  # its backoff has not passed, and the second waits behind it
    assert [c.id for c in run_all(3600)] == [head]
    assert [c.id for c in run_all(3600)] == [second]


def test_a_claimed_head_holds_its_key_and_a_lapsed_one_is_taken_over_first() -> None:
    ordered(ordered_by=lambda e: "k")
    head, _ = fire_orders(1, 2)
    assert [c.id for c in claim()] == [head]
    assert claim() == []
    assert [c.id for c in claim(31)] == [head]


def test_a_batch_never_holds_two_rows_of_one_key() -> None:
    ordered(ordered_by=lambda e: e.order_id % 3)
    fire_orders(*range(30))
    claims = claim(limit=30, at_once=True)
    assert len(claims) == 3


def test_not_yet_and_a_future_due_head_hold_the_key() -> None:
    def later(evt: OrderPlaced) -> None:
        if evt.order_id == 1:
            raise NotYet(until=timezone.now() + timedelta(hours=1))

    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k")(later)
    head, second = fire_orders(1, 2)
    assert [c.id for c in run_all()] == [head]
    assert claim(60) == []
    assert [c.id for c in claim(3601)] == [head]


def test_a_due_head_holds_the_rows_fired_after_it() -> None:
    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", due=timedelta(hours=1))(
        lambda evt: None
    )
    fire_orders(1)
    assert claim() == []


@pytest.mark.parametrize("on_dead", ["skip", "block"])
def test_a_dead_head_releases_its_key_under_skip_and_holds_it_under_block(on_dead: str) -> None:
    def dies(evt: OrderPlaced) -> None:
        if evt.order_id == 1:
            raise RuntimeError("boom")

    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", max_attempts=1, on_dead=on_dead)(dies)
    head, second = fire_orders(1, 2)
    run_all()
    assert status(head) == DeliveryStatus.DEAD
    assert [c.id for c in claim()] == ([second] if on_dead == "skip" else [])


def test_an_any_event_receiver_keeps_one_order_across_event_classes() -> None:
    seen: list[str] = []
    receiver(AnyEvent, key=KEY, ordered_by=lambda e: "one", mode=DURABLE)(
        lambda evt: seen.append(type(evt).__name__)
    )
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
        fire(Pinged())
        fire(OrderPlaced(order_id=2))
    while len(run_all()) == 1:
        pass
    assert seen == ["OrderPlaced", "Pinged", "OrderPlaced"]


# operations ------------------------------------------------------------------------


def test_replay_appends_to_the_keys_order() -> None:
    ran = ordered(ordered_by=lambda e: "k")
    fire_orders(1)
    run_all()
    first_event = EventRecord.objects.get().pk
    fire_orders(2)
    replay_events([first_event])
    rows = list(DeliveryRecord.objects.order_by("id").values_list("event_id", "order_key"))
    assert rows[-1] == (first_event, "k")  # the replay is the key's newest row
    while run_all():
        pass
    assert ran == [1, 2, 1]


def test_requeue_of_a_dead_row_keeps_its_place_under_block() -> None:
    ran: list[int] = []
    fail = {1}

    def dies(evt: OrderPlaced) -> None:
        if evt.order_id in fail:
            raise RuntimeError("boom")
        ran.append(evt.order_id)

    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", max_attempts=1, on_dead="block")(dies)
    head, second = fire_orders(1, 2)
    run_all()
    fail.clear()
    assert requeue_dead(delivery_ids=[head]) == 1
    assert [c.id for c in claim()] == [head]


def test_a_requeued_row_waits_for_its_keys_running_row_under_skip() -> None:
    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", max_attempts=1)(
        lambda evt: (_ for _ in ()).throw(RuntimeError("x")) if evt.order_id == 1 else None
    )
    head, second = fire_orders(1, 2)
    run_all()
    assert [c.id for c in claim()] == [second]  # the dead head is skipped
    requeue_dead(delivery_ids=[head])
    assert claim() == []  # the second is running: the requeued head waits for it


def test_cancelling_a_head_releases_its_key() -> None:
    ordered(ordered_by=lambda e: "k", due=timedelta(hours=1))
    fire_orders(1, 2)
    first, _ = EventRecord.objects.order_by("id").values_list("id", flat=True)
    cancel_deliveries([first])
    assert [c.event_id for c in claim(3601)] == [first + 1]


# visible ---------------------------------------------------------------------------


@pytest.mark.parametrize("on_dead", ["skip", "block"])
def test_health_and_events_status_show_each_held_key_and_its_head(on_dead: str) -> None:
    def dies(evt: OrderPlaced) -> None:
        raise RuntimeError("boom") if evt.order_id in (1, 3) else None

    receiver(
        OrderPlaced, key=KEY, ordered_by=lambda e: e.order_id % 2, max_attempts=1, on_dead=on_dead
    )(dies)
    receiver(OrderPlaced, key="t.retrying", ordered_by=lambda e: "r", retry=Constant(600))(
        lambda evt: (_ for _ in ()).throw(RuntimeError("x"))
    )
    dead_head, *_ = fire_orders(1, 2, 3)
    run_all()
    held = outbox_health().held_keys
    expected = [("t.retrying", "r", "failed", "retrying", 2)]
    if on_dead == "block":
        expected.insert(0, (KEY, "1", "dead", "dead under block", 1))
    assert [(h.receiver_key, h.order_key, h.status, h.why, h.waiting) for h in held] == expected
    out = StringIO()
    call_command("events_status", stdout=out)
    assert "held key t.retrying 'r': by delivery" in out.getvalue()


# the plan ---------------------------------------------------------------------------


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan")
def test_the_claim_reads_the_partial_indexes_not_the_settled_history() -> None:
    """50,000 settled rows of the ordered receiver and a hot key's backlog of 2,000:
    the claim's plan reads the partial indexes, never a sequential scan of the table."""
    ordered(ordered_by=lambda e: "hot" if e.order_id < 2 else str(e.order_id))
    fire_orders(0, 1, 2)
    delivery = DeliveryRecord._meta.db_table
    event_id = EventRecord.objects.earliest("id").pk
    copy = (
        f"INSERT INTO {delivery} (event_id, receiver_key, target, status, attempts, "
        "available_at, claim_rank, priority_credit, due_at, claimed_by, claim_position, "
        "last_error, order_key) SELECT %s, %s, 'x' || n, %s, 0, now(), 0, 0, now(), '', 0, '', "
        "%s || (n %% %s) FROM generate_series(1, %s) AS n"
    )
    statements: list[tuple[str, object]] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.cursor() as cursor:
        cursor.execute(copy, [event_id, KEY, "succeeded", "k", 1000, 50_000])
        cursor.execute(
            copy.replace("'x' || n", "'y' || n"), [event_id, KEY, "pending", "hot", 1, 2000]
        )
        cursor.execute(f"ANALYZE {delivery}")
    with transaction.atomic():
        with connection.execute_wrapper(record):
            claim_batch(worker_id="w", now=timezone.now(), lease=60, limit=5)
        claim_sql, params = next(s for s in statements if "SKIP LOCKED" in s[0])
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + claim_sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "dde_delivery_order" in plan, plan
    assert f"Seq Scan on {delivery}" not in plan, plan


def test_the_admin_lists_and_filters_deliveries_by_order_key(admin_client: Any) -> None:
    ordered(ordered_by=lambda e: f"order-{e.order_id}")
    fire_orders(1, 2)
    url = reverse("admin:django_domain_events_deliveryrecord_changelist")
    page = admin_client.get(url).content.decode()
    assert "order-1" in page and "order-2" in page
    only = admin_client.get(url, {"order_key": "order-2"}).content.decode()
    assert "order-2" in only and "order-1</td>" not in only


def test_the_dashboard_lists_held_keys_linked_to_their_rows(admin_client: Any) -> None:
    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", retry=Constant(600))(
        lambda evt: (_ for _ in ()).throw(RuntimeError("x"))
    )
    head, _ = fire_orders(1, 2)
    run_all()
    page = admin_client.get(
        reverse("admin:django_domain_events_deliveryrecord_dashboard")
    ).content.decode()
    assert 'id="dde-held-keys"' in page
    assert f'<td class="dde-n">{head}</td>' in page and "retrying" in page
    assert "receiver=t.ordered&amp;order_key=k" in page


def test_prune_takes_only_settled_events_and_leaves_the_key_to_its_next_row() -> None:
    ran = ordered(ordered_by=lambda e: "k", due=timedelta(minutes=1))
    fire_orders(1, 2)
    assert [c.event_id for c in run_all(61)] == [EventRecord.objects.earliest("id").pk]
    assert prune_events(timedelta(0), now=timezone.now() + timedelta(days=1)) == 1
    assert EventRecord.objects.count() == 1
    run_all(61)
    assert ran == [1, 2]


def test_events_status_json_carries_the_held_keys() -> None:
    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", retry=Constant(600))(
        lambda evt: (_ for _ in ()).throw(RuntimeError("x"))
    )
    head, _ = fire_orders(1, 2)
    run_all()
    out = StringIO()
    call_command("events_status", "--format", "json", stdout=out)
    (held,) = json.loads(out.getvalue())["held_keys"]
    assert (held["delivery_id"], held["order_key"], held["why"]) == (head, "k", "retrying")


def test_an_eager_attempt_leaves_a_row_that_is_not_its_keys_head_to_the_relay() -> None:
    ran: list[int] = []

    def first_fails(evt: OrderPlaced) -> None:
        if evt.order_id == 1:
            raise RuntimeError("down")
        ran.append(evt.order_id)

    receiver(OrderPlaced, key=KEY, ordered_by=lambda e: "k", eager=True, retry=Constant(600))(
        first_fails
    )
    head, second = fire_orders(1, 2)
    assert ran == []  # the second's eager attempt found its key held by the first
    assert (status(head), status(second)) == (DeliveryStatus.FAILED, DeliveryStatus.PENDING)


def test_an_ack_batch_receiver_runs_each_key_in_order() -> None:
    """Its claims hold one row of each key (see test_a_batch_never_holds_two_rows_of_one_key),
    so a group acknowledged in one commit never holds two of one key."""
    from django_domain_events import deliver_pending

    ran = ordered(ordered_by=lambda e: e.order_id % 2, ack="batch")
    fire_orders(*range(8))
    deliver_pending(batch_size=10)
    assert [n for n in ran if n % 2 == 0] == [0, 2, 4, 6]
    assert [n for n in ran if n % 2] == [1, 3, 5, 7]
    assert not DeliveryRecord.objects.exclude(status="succeeded").exists()
