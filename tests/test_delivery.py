"""Durable delivery: claims, attempts, outcomes, and what a receiver may answer."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_domain_events import (
    DeliveryContext,
    DeliveryFailure,
    DeliveryStatus,
    PermanentFailure,
    RetryAfter,
    backoff,
    claim_batch,
    deliver_one,
    deliver_pending,
    drain_outbox,
    fire,
    receiver,
    registry,
)
from django_domain_events.delivery.claim import take_over
from django_domain_events.delivery.run import attempt
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced, OrderShipped, Pinged
from tests.app.models import Delivered, Order

pytestmark = pytest.mark.django_db


TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"}


def fire_committed(evt: object) -> int:
    with transaction.atomic():
        event_id = fire(evt)
    assert event_id is not None
    return event_id


def row_for(event_id: int, key: str | None = None) -> DeliveryRecord:
    rows = DeliveryRecord.objects.filter(event_id=event_id)
    return rows.get(receiver_key=key) if key else rows.get()


def test_a_success_commits_the_receivers_writes_with_the_acknowledgement() -> None:
    def ship(evt: OrderPlaced, ctx: DeliveryContext) -> None:
        Delivered.objects.create(
            delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, event_id=ctx.event_id
        )

    receiver(OrderPlaced, key="t.ship", takes_context=True)(ship)
    event_id = fire_committed(OrderPlaced(order_id=1))
    counts = deliver_pending()
    assert counts[DeliveryStatus.SUCCEEDED] == 1
    row = row_for(event_id)
    assert row.status == DeliveryStatus.SUCCEEDED
    assert row.attempts == 1
    assert row.succeeded_at is not None and row.completed_at == row.succeeded_at
    assert row.last_error == ""
    assert Delivered.objects.get().delivery_id == row.pk
    assert deliver_pending()[DeliveryStatus.SUCCEEDED] == 0


def test_the_context_describes_the_delivery() -> None:
    seen: list[DeliveryContext] = []
    receiver(OrderPlaced, key="t.ctx", takes_context=True)(lambda evt, ctx: seen.append(ctx))
    event_id = fire_committed(OrderPlaced(order_id=1))
    drain_outbox()
    (ctx,) = seen
    row = row_for(event_id)
    assert (ctx.event_id, ctx.event_name, ctx.attempt) == (event_id, "testapp.OrderPlaced", 1)
    assert (ctx.delivery_id, ctx.receiver_key, ctx.target) == (row.pk, "t.ctx", "")
    assert ctx.due_at == row.due_at


def test_a_failure_rolls_back_the_receivers_writes_and_backs_off() -> None:
    def half_done(evt: OrderPlaced) -> None:
        Order.objects.create(number="half")
        raise ConnectionError("smtp refused")

    receiver(OrderPlaced, key="t.fail", backoff_base_seconds=10, backoff_cap_seconds=10)(half_done)
    event_id = fire_committed(OrderPlaced(order_id=1))
    before = timezone.now()
    counts = deliver_pending()
    assert counts[DeliveryStatus.FAILED] == 1
    row = row_for(event_id)
    assert not Order.objects.exists()
    assert row.status == DeliveryStatus.FAILED
    assert row.attempts == 1
    assert row.last_error == "ConnectionError: smtp refused"
    assert before <= row.available_at <= timezone.now() + timedelta(seconds=10)
    assert row.completed_at is None


def test_failures_reach_the_dead_letter_after_max_attempts_telling_on_failure() -> None:
    told: list[DeliveryFailure] = []

    def broken(evt: OrderPlaced) -> None:
        raise KeyError("missing")

    receiver(OrderPlaced, key="t.dead", max_attempts=3, on_failure=told.append)(broken)
    event_id = fire_committed(OrderPlaced(order_id=1))
    counts = drain_outbox()
    assert counts[DeliveryStatus.FAILED] == 2
    assert counts[DeliveryStatus.DEAD] == 1
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.DEAD, 3)
    assert row.completed_at is not None and row.succeeded_at is None
    assert [f.status for f in told] == ["failed", "failed", "dead"]
    assert [f.attempt for f in told] == [1, 2, 3]
    assert told[-1].delivery_id == row.pk and told[-1].event_id == event_id
    assert isinstance(told[-1].error, KeyError)


def test_a_permanent_failure_is_dead_on_this_attempt() -> None:
    def refuse(evt: OrderPlaced) -> None:
        raise PermanentFailure("customer deleted")

    receiver(OrderPlaced, key="t.perm")(refuse)
    event_id = fire_committed(OrderPlaced(order_id=1))
    assert deliver_pending()[DeliveryStatus.DEAD] == 1
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.DEAD, 1)
    assert row.last_error == "PermanentFailure: customer deleted"


def test_retry_after_spends_an_attempt_and_waits_that_long() -> None:
    def later(evt: OrderPlaced) -> None:
        raise RetryAfter(30, reason="rate limited")

    receiver(OrderPlaced, key="t.later")(later)
    event_id = fire_committed(OrderPlaced(order_id=1))
    before = timezone.now()
    deliver_pending()
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    assert before + timedelta(seconds=30) <= row.available_at
    assert row.available_at <= timezone.now() + timedelta(seconds=30)


@override_settings(DJANGO_DOMAIN_EVENTS={"MAX_RECEIVER_RETRY_DELAY_SECONDS": 60})
def test_retry_after_is_capped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    receiver(OrderPlaced, key="t.far")(lambda evt: (_ for _ in ()).throw(RetryAfter(10_000)))
    event_id = fire_committed(OrderPlaced(order_id=1))
    deliver_pending()
    row = row_for(event_id)
    assert row.available_at <= timezone.now() + timedelta(seconds=60)
    assert "MAX_RECEIVER_RETRY_DELAY_SECONDS" in caplog.text


def test_an_uncounted_deferral_spends_nothing_and_sets_the_lane_aside() -> None:
    calls: list[int] = []

    def busy(evt: OrderPlaced) -> None:
        calls.append(evt.order_id)
        raise RetryAfter(20, counts=False)

    receiver(OrderPlaced, key="t.busy", give_up_after=timedelta(hours=1))(busy)
    first = fire_committed(OrderPlaced(order_id=1))
    second = fire_committed(OrderPlaced(order_id=2))
    before = timezone.now()
    counts = drain_outbox()
    assert calls == [1]  # the lane was set aside: the second row was handed back
    assert counts[DeliveryStatus.FAILED] == 1
    row = row_for(first)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 0)
    assert before + timedelta(seconds=20) <= row.available_at
    assert row.available_at <= timezone.now() + timedelta(seconds=40)
    other = row_for(second)
    assert (other.status, other.attempts) == (DeliveryStatus.PENDING, 0)
    assert other.claimed_at is not None and other.available_at <= timezone.now()


def test_an_uncounted_deferral_past_give_up_after_is_dead() -> None:
    receiver(OrderPlaced, key="t.busy", give_up_after=timedelta(minutes=5))(
        lambda evt: (_ for _ in ()).throw(RetryAfter(1, counts=False))
    )
    event_id = fire_committed(OrderPlaced(order_id=1))
    counts = deliver_pending(now=timezone.now() + timedelta(minutes=6))
    assert counts[DeliveryStatus.DEAD] == 1
    row = row_for(event_id)
    assert row.status == DeliveryStatus.DEAD and "give_up_after" in row.last_error


def test_an_uncounted_deferral_without_give_up_after_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver(OrderPlaced, key="t.unbounded")(
        lambda evt: (_ for _ in ()).throw(RetryAfter(1, counts=False))
    )
    event_id = fire_committed(OrderPlaced(order_id=1))
    deliver_pending()
    assert row_for(event_id).attempts == 1
    assert "without give_up_after" in caplog.text


def test_a_receiver_no_longer_registered_is_orphaned_without_an_attempt() -> None:
    receiver(OrderPlaced, key="t.gone")(lambda evt: None)
    event_id = fire_committed(OrderPlaced(order_id=1))
    registry.forget("t.gone")
    # Another release may still declare it: the row waits ORPHAN_AFTER_SECONDS, unclaimed.
    assert drain_outbox()[DeliveryStatus.ORPHANED] == 0
    assert (row_for(event_id).status, row_for(event_id).claimed_by) == ("pending", "")
    counts = drain_outbox(now=timezone.now() + timedelta(hours=1, seconds=1))
    assert counts[DeliveryStatus.ORPHANED] == 1
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.ORPHANED, 0)
    assert "t.gone" in row.last_error


def test_an_undecodable_payload_is_dead_naming_the_field_without_running() -> None:
    ran: list[int] = []
    receiver(OrderPlaced, key="t.decode")(lambda evt: ran.append(1))
    event_id = fire_committed(OrderPlaced(order_id=1))
    EventRecord.objects.filter(pk=event_id).update(payload={"order_id": "not a number"})
    counts = drain_outbox()
    assert counts[DeliveryStatus.DEAD] == 1 and ran == []
    row = row_for(event_id)
    assert "order_id" in row.last_error and row.attempts == 0


def test_an_event_name_no_longer_registered_is_dead_with_a_sentence() -> None:
    receiver(OrderPlaced, key="t.renamed")(lambda evt: None)
    event_id = fire_committed(OrderPlaced(order_id=1))
    EventRecord.objects.filter(pk=event_id).update(name="testapp.Vanished")
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    assert "'testapp.Vanished' is no longer declared" in row_for(event_id).last_error


def test_rows_written_under_an_older_version_are_upgraded_before_decoding() -> None:
    seen: list[OrderShipped] = []
    receiver(OrderShipped, key="t.upgrade")(seen.append)
    event_id = fire_committed(OrderShipped(order_id=1, carrier="dhl"))
    EventRecord.objects.filter(pk=event_id).update(
        version=1, payload={"order_id": 1, "shipper": "ups"}
    )
    drain_outbox()
    assert seen == [OrderShipped(order_id=1, carrier="ups")]


def test_an_upgrade_that_raises_dead_letters_with_payload_upgrade_failed() -> None:
    receiver(OrderShipped, key="t.upgrade")(lambda evt: None)
    event_id = fire_committed(OrderShipped(order_id=1, carrier="dhl"))
    EventRecord.objects.filter(pk=event_id).update(version=1, payload=["not", "a", "dict"])
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    assert "PayloadUpgradeFailed" in row_for(event_id).last_error


def test_a_row_newer_than_the_code_is_dead_naming_both_versions() -> None:
    ran: list[object] = []
    receiver(OrderPlaced, key="t.newer")(ran.append)
    event_id = fire_committed(OrderPlaced(order_id=1))
    EventRecord.objects.filter(pk=event_id).update(version=99)
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    row = row_for(event_id)
    assert ran == [] and row.attempts == 0
    assert row.last_error.startswith("PayloadDecodeError")
    assert "version 99" in row.last_error and "version 1" in row.last_error
    assert "deploy the code" in row.last_error.lower()


def test_async_receivers_and_hooks_run_to_completion() -> None:
    ran: list[str] = []

    async def handle(evt: OrderPlaced) -> None:
        ran.append("receiver")
        raise PermanentFailure("async says no")

    async def hook(failure: DeliveryFailure) -> None:
        ran.append(f"hook:{failure.status}")

    receiver(OrderPlaced, key="t.async", on_failure=hook)(handle)
    fire_committed(OrderPlaced(order_id=1))
    drain_outbox()
    assert ran == ["receiver", "hook:dead"]


def test_an_on_failure_hook_that_raises_is_logged_and_swallowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def hook(failure: DeliveryFailure) -> None:
        raise RuntimeError("pager down")

    receiver(OrderPlaced, key="t.hook", max_attempts=1, on_failure=hook)(
        lambda evt: (_ for _ in ()).throw(ValueError("bad"))
    )
    event_id = fire_committed(OrderPlaced(order_id=1))
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    assert row_for(event_id).status == DeliveryStatus.DEAD
    assert "pager down" in caplog.text


def test_every_recorded_failure_is_one_line_a_dead_letter_at_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver(OrderPlaced, key="t.log", max_attempts=2)(
        lambda evt: (_ for _ in ()).throw(TimeoutError("slow"))
    )
    event_id = fire_committed(OrderPlaced(order_id=1))
    with caplog.at_level(logging.WARNING, logger="django_domain_events"):
        drain_outbox()
    lines = [r for r in caplog.records if r.name.startswith("django_domain_events.delivery")]
    assert len(lines) == 2
    row = row_for(event_id)
    levels = [(1, "failed", logging.WARNING), (2, "dead", logging.ERROR)]
    for record, (number, status, level) in zip(lines, levels, strict=True):
        message = record.getMessage()
        assert record.levelno == level
        assert (record.exc_info is not None) == (status == "dead")
        assert "t.log" in message and f"Delivery {row.pk}" in message
        assert f"attempt {number}" in message and "TimeoutError" in message
        assert f"now {status}" in message


class Around:
    entered: list[tuple[str, int]] = []
    refuse = False

    def __init__(self, ctx: DeliveryContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        if Around.refuse:
            raise RuntimeError("no tenant for this delivery")
        Around.entered.append(("enter", self.ctx.attempt))

    def __exit__(self, *exc: Any) -> None:
        Around.entered.append(("exit", self.ctx.attempt))


@override_settings(DJANGO_DOMAIN_EVENTS={"AROUND_DELIVERY": "tests.test_delivery.Around"})
def test_around_delivery_wraps_every_attempt_and_raising_on_entry_fails_it() -> None:
    Around.entered = []
    Around.refuse = False
    receiver(OrderPlaced, key="t.around")(lambda evt: Around.entered.append(("run", 0)))
    fire_committed(OrderPlaced(order_id=1))
    drain_outbox()
    assert Around.entered == [("enter", 1), ("run", 0), ("exit", 1)]
    Around.refuse = True
    event_id = fire_committed(OrderPlaced(order_id=2))
    deliver_pending()
    assert row_for(event_id).last_error == "RuntimeError: no tenant for this delivery"


def test_deliver_one_runs_an_owed_row_and_refuses_the_rest() -> None:
    receiver(OrderPlaced, key="t.one", max_attempts=2)(
        lambda evt: (_ for _ in ()).throw(ValueError("x")) if evt.order_id == 2 else None
    )
    ok = row_for(fire_committed(OrderPlaced(order_id=1)))
    bad = row_for(fire_committed(OrderPlaced(order_id=2)))
    assert deliver_one(ok.pk) == DeliveryStatus.SUCCEEDED
    assert deliver_one(ok.pk) is None  # settled
    assert deliver_one(bad.pk) == DeliveryStatus.FAILED
    assert deliver_one(bad.pk) is None  # waiting out its backoff
    assert deliver_one(10**9) is None


def test_a_stale_task_message_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[int] = []
    receiver(OrderPlaced, key="t.task")(lambda evt: ran.append(1))
    event_id = fire_committed(OrderPlaced(order_id=1))
    now = timezone.now()
    (claim,) = claim_batch(worker_id="relay-1", now=now, lease=60, limit=10)
    args = {"claimed_by": claim.claimed_by, "claimed_at": claim.claimed_at.isoformat()}
    assert deliver_one(claim.id, worker_id="task-1", **args) == DeliveryStatus.SUCCEEDED
    assert deliver_one(claim.id, worker_id="task-2", **args) is None
    assert ran == [1]
    assert row_for(event_id).attempts == 1
    assert "duplicate, late or stale" in caplog.text


def test_an_acknowledgement_after_the_lease_was_lost_records_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def work(evt: OrderPlaced) -> None:
        Order.objects.create(number="side effect")
        # Meanwhile the lease lapsed and another worker took the row.
        DeliveryRecord.objects.filter(receiver_key="t.slow").update(claimed_by="relay-2")

    receiver(OrderPlaced, key="t.slow")(work)
    event_id = fire_committed(OrderPlaced(order_id=1))
    now = timezone.now()
    (claim,) = claim_batch(worker_id="relay-1", now=now, lease=60, limit=10)
    assert attempt(claim, now=now) == (None, None)
    row = row_for(event_id)
    assert (row.status, row.claimed_by, row.attempts) == (DeliveryStatus.CLAIMED, "relay-1", 0)
    assert not Order.objects.exists()
    assert "lease_seconds=" in caplog.text


def test_a_lapsed_lease_is_claimed_again_and_counts_the_attempt() -> None:
    receiver(OrderPlaced, key="t.lapse", lease_seconds=30)(lambda evt: None)
    event_id = fire_committed(OrderPlaced(order_id=1))
    now = timezone.now()
    assert len(claim_batch(worker_id="dead-worker", now=now, lease=30, limit=10)) == 1
    assert claim_batch(worker_id="w2", now=now + timedelta(seconds=10), lease=30, limit=10) == []
    (again,) = claim_batch(worker_id="w2", now=now + timedelta(seconds=31), lease=30, limit=10)
    assert again.attempts == 1
    assert attempt(again, now=now + timedelta(seconds=31))[0] == DeliveryStatus.SUCCEEDED
    assert row_for(event_id).attempts == 2


def lapse(worker: str, batch: int = 10) -> list[Any]:
    """Claim every owed row for ``worker``, then let its lease lapse: what a kill -9 leaves."""
    return claim_batch(worker_id=worker, now=timezone.now(), lease=30, limit=batch)


def retake(seconds: float) -> dict[int, int]:
    """Claim what lapsed ``seconds`` from now, claim after claim (a charged row is claimed
    alone); the attempts charged to each event's row."""
    later = timezone.now() + timedelta(seconds=seconds)
    taken: dict[int, int] = {}
    while claims := claim_batch(worker_id="w2", now=later, lease=30, limit=10):
        taken.update({c.event_id: c.attempts for c in claims})
    return taken


def test_a_dead_workers_batch_charges_only_the_row_it_was_running() -> None:
    receiver(OrderPlaced, key="t.lapse", lease_seconds=30)(lambda evt: None)
    ids = [fire_committed(OrderPlaced(order_id=n)) for n in range(4)]
    claims = lapse("dead-worker")
    assert [c.event_id for c in claims] == ids
    assert attempt(claims[0], now=timezone.now())[0] == DeliveryStatus.SUCCEEDED
    # It died running the second row: that one spent an attempt, the two after it did not.
    assert retake(31) == {ids[1]: 1, ids[2]: 0, ids[3]: 0}


def test_a_dead_batch_taken_over_in_parts_is_charged_once() -> None:
    receiver(OrderPlaced, key="t.lapse", lease_seconds=30)(lambda evt: None)
    ids = [fire_committed(OrderPlaced(order_id=n)) for n in range(5)]
    lapse("dead-worker")
    later = timezone.now() + timedelta(seconds=31)
    first = claim_batch(worker_id="w2", now=later, lease=30, limit=2)
    assert [(c.event_id, c.attempts, c.alone) for c in first] == [(ids[0], 1, True)]
    # The rest was handed back with the charge: owed again at once, no attempt spent.
    rest = DeliveryRecord.objects.filter(event_id__in=ids[1:])
    assert set(rest.values_list("status", "attempts", "available_at")) == {
        (DeliveryStatus.PENDING, 0, later)
    }
    second = claim_batch(worker_id="w3", now=later, lease=30, limit=10)
    assert {c.event_id: c.attempts for c in second} == {i: 0 for i in ids[1:]}


def test_a_task_row_the_dead_worker_handed_on_is_charged_for_its_hand_off() -> None:
    receiver(Pinged, key="t.task", site="task", lease_seconds=30)(lambda evt: None)
    receiver(OrderPlaced, key="t.relay", lease_seconds=30)(lambda evt: None)
    handed = fire_committed(Pinged(n=1))
    running, waiting = (fire_committed(OrderPlaced(order_id=n)) for n in range(2))
    assert [c.event_id for c in lapse("dead-worker")] == [handed, running, waiting]
    assert retake(31) == {handed: 1, running: 1, waiting: 0}


def test_a_row_run_on_an_extended_lease_keeps_the_rest_of_its_batch_uncharged() -> None:
    receiver(OrderPlaced, key="t.lapse", lease_seconds=30)(lambda evt: None)
    ids = [fire_committed(OrderPlaced(order_id=n)) for n in range(3)]
    lapse("dead-worker")
    until = timezone.now() + timedelta(seconds=300)  # as _extend_lease writes it
    DeliveryRecord.objects.filter(event_id=ids[0]).update(
        lease_expires_at=until, available_at=until
    )
    assert retake(31) == {ids[1]: 0, ids[2]: 0}  # the first row was still running
    DeliveryRecord.objects.filter(event_id__in=ids[1:]).update(status=DeliveryStatus.SUCCEEDED)
    assert retake(301) == {ids[0]: 1}


def test_a_task_workers_lapsed_claim_is_its_own_attempt() -> None:
    receiver(OrderPlaced, key="t.task", site="task", lease_seconds=30)(lambda evt: None)
    ids = [fire_committed(OrderPlaced(order_id=n)) for n in range(2)]
    handed = lapse("relay")
    now = timezone.now()
    taken = take_over(
        handed[1].id,
        claimed_by="relay",
        claimed_at=handed[1].claimed_at,
        worker_id="task-worker",
        now=now,
        lease=timedelta(seconds=30),
    )
    assert taken is not None  # the task worker died running it
    # Both lapsed: the message no worker took, and the row the worker died running.
    assert retake(31) == {ids[0]: 1, ids[1]: 1}


def test_claims_take_oldest_first_and_respect_the_limit() -> None:
    receiver(Pinged, key="t.order")(lambda evt: None)
    ids = [fire_committed(Pinged(n=i)) for i in range(5)]
    claims = claim_batch(worker_id="w", now=timezone.now(), lease=60, limit=3)
    assert [c.event_id for c in claims] == ids[:3]
    rest = claim_batch(worker_id="w2", now=timezone.now(), lease=60, limit=10)
    assert [c.event_id for c in rest] == ids[3:]


def test_backoff_is_a_pure_exponential_curve_with_full_jitter() -> None:
    assert backoff(1, base=2, cap=100, jitter=0.5) == timedelta(seconds=1)
    assert backoff(3, base=2, cap=100, jitter=0.5) == timedelta(seconds=4)
    assert backoff(10, base=2, cap=100, jitter=0.5) == timedelta(seconds=50)
    assert backoff(2, base=2, cap=100, jitter=0) == timedelta(0)
    with pytest.raises(ValueError, match="jitter"):
        backoff(1, base=2, cap=10, jitter=1.0)


@pytest.mark.django_db(transaction=True)
def test_recording_an_outcome_is_one_update() -> None:
    receiver(OrderPlaced, key="t.ok")(lambda evt: None)
    receiver(OrderPlaced, key="t.ko")(lambda evt: (_ for _ in ()).throw(ValueError("no")))
    fire_committed(OrderPlaced(order_id=1))
    now = timezone.now()
    claims = claim_batch(worker_id="w", now=now, lease=600, limit=10)
    for claim in claims:
        with CaptureQueriesContext(connection) as queries:
            attempt(claim, now=now)
        sql = [q["sql"] for q in queries if q["sql"].split()[0] not in TRANSACTION_CONTROL]
        assert len(sql) == 1 and sql[0].startswith("UPDATE"), sql


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the single-statement claim is PostgreSQL's"
)
@pytest.mark.django_db(transaction=True)
def test_claiming_a_batch_is_one_statement_on_postgresql() -> None:
    receiver(OrderPlaced, key="t.batch")(lambda evt: None)
    for i in range(20):
        fire_committed(OrderPlaced(order_id=i))
    with CaptureQueriesContext(connection) as queries:
        claims = claim_batch(worker_id="w", now=timezone.now(), lease=60, limit=50)
    assert len(claims) == 20
    assert len(queries) == 1


def test_draining_an_unbounded_failing_receiver_attempts_it_once_per_call() -> None:
    calls: list[int] = []

    def always(evt: OrderPlaced) -> None:
        calls.append(1)
        raise ConnectionError("down")

    receiver(OrderPlaced, key="t.unbounded", max_attempts=None, ttl=timedelta(days=1))(always)
    event_id = fire_committed(OrderPlaced(order_id=1))
    assert drain_outbox()[DeliveryStatus.FAILED] == 1
    assert calls == [1]
    assert row_for(event_id).status == DeliveryStatus.FAILED


class RetryAtOnce:
    """A retry policy whose backoff is over as soon as it begins, as a fully jittered
    first backoff sometimes is."""

    def delay(self, attempt: int, error: BaseException) -> float:
        return 0.0


def test_a_row_failed_in_a_deliver_pending_call_waits_for_the_next_call() -> None:
    calls: list[int] = []

    def flaky(evt: OrderPlaced) -> None:
        calls.append(1)
        raise ConnectionError("smtp refused")

    receiver(OrderPlaced, key="t.at_once", max_attempts=3, retry=RetryAtOnce())(flaky)
    event_id = fire_committed(OrderPlaced(order_id=1))
    counts = deliver_pending()
    assert counts[DeliveryStatus.FAILED] == 1 and counts[DeliveryStatus.DEAD] == 0
    assert calls == [1]
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    deliver_pending()  # the next call retries it: its backoff is over
    assert calls == [1, 1]
    assert row_for(event_id).attempts == 2


def test_an_uncounted_deferral_without_give_up_after_ends_in_a_dead_letter() -> None:
    told: list[DeliveryFailure] = []
    receiver(OrderPlaced, key="t.counted", max_attempts=2, on_failure=told.append)(
        lambda evt: (_ for _ in ()).throw(RetryAfter(1, reason="busy", counts=False))
    )
    event_id = fire_committed(OrderPlaced(order_id=1))
    counts = drain_outbox()
    assert (counts[DeliveryStatus.FAILED], counts[DeliveryStatus.DEAD]) == (1, 1)
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.DEAD, 2)
    assert row.last_error == "RetryAfter: busy"
    assert [f.status for f in told] == ["failed", "dead"]
    assert isinstance(told[-1].error, RetryAfter)


def test_any_exception_while_decoding_is_a_dead_letter_not_a_crash() -> None:
    from dataclasses import dataclass

    from django_domain_events import event

    @event(name="t.Strict")
    @dataclass(frozen=True)
    class Strict:
        n: int = 0

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("n must not be negative")

    receiver(Strict, key="t.strict")(lambda evt: None)
    event_id = fire_committed(Strict(n=1))
    EventRecord.objects.filter(pk=event_id).update(payload={"n": -1})
    assert drain_outbox()[DeliveryStatus.DEAD] == 1
    row = row_for(event_id)
    assert "could not be decoded into t.Strict" in row.last_error
    assert "n must not be negative" in row.last_error


def test_a_row_is_never_handed_to_a_receiver_of_another_event() -> None:
    receiver(OrderPlaced, key="t.moved")(lambda evt: None)
    event_id = fire_committed(OrderPlaced(order_id=1))
    registry.forget("t.moved")
    ran: list[object] = []
    receiver(Pinged, key="t.moved")(ran.append)  # the key now names a Pinged receiver
    counts = drain_outbox()
    assert counts[DeliveryStatus.ORPHANED] == 1 and ran == []
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.ORPHANED, 0)
    assert "testapp.OrderPlaced" in row.last_error and "testapp.Pinged" in row.last_error
