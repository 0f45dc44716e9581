"""fire(): the event row and its delivery rows, in the caller's transaction."""

from __future__ import annotations

import warnings
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import (
    INLINE,
    ON_COMMIT,
    AnyEvent,
    DeliveryStatus,
    UnsupportedPayloadType,
    attributed,
    caused_by,
    current_scope,
    drain_outbox,
    fire,
    priority,
    propagate_scope,
    receiver,
    suppressed,
)
from django_domain_events.firing import OutsideAtomicWarning
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, OrderShipped, Pinged
from tests.app.models import Order

pytestmark = pytest.mark.django_db


def test_fire_writes_the_event_and_one_row_per_durable_receiver() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    receiver(OrderPlaced, key="t.b")(lambda evt: None)
    receiver(OrderPlaced, key="t.inline", mode=INLINE)(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=7, total=Decimal("9.50"), tags=("x",)))
    row = EventRecord.objects.get(pk=event_id)
    assert row.name == "testapp.OrderPlaced"
    assert row.version == 1
    assert row.payload == {"order_id": 7, "total": "9.50", "tags": ["x"]}
    assert row.occurred_at == row.recorded_at
    keys = sorted(
        DeliveryRecord.objects.filter(event_id=event_id).values_list("receiver_key", flat=True)
    )
    assert keys == ["t.a", "t.b"]
    delivery = DeliveryRecord.objects.get(event_id=event_id, receiver_key="t.a")
    assert delivery.status == DeliveryStatus.PENDING
    assert delivery.attempts == 0
    assert delivery.max_attempts == 5
    assert delivery.target == ""
    assert delivery.due_at == delivery.available_at == row.recorded_at


def test_an_exception_after_fire_leaves_no_event_and_no_delivery() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(number="A1")
        fire(OrderPlaced(order_id=1))
        raise RuntimeError("the change failed after the fire")
    assert not Order.objects.exists()
    assert not EventRecord.objects.exists()
    assert not DeliveryRecord.objects.exists()


def test_an_inline_receiver_raising_rolls_back_the_callers_change() -> None:
    def veto(evt: OrderPlaced) -> None:
        raise ValueError("order total is not allowed")

    receiver(OrderPlaced, key="t.veto", mode=INLINE)(veto)
    receiver(OrderPlaced, key="t.durable")(lambda evt: None)
    with pytest.raises(ValueError, match="not allowed"), transaction.atomic():
        Order.objects.create(number="A1")
        fire(OrderPlaced(order_id=1))
    assert not Order.objects.exists()
    assert not EventRecord.objects.exists()
    assert not DeliveryRecord.objects.exists()


def test_inline_receivers_see_the_callers_uncommitted_rows() -> None:
    seen: list[int] = []
    receiver(OrderPlaced, key="t.inline", mode=INLINE)(
        lambda evt: seen.append(Order.objects.filter(pk=evt.order_id).count())
    )
    with transaction.atomic():
        order = Order.objects.create(number="A1")
        fire(OrderPlaced(order_id=order.pk))
    assert seen == [1]


@pytest.mark.django_db(transaction=True)
def test_on_commit_receivers_run_after_commit_and_their_errors_are_logged(caplog) -> None:
    ran: list[int] = []

    def boom(evt: OrderPlaced) -> None:
        raise RuntimeError("mail server down")

    receiver(OrderPlaced, key="t.after", mode=ON_COMMIT)(lambda evt: ran.append(evt.order_id))
    receiver(OrderPlaced, key="t.boom", mode=ON_COMMIT)(boom)
    with transaction.atomic():
        fire(OrderPlaced(order_id=3))
        assert ran == []
    assert ran == [3]
    assert "t.boom" in caplog.text and "mail server down" in caplog.text
    with pytest.raises(RuntimeError), transaction.atomic():
        fire(OrderPlaced(order_id=4))
        raise RuntimeError("rolled back")
    assert ran == [3]


@pytest.mark.django_db(transaction=True)
def test_an_eager_receiver_is_attempted_right_after_commit() -> None:
    ran: list[int] = []
    receiver(OrderPlaced, key="t.eager", eager=True)(lambda evt: ran.append(evt.order_id))
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=5))
        assert ran == []
    assert ran == [5]
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status == DeliveryStatus.SUCCEEDED
    assert row.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_eager_attempt_leaves_the_row_to_the_relay() -> None:
    calls: list[int] = []

    def flaky(evt: OrderPlaced) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("first try fails")

    receiver(OrderPlaced, key="t.eager", eager=True)(flaky)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=5))
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status == DeliveryStatus.FAILED
    assert row.last_error == "ConnectionError: first try fails"
    drain_outbox()
    row.refresh_from_db()
    assert row.status == DeliveryStatus.SUCCEEDED
    assert row.attempts == 2


def test_targets_fan_out_one_row_per_distinct_target() -> None:
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: ["b", "a", "b", "c"])(
        lambda evt: None
    )
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    targets = sorted(
        DeliveryRecord.objects.filter(event_id=event_id).values_list("target", flat=True)
    )
    assert targets == ["a", "b", "c"]


def test_targets_see_uncommitted_rows_and_an_empty_result_writes_no_row() -> None:
    def recipients(evt: OrderPlaced, ctx) -> list[str]:
        assert ctx.delivery_id is None and ctx.due_at is None
        return [o.number for o in Order.objects.filter(pk=evt.order_id)]

    receiver(OrderPlaced, key="t.fan", targets=recipients)(lambda evt: None)
    with transaction.atomic():
        order = Order.objects.create(number="N-1")
        first = fire(OrderPlaced(order_id=order.pk))
        second = fire(OrderPlaced(order_id=order.pk + 1000))
    assert list(DeliveryRecord.objects.filter(event_id=first).values_list("target", flat=True)) == [
        "N-1"
    ]
    assert not DeliveryRecord.objects.filter(event_id=second).exists()


@pytest.mark.parametrize(
    "result, message",
    [
        (["ok", 3], "every target must be a non-empty string"),
        (["ok", "  "], "every target must be a non-empty string"),
        ("abc", "must return an iterable of strings"),
        (None, "must return an iterable of strings"),
    ],
)
def test_bad_targets_make_fire_raise_and_roll_back(result: object, message: str) -> None:
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: result)(lambda evt: None)
    with pytest.raises((TypeError, ValueError), match=message), transaction.atomic():
        Order.objects.create(number="A")
        fire(OrderPlaced(order_id=1))
    assert not Order.objects.exists() and not EventRecord.objects.exists()


def test_a_raising_targets_callable_rolls_back_the_callers_change() -> None:
    def broken(evt: OrderPlaced, ctx) -> list[str]:
        raise LookupError("no recipients table")

    receiver(OrderPlaced, key="t.fan", targets=broken)(lambda evt: None)
    with pytest.raises(LookupError), transaction.atomic():
        Order.objects.create(number="A")
        fire(OrderPlaced(order_id=1))
    assert not Order.objects.exists() and not EventRecord.objects.exists()


def test_a_sync_targets_callable_returning_an_awaitable_is_refused() -> None:
    async def later() -> list[str]:
        return ["a"]

    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: later())(lambda evt: None)
    with pytest.raises(TypeError, match="returned an awaitable"), transaction.atomic():
        fire(OrderPlaced(order_id=1))


def test_any_event_receivers_are_owed_every_event() -> None:
    receiver(AnyEvent, key="t.audit")(lambda evt: None)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
        fire(Pinged(n=2))
    names = sorted(
        DeliveryRecord.objects.filter(receiver_key="t.audit").values_list("event__name", flat=True)
    )
    assert names == ["testapp.OrderPlaced", "testapp.Pinged"]


def test_a_dedupe_key_returns_the_first_event_and_writes_nothing() -> None:
    receiver(OrderPlaced, key="t.a")(lambda evt: None)
    with transaction.atomic():
        first = fire(OrderPlaced(order_id=1), dedupe_key="order-1")
        again = fire(OrderPlaced(order_id=1), dedupe_key="order-1")
        other = fire(Pinged(), dedupe_key="order-1")
    assert again == first
    assert other != first
    assert EventRecord.objects.filter(name="testapp.OrderPlaced").count() == 1
    assert DeliveryRecord.objects.filter(receiver_key="t.a").count() == 1


def test_a_dedupe_key_is_validated() -> None:
    with pytest.raises(ValueError, match="at most 255"), transaction.atomic():
        fire(Pinged(), dedupe_key="k" * 256)
    assert not EventRecord.objects.exists()


def test_occurred_at_is_the_domains_time_and_recorded_at_the_write_time() -> None:
    then = timezone.now() - timedelta(days=3)
    with transaction.atomic():
        event_id = fire(Pinged(), occurred_at=then)
    row = EventRecord.objects.get(pk=event_id)
    assert row.occurred_at == then
    assert row.recorded_at > then + timedelta(days=2)


@pytest.mark.django_db(transaction=True)
def test_fire_in_autocommit_records_and_warns() -> None:
    # A real autocommit connection: no test transaction around this test.
    assert connection.get_autocommit() and not connection.in_atomic_block
    with pytest.warns(OutsideAtomicWarning, match="outside transaction.atomic"):
        event_id = fire(Pinged())
    # Recorded, and committed on its own: another connection sees it at once.
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM {EventRecord._meta.db_table} WHERE id = %s", [event_id]
            )
            assert cursor.fetchone()[0] == 1
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_no_warning_inside_atomic_on_an_autocommit_connection() -> None:
    assert connection.get_autocommit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with transaction.atomic():
            event_id = fire(Pinged())
    assert EventRecord.objects.filter(pk=event_id).exists()


def test_an_unencodable_payload_is_refused_inside_fire_naming_the_field() -> None:
    with pytest.raises(UnsupportedPayloadType, match="order_id"), transaction.atomic():
        Order.objects.create(number="A")
        fire(OrderPlaced(order_id="seven"))  # type: ignore[arg-type]
    assert not Order.objects.exists() and not EventRecord.objects.exists()


def test_fire_refuses_an_instance_of_a_class_that_is_not_an_event() -> None:
    with pytest.raises(TypeError, match="not one; decorate it with @event"):
        fire(Order(number="x"))


def test_attribution_scope_and_causation_are_recorded() -> None:
    user = get_user_model().objects.create(username="ada")
    with transaction.atomic(), attributed(actor=user, tenant="t1"):
        with attributed(request_id="r9"):
            assert current_scope().values == {"tenant": "t1", "request_id": "r9"}
            parent = fire(Pinged())
        with caused_by(parent):
            child = fire(Pinged(n=1))
    with attributed(actor=AnonymousUser(), source="cron"), transaction.atomic():
        anonymous = fire(Pinged(n=2))
    parent_row = EventRecord.objects.get(pk=parent)
    assert parent_row.actor == user
    assert parent_row.actor_key == str(user.pk)
    assert parent_row.actor_label == "ada"
    assert parent_row.scope == {"tenant": "t1", "request_id": "r9"}
    assert parent_row.causation_id is None
    child_row = EventRecord.objects.get(pk=child)
    assert child_row.causation_id == parent
    assert child_row.scope == {"tenant": "t1"}
    other = EventRecord.objects.get(pk=anonymous)
    assert other.actor is None and other.actor_key == "cron"


def test_events_fired_by_a_receiver_carry_causation_and_correlation() -> None:
    def follow_up(evt: OrderPlaced) -> None:
        fire(Pinged(n=evt.order_id))

    receiver(OrderPlaced, key="t.follow")(follow_up)
    with transaction.atomic():
        root = fire(OrderPlaced(order_id=4))
    drain_outbox()
    root_row = EventRecord.objects.get(pk=root)
    child_row = EventRecord.objects.get(name="testapp.Pinged")
    assert child_row.causation_id == root
    assert child_row.correlation_id == root_row.correlation_id != ""


def test_suppressed_records_marked_events_without_deliveries() -> None:
    receiver(AnyEvent, key="t.any")(lambda evt: None)
    ran: list[int] = []
    receiver(Pinged, key="t.inline", mode=INLINE)(lambda evt: ran.append(1))
    with transaction.atomic(), suppressed(Pinged, reason="backfill"):
        kept = fire(Pinged())
        normal = fire(OrderPlaced(order_id=1))
    assert EventRecord.objects.get(pk=kept).suppressed_reason == "backfill"
    assert not DeliveryRecord.objects.filter(event_id=kept).exists()
    assert ran == []
    assert DeliveryRecord.objects.filter(event_id=normal).count() == 1
    with transaction.atomic(), suppressed(reason="import", record=False):
        assert fire(Pinged()) is None
    assert EventRecord.objects.count() == 2


def test_propagate_scope_carries_attribution_into_a_thread() -> None:
    import threading

    seen: list[dict] = []
    with attributed(source="worker", job="j1"):
        task = propagate_scope(lambda: seen.append(current_scope().values))
    thread = threading.Thread(target=task)
    thread.start()
    thread.join()
    assert seen == [{"job": "j1"}]


# 45 + 5 rows: within one INSERT on SQLite, whose 999 parameters Django splits by the
# delivery table's 19 columns (52 rows a statement); beyond, SQLite batches.
@pytest.mark.parametrize("fan_out", [1, 5, 45])
def test_fire_costs_the_same_queries_whatever_the_number_of_rows(fan_out: int) -> None:
    for index in range(5):
        receiver(OrderPlaced, key=f"t.r{index}")(lambda evt: None)
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: [str(i) for i in range(fan_out)])(
        lambda evt: None
    )
    with transaction.atomic():
        fire(OrderPlaced(order_id=0))  # warm caches
        with CaptureQueriesContext(connection) as queries:
            event_id = fire(OrderPlaced(order_id=1))
    assert DeliveryRecord.objects.filter(event_id=event_id).count() == 5 + fan_out
    assert len(queries) == 2, [q["sql"] for q in queries]


# The event and its rows: one statement on PostgreSQL, two INSERTs through the ORM elsewhere.
ONE_STATEMENT = connection.vendor == "postgresql"
EVENT_AND_ROWS = 1 if ONE_STATEMENT else 2


def test_fire_with_one_receiver_is_one_statement_on_postgresql_two_elsewhere() -> None:
    receiver(OrderShipped, key="t.one")(lambda evt: None)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        fire(OrderShipped(order_id=1, carrier="ups"))
    assert len(queries) == EVENT_AND_ROWS, [q["sql"] for q in queries]


@pytest.mark.parametrize("receivers", [1, 5, 50])
def test_the_event_and_all_its_rows_are_one_insert_on_postgresql(receivers: int) -> None:
    for index in range(receivers):
        receiver(OrderPlaced, key=f"t.r{index}", eager=index == 0)(lambda evt: None)
    receiver(OrderPlaced, key="t.later", due=timedelta(microseconds=1))(lambda evt: None)
    # due at once, so never in a later hour (a row due past the hour adds a tally insert)
    with transaction.atomic():
        fire(OrderPlaced(order_id=0))  # warm caches
        with CaptureQueriesContext(connection) as queries:
            event_id = fire(OrderPlaced(order_id=1))
    assert DeliveryRecord.objects.filter(event_id=event_id).count() == receivers + 1
    sql = [" ".join(q["sql"].split()).upper() for q in queries]
    assert len(sql) == EVENT_AND_ROWS, sql
    if ONE_STATEMENT:
        assert sql[0].startswith("WITH E AS (INSERT INTO") and sql[0].count("INSERT INTO") == 2


def test_a_fan_out_is_one_insert_for_all_its_rows_after_the_event_row() -> None:
    """targets= is given the event's id, so the event row is written first, then one
    INSERT holds every target's row, on every database."""
    receiver(OrderPlaced, key="t.fan", targets=lambda evt, ctx: [str(i) for i in range(50)])(
        lambda evt: None
    )
    with transaction.atomic():
        fire(OrderPlaced(order_id=0))
        with CaptureQueriesContext(connection) as queries:
            event_id = fire(OrderPlaced(order_id=1))
    assert DeliveryRecord.objects.filter(event_id=event_id).count() == 50
    sql = [" ".join(q["sql"].split()).upper() for q in queries]
    assert len(sql) == 2, sql
    assert all("INSERT INTO" in statement for statement in sql)


def test_a_dedupe_key_needs_no_savepoint_on_postgresql() -> None:
    receiver(OrderShipped, key="t.one")(lambda evt: None)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as first:
            first_id = fire(OrderShipped(order_id=1, carrier="ups"), dedupe_key="k")
        with CaptureQueriesContext(connection) as again:
            assert fire(OrderShipped(order_id=2, carrier="dhl"), dedupe_key="k") == first_id
    assert EventRecord.objects.count() == 1 and DeliveryRecord.objects.count() == 1
    if ONE_STATEMENT:
        assert len(first) == 1  # ON CONFLICT DO NOTHING, no SAVEPOINT
        assert len(again) == 2  # the insert that wrote nothing, the SELECT of the first id
    else:
        assert len(first) == 4  # SAVEPOINT, INSERT, RELEASE, the delivery INSERT
        assert len(again) == 5  # SAVEPOINT, INSERT, ROLLBACK TO, RELEASE, SELECT


def test_the_rows_are_those_the_orm_writes() -> None:
    """Every column of what fire() wrote, against a twin written by the ORM from the same
    values: the single statement must encode nothing differently."""
    user = get_user_model().objects.create(username="ann")
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    receiver(OrderPlaced, key="t.later", due=timedelta(days=2), ttl=timedelta(hours=3))(
        lambda evt: None
    )
    receiver(OrderPlaced, key="t.bounded", max_attempts=None, ttl=timedelta(hours=1))(
        lambda evt: None
    )
    receiver(OrderPlaced, key="t.eager", eager=True)(lambda evt: None)
    occurred = timezone.now() - timedelta(hours=5)
    evt = OrderPlaced(order_id=3, total=Decimal("1.25"), tags=("a", "é"))
    with transaction.atomic(), attributed(actor=user, tenant="t1", path=["x", 1]):
        event_id = fire(evt, occurred_at=occurred, dedupe_key="twin")
        fast = EventRecord.objects.get(pk=event_id)
        twin = EventRecord(
            **{f.attname: getattr(fast, f.attname) for f in EventRecord._meta.concrete_fields},
        )
        twin.pk, twin.dedupe_key = None, "twin-orm"
        twin.payload = {"order_id": 3, "total": "1.25", "tags": ["a", "é"]}
        twin.scope, twin.occurred_at = {"tenant": "t1", "path": ["x", 1]}, occurred
        twin.save()
        recorded = fast.recorded_at
        later = occurred + timedelta(days=2)
        DeliveryRecord.objects.bulk_create(
            DeliveryRecord(
                event_id=twin.pk,
                receiver_key=key,
                target="",
                max_attempts=attempts,
                available_at=due,
                claim_rank=priority.rank(due),  # priority 0: no credit
                due_at=due,
                expires_at=expires,
            )
            for key, attempts, due, expires in [
                ("t.bounded", None, recorded, recorded + timedelta(hours=1)),
                ("t.eager", 5, recorded, None),
                ("t.later", 5, later, later + timedelta(hours=3)),
                ("t.plain", 5, recorded, None),
            ]
        )

    def columns(model: type, pk: int) -> dict:
        found = model.objects.filter(pk=pk).values().get()
        return {k: v for k, v in found.items() if k not in ("id", "event_id", "dedupe_key")}

    assert columns(EventRecord, event_id) == columns(EventRecord, twin.pk)
    assert fast.actor_id == user.pk and fast.occurred_at == occurred
    written = DeliveryRecord.objects.filter(event_id=event_id).order_by("pk")
    twins = DeliveryRecord.objects.filter(event_id=twin.pk).order_by("pk")
    assert [r.receiver_key for r in written] == ["t.bounded", "t.eager", "t.later", "t.plain"]
    for row, expected in zip(written, twins, strict=True):
        assert columns(DeliveryRecord, row.pk) == columns(DeliveryRecord, expected.pk)


def test_caused_by_alone_joins_the_causing_events_correlation_chain() -> None:
    with transaction.atomic():
        root = fire(Pinged())
        with caused_by(root):
            child = fire(Pinged(n=1))
        with caused_by(child, correlation_id="req-42"):
            other = fire(Pinged(n=2))
    rows = {r.pk: r for r in EventRecord.objects.all()}
    assert rows[child].correlation_id == rows[root].correlation_id
    assert rows[child].causation_id == root
    assert rows[other].correlation_id == "req-42"


# What no supported database stores as given ---------------------------------------


def deeply(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture
def nested_event():
    """An event whose field nests 70 lists deep: more than any payload may."""
    import dataclasses

    from django_domain_events import event, registry

    annotation: object = int
    for _ in range(70):
        annotation = list[annotation]  # type: ignore[valid-type]
    cls = dataclasses.make_dataclass("Nested", [("value", annotation)], frozen=True)
    cls.__module__ = __name__
    event(name="t.Nested")(cls)
    yield cls
    registry._events_by_name.pop("t.Nested")
    registry._events_by_class.pop(cls)


@pytest.mark.parametrize(
    "make, error, path",
    [
        (lambda: OrderShipped(order_id=1, carrier="dh\x00l"), "NUL", "OrderShipped.carrier"),
        (lambda: Pinged(labels=["ok", "bad\ud800"]), "surrogate", r"Pinged.labels\[1\]"),
        (lambda: OrderPlaced(order_id=1, tags=("\x00",)), "NUL", r"OrderPlaced.tags\[0\]"),
    ],
)
def test_text_no_database_stores_is_refused_by_fire_naming_the_field(make, error, path) -> None:
    receiver(AnyEvent, key="t.all")(lambda evt: None)
    with transaction.atomic():
        with pytest.raises(UnsupportedPayloadType, match=rf"{path}.*{error}"):
            fire(make())
        assert not EventRecord.objects.exists()  # the transaction is still usable
        fire(Pinged(n=2))
    assert EventRecord.objects.count() == 1 and DeliveryRecord.objects.count() == 1


def test_a_payload_nested_too_deep_is_refused_by_fire(nested_event) -> None:
    with transaction.atomic():
        with pytest.raises(UnsupportedPayloadType, match=r"Nested.value(\[0\])+.*64"):
            fire(nested_event(value=deeply(70)))
        assert not EventRecord.objects.exists()


@pytest.mark.parametrize(
    "scope, path",
    [
        ({"trail": [1, 2, 3, float("nan")]}, r"scope\['trail'\]\[3\].*nan"),
        ({"ratio": float("inf")}, r"scope\['ratio'\].*inf"),
        ({"note": "a\x00b"}, r"scope\['note'\].*NUL"),
        ({"meta": {"k\x00": 1}}, r"scope\['meta'\].*key.*NUL"),
        ({"who": "\udcff"}, r"scope\['who'\].*surrogate"),
        ({"deep": deeply(70)}, r"scope\['deep'\](\[0\])+.*64"),
    ],
)
def test_a_scope_no_database_stores_is_refused_before_anything_is_written(scope, path) -> None:
    receiver(AnyEvent, key="t.all")(lambda evt: None)
    with transaction.atomic():
        with pytest.raises(UnsupportedPayloadType, match=path), attributed(**scope):
            fire(Pinged(n=1))
        assert not EventRecord.objects.exists()  # the transaction is still usable
        fire(Pinged(n=2))
    assert EventRecord.objects.count() == 1 and DeliveryRecord.objects.count() == 1


def test_keys_and_targets_no_database_stores_are_refused() -> None:
    receiver(Pinged, key="t.fan", targets=lambda evt, ctx: ["a\x00"])(lambda evt: None)
    with transaction.atomic():
        with pytest.raises(ValueError, match=r"dedupe_key.*NUL"):
            fire(OrderPlaced(order_id=1), dedupe_key="k\x00")
        assert not EventRecord.objects.exists()  # the transaction is still usable
    # A bad target, like any targets= refusal, rolls the caller's change back.
    with pytest.raises(ValueError, match=r"targets= of t.fan.*NUL"), transaction.atomic():
        fire(Pinged(n=1))
    assert not EventRecord.objects.exists() and not DeliveryRecord.objects.exists()


class LaxCodec:
    """A codec that checks nothing: fire() still refuses what no database stores."""

    def encode(self, evt: object) -> dict:
        return {"n": float("inf"), "labels": []}

    def decode(self, event_class: type, payload: dict) -> object:
        return event_class(**payload)


def test_whatever_the_codec_fire_refuses_non_finite_numbers() -> None:
    from django.test import override_settings

    lax = override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": f"{__name__}.LaxCodec"})
    with lax, transaction.atomic():
        with pytest.raises(UnsupportedPayloadType, match=r"Pinged.n: it is inf"):
            fire(Pinged(n=1))
        assert not EventRecord.objects.exists()


def test_a_row_due_in_a_later_hour_adds_one_tally_insert_whatever_their_number() -> None:
    for index in range(3):
        receiver(OrderShipped, key=f"t.later{index}", due=timedelta(days=2))(lambda evt: None)
    receiver(OrderShipped, key="t.now")(lambda evt: None)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        fire(OrderShipped(order_id=1, carrier="ups"))
    assert len(queries) == EVENT_AND_ROWS + 1, [q["sql"] for q in queries]
    assert "scheduledtally" in queries[EVENT_AND_ROWS]["sql"].lower()
