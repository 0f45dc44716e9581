"""The inbox's database side, with hand-built messages: recording, dedupe, lifetimes,
versions, dead inbox entries and their retry, and the seed's lifecycle on consumed events."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_domain_events import (
    INLINE,
    Constant,
    DeliveryStatus,
    deliver_pending,
    drain_outbox,
    event,
    receiver,
    registry,
)
from django_domain_events.clock import normalize
from django_domain_events.inbox import (
    Message,
    Subscription,
    dead_messages,
    forget,
    inbox_key,
    purge_dead_messages,
    record_batch,
    register,
    retry_dead_messages,
)
from django_domain_events.models import DeadMessage, DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, OrderShipped
from tests.app.models import Delivered
from tests.support import command

pytestmark = pytest.mark.django_db(transaction=True)

SOURCE = "shop"


@pytest.fixture
def sub() -> Iterator[Subscription]:
    subscription = Subscription(source=SOURCE, broker="default", name="t.inbox")
    register(subscription)
    yield subscription
    forget(subscription.name)


def message(
    type: str = "testapp.OrderPlaced",
    id: str = "m-1",
    body: dict | bytes | None = None,
    **attrs: str,
) -> Message:
    data = body if isinstance(body, bytes) else json.dumps(body or {"order_id": 7}).encode()
    attributes = {
        "specversion": "1.0",
        "id": id,
        "source": SOURCE,
        "type": type,
        "time": "2026-01-02T03:04:05Z",
        "datacontenttype": "application/json",
        **attrs,
    }
    return Message(attributes=attributes, body=data, headers={"ce-id": id, "ce-type": type})


def order_placed_name() -> str:
    found = registry.event_for_class(OrderPlaced)
    assert found is not None
    return found.name


def ids_written(evt: OrderPlaced, ctx) -> None:
    Delivered.objects.create(
        delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, event_id=evt.order_id
    )


# Recording ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, message_id",
    [
        ("shop", "m-1"),
        ('a "quoted" \\ source', "tab\tnew\nline\x01"),
        ("ünïcødé ☃", "emoji 🎉 \u2028"),
        ("shop", "lone \ud800 surrogate"),
        ("shop", "nul \x00 inside"),
        ("s" * 200, "i" * 200),
    ],
)
def test_a_messages_key_is_the_json_of_its_source_and_id_as_ever(source, message_id) -> None:
    # Keys already stored must keep matching a redelivery: the same text, to the character.
    expected = json.dumps([source, message_id], ensure_ascii=False, separators=(",", ":"))
    key = inbox_key(source, message_id)
    if len(expected) <= 255 and "\x00" not in expected and "\ud800" not in expected:
        assert key == expected
    else:  # too long, or text no database stores: the digest of that same text
        digest = hashlib.sha256(expected.encode("utf-8", "surrogatepass")).hexdigest()
        assert key == f"sha256:{digest}"


def test_a_message_becomes_an_event_with_its_rows_and_context(sub) -> None:
    receiver(OrderPlaced, key="t.in", takes_context=True)(ids_written)
    name = order_placed_name()
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    counts = record_batch(
        sub,
        [
            message(
                name,
                correlationid="chain-1",
                causationid="41",
                traceparent=trace,
                tracestate="k=v",
                payloadversion="1",
            )
        ],
    )
    assert counts == {"recorded": 1}
    row = EventRecord.objects.get()
    assert row.name == name and row.payload["order_id"] == 7
    assert row.occurred_at == normalize(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert row.actor_key == SOURCE and row.correlation_id == "chain-1"
    assert json.loads(row.trace_context) == {"traceparent": trace, "tracestate": "k=v"}
    assert row.received == {
        "source": SOURCE,
        "id": "m-1",
        "type": name,
        "causationid": "41",
        "subscription": "t.inbox",
    }
    assert row.causation_id is None
    assert DeliveryRecord.objects.get(event=row).receiver_key == "t.in"
    drain_outbox()
    assert list(Delivered.objects.values_list("event_id", flat=True)) == [7]


def test_a_message_seen_again_adds_nothing(sub) -> None:
    receiver(OrderPlaced, key="t.in")(lambda evt: None)
    name = order_placed_name()
    first = record_batch(sub, [message(name, "a"), message(name, "a"), message(name, "b")])
    assert first == {"recorded": 2, "duplicate": 1}
    again = record_batch(sub, [message(name, "a"), message(name, "b")])
    assert again == {"duplicate": 2}
    assert EventRecord.objects.count() == 2 and DeliveryRecord.objects.count() == 2
    other = Message(
        attributes={**message(name, "a").attributes, "source": "warehouse"}, body=b'{"order_id":1}'
    )
    assert record_batch(sub, [other]) == {"recorded": 1}


def test_an_ordered_receiver_runs_a_consumed_batch_in_the_messages_order(sub) -> None:
    """A batch's rows are recorded in the order the broker delivered its messages (one
    INSERT for the batch on PostgreSQL), so an ordered key runs them in that order."""
    seen: list[int] = []
    receiver(OrderPlaced, key="t.in.ordered", ordered_by=lambda evt: "one")(
        lambda evt: seen.append(evt.order_id)
    )
    name = order_placed_name()
    sent = [7, 3, 11, 1, 9, 5, 0, 8, 2, 10, 4, 6]
    batch = [message(name, f"m-{n}", {"order_id": n}) for n in sent]
    assert record_batch(sub, batch) == {"recorded": len(sent)}
    drain_outbox()
    assert seen == sent


def test_a_batch_runs_eager_rows_after_its_commit_and_tells_listeners(sub) -> None:
    from django_domain_events import signals

    ran: list[int] = []
    receiver(OrderPlaced, key="t.eager", eager=True)(lambda evt: ran.append(evt.order_id))
    receiver(OrderPlaced, key="t.later")(lambda evt: None)
    heard: list[tuple[int, int]] = []

    def listener(sender, event_id, deliveries, **kwargs) -> None:
        heard.append((event_id, deliveries))

    name = order_placed_name()
    batch = [message(name, f"e{i}", {"order_id": i}) for i in range(3)]
    assert record_batch(sub, batch) == {"recorded": 3}
    assert sorted(ran) == [0, 1, 2]
    eager = DeliveryRecord.objects.filter(receiver_key="t.eager")
    assert {row.status for row in eager} == {DeliveryStatus.SUCCEEDED}
    assert DeliveryRecord.objects.filter(receiver_key="t.later").count() == 3
    signals.event_recorded.connect(listener, sender=OrderPlaced)
    try:
        batch = [message(name, f"s{i}", {"order_id": 10 + i}) for i in range(2)]
        assert record_batch(sub, [*batch, batch[0]]) == {"recorded": 2, "duplicate": 1}
    finally:
        signals.event_recorded.disconnect(listener, sender=OrderPlaced)
    recorded = EventRecord.objects.filter(received__id__in=["s0", "s1"]).order_by("pk")
    assert heard == [(row.pk, 2) for row in recorded]


def test_a_message_without_correlation_starts_a_chain_and_events_it_causes_follow_it(
    sub,
) -> None:
    caused: list[int | None] = []

    @receiver(OrderPlaced, key="t.chain", takes_context=True)
    def chain(evt, ctx) -> None:
        from django_domain_events import fire

        fire(OrderShipped(order_id=evt.order_id, carrier="x"))
        caused.append(ctx.event_id)

    record_batch(sub, [message(order_placed_name(), correlationid="corr-9")])
    drain_outbox()
    shipped = EventRecord.objects.get(name="testapp.OrderShipped")
    assert shipped.correlation_id == "corr-9" and shipped.causation_id == caused[0]


def test_a_mapping_takes_another_services_names_and_skips_types_not_asked_for() -> None:
    sub = Subscription(
        source=SOURCE, broker="default", name="t.map", events={"shop.order.placed": OrderPlaced}
    )
    counts = record_batch(
        sub, [message("shop.order.placed", "1"), message("shop.order.cancelled", "2")]
    )
    assert counts == {"recorded": 1, "ignored": 1}
    assert EventRecord.objects.get().name == order_placed_name()
    assert not DeadMessage.objects.exists()


# Lifetimes and versions ---------------------------------------------------------------


def test_the_messages_expiry_becomes_the_rows_lifetime_the_earlier_end_winning(sub) -> None:
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    receiver(OrderPlaced, key="t.short", ttl=timedelta(seconds=30))(lambda evt: None)
    expiry = datetime.now(UTC) + timedelta(hours=1)
    record_batch(
        sub, [message(order_placed_name(), expirytime=expiry.isoformat().replace("+00:00", "Z"))]
    )
    plain = DeliveryRecord.objects.get(receiver_key="t.plain")
    short = DeliveryRecord.objects.get(receiver_key="t.short")
    assert plain.expires_at == normalize(expiry)
    assert short.expires_at == short.due_at + timedelta(seconds=30)


def test_a_subscription_ttl_counts_from_the_messages_time() -> None:
    receiver(OrderPlaced, key="t.plain")(lambda evt: None)
    sub = Subscription(source=SOURCE, broker="default", name="t.ttl", ttl=timedelta(days=1))
    record_batch(sub, [message(order_placed_name())])
    row = DeliveryRecord.objects.get()
    assert row.expires_at == normalize(datetime(2026, 1, 3, 3, 4, 5, tzinfo=UTC))
    # The message outlived its lifetime before it arrived: its row dies as expired.
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    assert DeliveryRecord.objects.get().last_error.startswith("expired:")


def test_an_older_version_is_upgraded_and_a_newer_one_is_kept_dead(sub) -> None:
    receiver(OrderShipped, key="t.ship")(lambda evt: None)
    old = message(
        "testapp.OrderShipped", "v1", {"order_id": 1, "shipper": "dhl"}, payloadversion="1"
    )
    new = message(
        "testapp.OrderShipped", "v3", {"order_id": 2, "carrier": "ups"}, payloadversion="3"
    )
    assert record_batch(sub, [old, new]) == {"recorded": 1, "dead": 1}
    row = EventRecord.objects.get()
    assert row.version == 2 and row.payload == {"order_id": 1, "carrier": "dhl"}
    dead = DeadMessage.objects.get()
    assert dead.reason.startswith("unknown version:") and "version 3" in dead.reason


# Bad messages -------------------------------------------------------------------------


def test_poison_messages_are_kept_raw_with_their_reason_and_once(sub) -> None:
    name = order_placed_name()
    poison = [
        message(name, "garbage", b"\xff\x00not json"),
        message("shop.Unheard", "unknown"),
        message(name, "future", payloadversion="9"),
        message(name, "huge", {"order_id": 1, "pad": "x" * 2_000_000}),
        message(name, "wrong", {"order_id": "seven"}),
        Message(attributes={}, body=b"hello", headers={"x": "y"}),
    ]
    assert record_batch(sub, poison) == {"dead": 6}
    assert record_batch(sub, poison) == {"dead": 6}  # redelivered: still one entry each
    reasons = dict(DeadMessage.objects.values_list("message_id", "reason"))
    assert reasons["garbage"].startswith("undecodable:")
    assert reasons["unknown"].startswith("unknown type: 'shop.Unheard'")
    assert reasons["future"].startswith("unknown version:")
    assert reasons["huge"].startswith("oversize:")
    assert reasons["wrong"].startswith("undecodable:") and "order_id" in reasons["wrong"]
    assert reasons[""].startswith("no 'id' attribute")
    garbage = DeadMessage.objects.get(message_id="garbage")
    assert bytes(garbage.body) == b"\xff\x00not json" and garbage.headers["ce-id"] == "garbage"
    assert not EventRecord.objects.exists()


def test_a_dead_entry_retried_after_its_type_is_declared_becomes_an_event(sub) -> None:
    record_batch(sub, [message("shop.Unheard", "u1", {"n": 3})])
    assert retry_dead_messages() == {"dead": 1}  # still unknown

    @event(name="shop.Unheard")
    @dataclass(frozen=True)
    class Unheard:
        n: int

    receiver(Unheard, key="t.unheard")(lambda evt: None)
    assert retry_dead_messages() == {"recorded": 1}
    assert not DeadMessage.objects.exists()
    row = EventRecord.objects.get(name="shop.Unheard")
    assert row.payload == {"n": 3} and row.received["id"] == "u1"
    assert DeliveryRecord.objects.get(event=row).receiver_key == "t.unheard"
    # The broker delivers it once more: the inbox remembers it.
    assert record_batch(sub, [message("shop.Unheard", "u1", {"n": 3})]) == {"duplicate": 1}


def test_an_inline_receiver_refusing_a_message_keeps_that_one_dead_and_the_rest(sub) -> None:
    @receiver(OrderPlaced, key="t.veto", mode=INLINE)
    def veto(evt) -> None:
        if evt.order_id == 13:
            raise ValueError("unlucky order")

    name = order_placed_name()
    counts = record_batch(
        sub, [message(name, "1", {"order_id": 1}), message(name, "13", {"order_id": 13})]
    )
    assert counts == {"recorded": 1, "dead": 1}
    assert DeadMessage.objects.get().reason == (
        "refused: recording it raised ValueError: unlucky order"
    )


def test_a_database_error_commits_nothing_of_the_batch(sub) -> None:
    @receiver(OrderPlaced, key="t.broken", mode=INLINE)
    def broken(evt) -> None:
        if evt.order_id == 2:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table_anywhere")

    name = order_placed_name()
    from django.db import DatabaseError

    with pytest.raises(DatabaseError):
        record_batch(
            sub, [message(name, "1", {"order_id": 1}), message(name, "2", {"order_id": 2})]
        )
    assert not EventRecord.objects.exists() and not DeadMessage.objects.exists()


def test_dead_entries_are_dumped_retried_and_purged_from_the_command(sub) -> None:
    record_batch(sub, [message("shop.NeverDeclared", "u1"), message("shop.NeverDeclared", "u2")])
    lines = [json.loads(line) for line in command("dead_letters", "dump", "--inbox").splitlines()]
    assert [line["message_id"] for line in lines] == ["u1", "u2"]
    assert lines[0]["reason"].startswith("unknown type") and lines[0]["subscription"] == "t.inbox"
    assert lines[0]["attributes"]["type"] == "shop.NeverDeclared"
    out = command("dead_letters", "retry", "--inbox")
    assert out.splitlines() == ["Total dead inbox entries: 2", "Retrying: 0/2"]
    assert command("dead_letters", "purge", "--inbox", "--all") == "Purged: 2\n"
    assert not dead_messages().exists()
    with pytest.raises(ValueError, match="name a subscription"):
        purge_dead_messages()


# The seed's lifecycle, read against a consumed event ---------------------------------


def test_constant_retry_and_dead_letter_commands_work_on_a_consumed_event(sub) -> None:
    receiver(OrderPlaced, key="t.flaky", retry=Constant(2), max_attempts=2)(
        lambda evt: (_ for _ in ()).throw(ConnectionError("down"))
    )
    record_batch(sub, [message(order_placed_name())])
    t0 = timezone.now() + timedelta(hours=1)
    deliver_pending(now=t0)
    row = DeliveryRecord.objects.get()
    assert row.available_at == t0 + timedelta(seconds=2)
    deliver_pending(now=t0 + timedelta(seconds=2))
    assert DeliveryRecord.objects.get().status == DeliveryStatus.DEAD
    dumped = json.loads(command("dead_letters", "dump"))
    assert dumped["payload"]["order_id"] == 7 and dumped["attempts"] == 2
    assert command("dead_letters", "retry").splitlines() == [
        "Total dead letters: 1",
        "Retrying: 1/1",
    ]
    assert DeliveryRecord.objects.get().status == DeliveryStatus.PENDING
    drain_outbox()
    assert command("dead_letters", "purge", "--all") == "Purged: 1\n"


class ShouldRetry:
    """The seed's should_retry_cqrs: retry 10 times, or while the database is in trouble."""

    def delay(self, attempt: int, error: BaseException) -> float | None:
        from django.db import OperationalError

        if attempt < 10 or isinstance(error, OperationalError):
            return (attempt + 1) * 60  # the seed's linear get_cqrs_retry_delay
        return None


def test_a_custom_should_retry_policy_runs_on_a_consumed_event(sub) -> None:
    receiver(
        OrderPlaced, key="t.custom", retry=ShouldRetry(), max_attempts=None, ttl=timedelta(days=30)
    )(lambda evt: (_ for _ in ()).throw(ValueError("bad")))
    record_batch(sub, [message(order_placed_name())])
    # Unbounded attempts: drain_outbox() attempts the row once per call.
    outcomes = [drain_outbox() for _ in range(10)]
    assert [o.get(DeliveryStatus.DEAD, 0) for o in outcomes] == [0] * 9 + [1]
    row = DeliveryRecord.objects.get()
    assert row.attempts == 10 and "ShouldRetry" in row.last_error


# The admin ------------------------------------------------------------------------------


def test_dead_entries_are_listed_shown_and_retried_in_the_admin(sub, admin_client) -> None:
    record_batch(sub, [message("shop.AdminLater", "a1", {"n": 5})])
    listing = admin_client.get("/admin/django_domain_events/deadmessage/")
    assert listing.status_code == 200 and b"unknown type" in listing.content
    entry = DeadMessage.objects.get()
    page = admin_client.get(f"/admin/django_domain_events/deadmessage/{entry.pk}/change/")
    assert page.status_code == 200 and b"&quot;n&quot;: 5" in page.content

    @event(name="shop.AdminLater")
    @dataclass(frozen=True)
    class AdminLater:
        n: int

    answer = admin_client.post(
        "/admin/django_domain_events/deadmessage/",
        {"action": "retry_selected", "_selected_action": [entry.pk]},
        follow=True,
    )
    assert b"Recorded 1 as events; 0 could still not be recorded" in answer.content
    assert EventRecord.objects.get().name == "shop.AdminLater"


def test_the_dead_letter_lifetime_prunes_a_consumed_event_and_the_inbox_forgets_it(sub) -> None:
    from django.test import override_settings

    from django_domain_events import prune_events

    receiver(OrderPlaced, key="t.dies", max_attempts=1)(
        lambda evt: (_ for _ in ()).throw(ConnectionError("down"))
    )
    consumed = message(order_placed_name(), "forget-me")
    record_batch(sub, [consumed])
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    with override_settings(DJANGO_DOMAIN_EVENTS={"DEAD_LETTER_TTL_SECONDS": 3600}):
        assert prune_events() == 0
        later = timezone.now() + timedelta(hours=2)
        assert prune_events(now=later, older_than=timedelta(hours=1)) == 1
    assert not EventRecord.objects.exists()
    # The event row was the inbox's memory of the message: the same message again is new.
    assert record_batch(sub, [consumed]) == {"recorded": 1}


def test_the_prune_deletes_dead_inbox_entries_past_the_dead_letter_lifetime(sub) -> None:
    from django.test import override_settings

    from django_domain_events import prune_events

    record_batch(sub, [message("shop.Unheard", "old"), message("shop.Unheard", "retried")])
    start = timezone.now()
    DeadMessage.objects.update(received_at=start - timedelta(hours=3))
    DeadMessage.objects.filter(message_id="retried").update(retried_at=start)
    with override_settings(DJANGO_DOMAIN_EVENTS={"DEAD_LETTER_TTL_SECONDS": 7200}):
        prune_events(now=start)
        # Dead for three hours, over the two-hour lifetime; the retried one died again now.
        assert list(DeadMessage.objects.values_list("message_id", flat=True)) == ["retried"]
        prune_events(now=start + timedelta(hours=1))
        assert DeadMessage.objects.count() == 1
        prune_events(now=start + timedelta(hours=2, seconds=1))
        assert not DeadMessage.objects.exists()
    # Gone from the inbox's memory of bad messages: the same message again is kept anew.
    assert record_batch(sub, [message("shop.Unheard", "old")]) == {"dead": 1}


def test_without_a_dead_letter_lifetime_dead_inbox_entries_go_after_the_retention_window(
    sub,
) -> None:
    from django_domain_events import prune_events

    record_batch(sub, [message("shop.Unheard", "kept")])
    start = timezone.now()
    prune_events(now=start + timedelta(days=89))  # RETENTION_DAYS: 90 by default
    assert DeadMessage.objects.count() == 1
    prune_events(now=start + timedelta(hours=2), older_than=timedelta(hours=1))
    assert not DeadMessage.objects.exists()
