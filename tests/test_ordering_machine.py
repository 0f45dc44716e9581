"""A state machine over ordered receivers (``delivery/ordering.py``): hypothesis interleaves
fires over several keys, claims by several workers, runs that succeed, fail, are
``NotYet`` or die, lapsed leases, replay, requeue and cancel, each at the machine's
``now``. Two receivers share every event: one ``on_dead="skip"``, one ``"block"``.

After every step: no two live claims hold rows of one receiver and key, and every row
claimed was its key's head when claimed. At all times: per receiver and key, the
successful runs (RunLog, written in the run's transaction) are in the order the rows
were recorded (their ids; a replay is a new row at the end), which for rows never
requeued under ``skip`` is the order the events were fired in.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_domain_events import (
    Constant,
    DeliveryContext,
    NotYet,
    PermanentFailure,
    cancel_deliveries,
    fire,
    receiver,
    replay_events,
    requeue_dead,
)
from django_domain_events.delivery.claim import claim_batch, release
from django_domain_events.delivery.claim_rows import Claim
from django_domain_events.delivery.run import attempt
from django_domain_events.models import UNENDED_VALUES, DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced
from tests.app.models import RunLog

pytestmark = pytest.mark.django_db(transaction=True)

if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "dde-hypothesis"))

SKIP, BLOCK = "o.skip", "o.block"
KEYS = ("a", "b", "c")
LEASE = timedelta(seconds=30)
OUTCOMES = ("ok", "fail", "not_yet", "dead")

# What each event's runs do, in turn, by order_id (then success); the machine's clock.
SCRIPT: dict[int, list[str]] = {}
NOW: list[datetime] = [timezone.now()]


def behave(evt: OrderPlaced, ctx: DeliveryContext) -> None:
    RunLog.objects.create(delivery_id=ctx.delivery_id, receiver_key=ctx.receiver_key, attempt=0)
    planned = SCRIPT.get(evt.order_id) or ["ok"]
    what = planned.pop(0) if len(planned) > 1 else planned[0]
    if what == "fail":
        raise ConnectionError("unreachable")
    if what == "not_yet":
        raise NotYet(max(NOW[0], timezone.now()) + timedelta(minutes=5), reason="later")
    if what == "dead":
        SCRIPT[evt.order_id] = ["ok"]  # a requeue then succeeds
        raise PermanentFailure("gone")


def key_of(evt: OrderPlaced) -> str:
    return KEYS[evt.order_id % len(KEYS)]


def declare() -> None:
    for key, on_dead in ((SKIP, "skip"), (BLOCK, "block")):
        receiver(
            OrderPlaced,
            key=key,
            takes_context=True,
            ordered_by=key_of,
            on_dead=on_dead,
            retry=Constant(10),
            max_attempts=3,
        )(behave)


class Ordered(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        RunLog.objects.all().delete()
        DeliveryRecord.objects.all().delete()
        EventRecord.objects.all().delete()
        SCRIPT.clear()
        NOW[0] = timezone.now()
        self.fired = 0
        self.held: list[Claim] = []
        self.workers = 0
        self.requeued_skip: set[int] = set()

    def live(self) -> list[Claim]:
        return [c for c in self.held if c.lease_expires_at > NOW[0]]

    @rule(key=st.integers(0, 2), outcomes=st.lists(st.sampled_from(OUTCOMES), max_size=3))
    def fire_one(self, key: int, outcomes: list[str]) -> None:
        order_id = self.fired * len(KEYS) + key
        self.fired += 1
        SCRIPT[order_id] = outcomes or ["ok"]
        with transaction.atomic():
            fire(OrderPlaced(order_id=order_id))

    @rule(limit=st.integers(1, 5))
    def claim(self, limit: int) -> None:
        self.workers += 1
        got = claim_batch(
            worker_id=f"w{self.workers}", now=NOW[0], lease=LEASE, limit=limit, at_once=True
        )
        for c in got:
            row = DeliveryRecord.objects.get(pk=c.id)
            holding = DeliveryRecord.objects.filter(
                receiver_key=row.receiver_key,
                order_key=row.order_key,
                id__lt=row.pk,
                status__in=UNENDED_VALUES if row.receiver_key == BLOCK else UNENDED_VALUES[:3],
            )
            assert not holding.exists(), f"row {row.pk} claimed behind {list(holding)}"
        self.held = [c for c in self.live() if c.id not in {g.id for g in got}] + got

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 10))
    def run(self, index: int) -> None:
        claim = self.held.pop(index % len(self.held))
        attempt(claim, now=NOW[0])

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 10))
    def hand_back(self, index: int) -> None:
        release([self.held.pop(index % len(self.held))], now=NOW[0])

    @rule(seconds=st.sampled_from([1, 11, 31, 301]))
    def wait(self, seconds: int) -> None:
        NOW[0] += timedelta(seconds=seconds)  # a claim whose lease lapsed lost its worker
        self.held = self.live()

    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        events = list(EventRecord.objects.values_list("pk", flat=True))
        if events:
            replay_events([data.draw(st.sampled_from(events))])

    @rule(skip=st.booleans())
    def requeue(self, skip: bool) -> None:
        if skip:
            dead = DeliveryRecord.objects.filter(receiver_key=SKIP, status="dead")
            self.requeued_skip |= set(dead.values_list("pk", flat=True))
        requeue_dead(receiver_key=SKIP if skip else BLOCK)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        events = list(EventRecord.objects.values_list("pk", flat=True))
        if events:
            cancel_deliveries([data.draw(st.sampled_from(events))])

    @invariant()
    def one_live_claim_per_key(self) -> None:
        keys = [
            (c.receiver_key, DeliveryRecord.objects.get(pk=c.id).order_key) for c in self.live()
        ]
        assert len(keys) == len(set(keys)), keys

    @invariant()
    def runs_in_recorded_order(self) -> None:
        rows = dict(DeliveryRecord.objects.values_list("pk", "order_key"))
        done = RunLog.objects.filter(
            delivery_id__in=DeliveryRecord.objects.filter(status="succeeded").values("pk")
        )
        seen: dict[tuple[str, str], list[int]] = {}
        for delivery_id, receiver_key in done.order_by("id").values_list(
            "delivery_id", "receiver_key"
        ):
            if delivery_id in self.requeued_skip:
                continue  # requeued under skip: it runs when requeued, after its key moved on
            seen.setdefault((receiver_key, rows[delivery_id]), []).append(delivery_id)
        for runs in seen.values():
            assert runs == sorted(runs), seen


def test_ordered_rows_run_one_at_a_time_in_recorded_order() -> None:
    declare()
    run_state_machine_as_test(
        Ordered,
        settings=settings(
            max_examples=int(os.environ.get("DDE_ORDERING_EXAMPLES", "60")),
            stateful_step_count=30,
            deadline=None,
            database=None,
            derandomize=not os.environ.get("DDE_ORDERING_RANDOM"),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
