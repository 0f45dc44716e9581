"""The relay under faults no happy path stages: rows lost mid-batch, exceptions that
misbehave, rows that cannot be read, settings that cannot be loaded, errors that
waiting cannot fix. Each test names the defect of issue 10 it guards (D1..D12).

Runs on every database; what needs processes is in test_relay_fault_processes.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import (
    INLINE,
    ON_COMMIT,
    DeliveryStatus,
    claim_batch,
    deliver_pending,
    drain_outbox,
    fire,
    receiver,
    run_relay,
)
from django_domain_events.delivery.claim_rows import INLINE_PAYLOAD_BYTES
from django_domain_events.delivery.outcomes import describe_error
from django_domain_events.delivery.relay import RelayHalted, relay_worker_id
from django_domain_events.models import DeliveryRecord, EventRecord
from django_domain_events.retry import Constant
from tests.app.events import OrderPlaced, Pinged
from tests.support import fire_one

pytestmark = pytest.mark.django_db(transaction=True)

VENDOR_HAS_HEARTBEAT = os.environ.get("DDE_TEST_DB", "sqlite") != "sqlite"


def statuses() -> dict[int, tuple[str, int]]:
    return {
        row.event_id: (row.status, row.attempts)
        for row in DeliveryRecord.objects.order_by("event_id")
    }


# D1: a relay never runs a row it lost --------------------------------------------


@override_settings(DJANGO_DOMAIN_EVENTS={"LEASE_SECONDS": 1})
def test_d1_a_row_taken_over_while_its_batch_ran_is_not_run_by_the_first_relay() -> None:
    ran: list[int] = []
    taken: list[int] = []

    def slow_then_overtaken(evt: OrderPlaced) -> None:
        ran.append(evt.order_id)
        if evt.order_id == 0:
            time.sleep(0.3)  # the rest of the batch now has less than 90% of its lease
            # Another relay, whose clock is past the lease, takes the rest over.
            other = threading.Thread(target=_claim_from_another_thread, args=(taken, 5, rest))
            other.start()
            other.join()

    receiver(OrderPlaced, key="t.lost")(slow_then_overtaken)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(3)]
    rest = list(DeliveryRecord.objects.filter(event_id__in=ids[1:]).values_list("id", flat=True))
    deliver_pending(batch_size=3)
    assert ran == [0]
    rest = DeliveryRecord.objects.filter(event_id__in=ids[1:])
    assert sorted(taken) == sorted(rest.values_list("id", flat=True))
    assert set(rest.values_list("claimed_by", "status")) == {("B", DeliveryStatus.CLAIMED)}
    first = DeliveryRecord.objects.get(event_id=ids[0])
    assert (first.status, first.attempts) == (DeliveryStatus.SUCCEEDED, 1)


def _claim_from_another_thread(
    found: list[int], ahead: float = 0, ids: list[int] | None = None
) -> None:
    """Another relay's claim, on its own connection; ``ahead`` seconds of clock skew."""
    try:
        now = timezone.now() + timedelta(seconds=ahead)
        claims = claim_batch(worker_id="B", now=now, lease=60, limit=9, ids=ids)
        found.extend(c.id for c in claims)
    finally:
        connections.close_all()


@pytest.mark.skipif(not VENDOR_HAS_HEARTBEAT, reason="SQLite runs one relay: no heartbeat")
@override_settings(DJANGO_DOMAIN_EVENTS={"LEASE_SECONDS": 0.6})
def test_d1_the_heartbeat_keeps_a_long_receivers_row_from_being_taken_over() -> None:
    found: list[int] = []

    def long_job(evt: OrderPlaced) -> None:
        time.sleep(1.5)  # more than twice the lease (0.66 s)
        other = threading.Thread(target=_claim_from_another_thread, args=(found,))
        other.start()
        other.join()

    receiver(OrderPlaced, key="t.long")(long_job)
    fire_one(OrderPlaced(order_id=1))
    assert deliver_pending()[DeliveryStatus.SUCCEEDED] == 1
    assert found == []  # the lease was renewed while the receiver ran


@pytest.mark.skipif(not VENDOR_HAS_HEARTBEAT, reason="SQLite runs one relay: no heartbeat")
@override_settings(DJANGO_DOMAIN_EVENTS={"LEASE_SECONDS": 0.3, "RUN_LIMIT_SECONDS": 0.5})
def test_d1_a_receiver_hung_past_the_run_limit_lets_its_lease_lapse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found: list[int] = []

    def hung(evt: OrderPlaced) -> None:
        time.sleep(1.5)  # past the run limit and the last renewed lease after it
        other = threading.Thread(target=_claim_from_another_thread, args=(found,))
        other.start()
        other.join()

    receiver(OrderPlaced, key="t.hung")(hung)
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert found == [row.id] and row.claimed_by == "B"
    assert "longer than RUN_LIMIT_SECONDS" in caplog.text


# D2, D3: every exception a receiver raises is one recorded attempt ------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


class Unrenderable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    "error, expected",
    [
        (ValueError("nul \x00 byte"), "ValueError: nul \\x00 byte"),
        (ValueError("lone \ud800 surrogate"), "ValueError: lone \\ud800 surrogate"),
        (Unprintable("x"), "Unprintable: Unprintable('x')"),
        (Unrenderable(), "Unrenderable: <the message could not be rendered"),
    ],
    ids=["nul", "surrogate", "str-raises", "str-and-repr-raise"],
)
def test_d2_d3_a_misbehaving_exception_is_recorded_as_one_failed_attempt(
    error: Exception, expected: str
) -> None:
    def raise_it(evt: OrderPlaced) -> None:
        raise error

    # A backoff far ahead: full jitter could make the row due again within this call.
    receiver(OrderPlaced, key="t.weird", max_attempts=3, retry=Constant(60))(raise_it)
    receiver(Pinged, key="t.fine")(lambda evt: None)
    weird = fire_one(OrderPlaced(order_id=1))
    fine = fire_one(Pinged(n=1))
    counts = deliver_pending(batch_size=10)
    assert counts[DeliveryStatus.FAILED] == 1 and counts[DeliveryStatus.SUCCEEDED] == 1
    row = DeliveryRecord.objects.get(event_id=weird)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    assert row.last_error.startswith(expected)
    assert DeliveryRecord.objects.get(event_id=fine).status == DeliveryStatus.SUCCEEDED


def test_d2_a_huge_message_is_cut_so_every_database_stores_it() -> None:
    def shout(evt: OrderPlaced) -> None:
        raise ValueError("x" * 200_000)

    receiver(OrderPlaced, key="t.huge")(shout)
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status == DeliveryStatus.FAILED
    assert row.last_error.endswith("(196000 more characters)")
    assert describe_error(ValueError("x" * 200_000)) == row.last_error


def test_a_receiver_calling_sys_exit_fails_its_attempt_and_the_batch_goes_on() -> None:
    def exits(evt: OrderPlaced) -> None:
        raise SystemExit(3)

    receiver(OrderPlaced, key="t.exit", retry=Constant(60))(exits)
    ids = [fire_one(OrderPlaced(order_id=n)) for n in range(2)]
    deliver_pending()
    assert statuses() == {i: (DeliveryStatus.FAILED, 1) for i in ids}


def test_a_retry_policy_that_raises_falls_back_to_the_default_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def delay(self, attempt: int, error: BaseException) -> float:
            raise ZeroDivisionError("oops")

    def fails(evt: OrderPlaced) -> None:
        raise ConnectionError("down")

    receiver(OrderPlaced, key="t.policy", retry=Broken())(fails)
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending(limit=1)  # the fallback's jitter may make the row due again at once
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1)
    assert row.available_at <= timezone.now() + timedelta(seconds=2.5)  # base 2 s, jittered
    assert "retry policy Broken failed (ZeroDivisionError: oops)" in caplog.text


# D4: a row the relay cannot read is a dead letter, never a crash ------------------


def _nest(depth: int) -> str:
    return '{"order_id": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.skipif(
    connection.vendor == "mysql", reason="MariaDB refuses JSON nested past 32 levels itself"
)
@pytest.mark.parametrize("column", ["payload", "scope"])
def test_d4_a_row_nested_too_deep_to_read_dies_and_the_batch_goes_on(column: str) -> None:
    try:
        json.loads(_nest(995))
    except RecursionError:
        pass
    else:  # Python 3.12+ keeps its C stack apart from the recursion limit
        pytest.skip("this Python's json reads JSON nested 995 deep: no row is too deep")
    ran: list[int] = []
    receiver(OrderPlaced, key="t.deep")(lambda evt: ran.append(evt.order_id))
    poison, healthy = fire_one(OrderPlaced(order_id=1)), fire_one(OrderPlaced(order_id=2))
    table = connection.ops.quote_name(EventRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s WHERE id = %s",
            [_nest(995), poison],  # within SQLite's JSON depth limit (1000)
        )
    counts = deliver_pending(batch_size=10)
    assert counts[DeliveryStatus.DEAD] == 1 and ran == [2]
    dead = DeliveryRecord.objects.get(event_id=poison)
    assert (dead.status, dead.attempts) == (DeliveryStatus.DEAD, 0)
    assert "RecursionError" in dead.last_error
    assert DeliveryRecord.objects.get(event_id=healthy).status == DeliveryStatus.SUCCEEDED


def test_d11_a_payload_larger_than_a_claim_carries_is_read_when_its_row_runs() -> None:
    seen: list[int] = []
    receiver(Pinged, key="t.big")(lambda evt: seen.append(len(evt.labels[0])))
    big = "y" * (INLINE_PAYLOAD_BYTES * 2)
    fire_one(Pinged(n=1, labels=[big]))
    fire_one(Pinged(n=2, labels=["small"]))
    claims = claim_batch(worker_id="w", now=timezone.now(), lease=60, limit=10)
    assert [c.payload is None for c in claims] == [True, False]
    DeliveryRecord.objects.update(status=DeliveryStatus.PENDING, available_at=timezone.now())
    deliver_pending()
    assert seen == [len(big), 5]


# D5: errors that waiting cannot fix stop the relay ------------------------------


def _rename_column(old: str, new: str) -> None:
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} RENAME COLUMN {connection.ops.quote_name(old)} "
            f"TO {connection.ops.quote_name(new)}"
        )


def test_d5_a_missing_column_stops_the_relay_with_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver(OrderPlaced, key="t.schema")(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    # claimed_by, which every claim writes: not a column with a CHECK constraint, which
    # MariaDB 10.11 now and then refuses to rename ("Unknown column ... in 'CHECK'").
    _rename_column("claimed_by", "claimed_by_gone")
    try:
        started = time.monotonic()
        with pytest.raises(CommandError, match="manage.py migrate"):
            call_command("deliver_events", "--once")
        assert time.monotonic() - started < 60  # it stops: it does not retry for ever
    finally:
        connections.close_all()
        _rename_column("claimed_by_gone", "claimed_by")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "stopped" in errors[0].getMessage()
    assert DeliveryRecord.objects.get().status == DeliveryStatus.PENDING


# D6: a broken setting charges no row --------------------------------------------


@override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": "nowhere.Codec"})
def test_d6_an_unimportable_codec_dead_letters_nothing() -> None:
    receiver(OrderPlaced, key="t.codec")(lambda evt: None)
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        ids = [fire_one(OrderPlaced(order_id=n)) for n in range(3)]
    with pytest.raises(ImproperlyConfigured, match="CODEC"):
        drain_outbox()
    assert statuses() == {i: (DeliveryStatus.PENDING, 0) for i in ids}
    with pytest.raises(ImproperlyConfigured, match="CODEC"):
        run_relay(once=True)


@override_settings(DJANGO_DOMAIN_EVENTS={"AROUND_DELIVERY": "nowhere.around"})
def test_d6_an_unimportable_hook_charges_nothing_and_the_relay_refuses_to_start() -> None:
    receiver(OrderPlaced, key="t.hook")(lambda evt: None)
    event_id = fire_one(OrderPlaced(order_id=1))
    with pytest.raises(ImproperlyConfigured, match="AROUND_DELIVERY"):
        deliver_pending()
    assert statuses() == {event_id: (DeliveryStatus.PENDING, 0)}
    with pytest.raises(CommandError, match="AROUND_DELIVERY"):
        call_command("deliver_events", "--once")
    assert statuses() == {event_id: (DeliveryStatus.PENDING, 0)}


@pytest.mark.parametrize(
    "settings, check_id",
    [
        ({"AROUND_DELIVERY": "nowhere.around"}, "django_domain_events.E006"),
        ({"AROUND_DELIVERY": "os.sep"}, "django_domain_events.E006"),
        ({"TASK_BACKEND": "nowhere.Backend"}, "django_domain_events.E007"),
        ({}, "django_domain_events.E007"),  # a task receiver and no backend
    ],
)
def test_d6_check_loads_every_dotted_path_setting(settings: dict[str, Any], check_id: str) -> None:
    from django.core import checks

    receiver(OrderPlaced, key="t.task", site="task")(lambda evt: None)
    with override_settings(DJANGO_DOMAIN_EVENTS=settings):
        found = [m.id for m in checks.run_checks(databases=[])]
    assert check_id in found


# D7: the caller's connection is left alone -------------------------------------


@pytest.mark.django_db(transaction=False)
def test_d7_deliver_events_leaves_the_callers_connection_usable() -> None:
    receiver(OrderPlaced, key="t.conn")(lambda evt: None)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
    call_command("deliver_events", "--once")
    assert DeliveryRecord.objects.get().status == DeliveryStatus.SUCCEEDED


# D9: the relay hands back exactly what it held --------------------------------


def test_d9_each_relay_has_its_own_worker_id_even_in_one_process() -> None:
    first, second = relay_worker_id(), relay_worker_id()
    assert first != second and first.rsplit(":", 1)[0] == second.rsplit(":", 1)[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="kills its own backend")
def test_d9_after_an_outage_a_relay_hands_back_its_batch_not_another_threads_rows() -> None:
    lost: list[int] = []

    def lose_the_database(evt: OrderPlaced) -> None:
        if evt.order_id == 1 and not lost:
            lost.append(1)
            # The server goes away: this connection ends, and for a second no new one
            # can be made (nothing listens on port 1), as in a restart.
            port = connection.settings_dict["PORT"]
            connection.settings_dict["PORT"] = "1"
            threading.Timer(1.0, connection.settings_dict.__setitem__, ("PORT", port)).start()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    receiver(OrderPlaced, key="t.outage")(lose_the_database)
    other = fire_one(OrderPlaced(order_id=0))
    # Another thread of this process, under the same worker id, holds this row.
    claim_batch(worker_id="same", now=timezone.now(), lease=60, limit=1)
    mine = fire_one(OrderPlaced(order_id=1))
    run_relay(worker_id="same", passes=3, prune=None)
    assert DeliveryRecord.objects.get(event_id=other).status == DeliveryStatus.CLAIMED
    row = DeliveryRecord.objects.get(event_id=mine)
    assert (row.status, row.attempts) == (DeliveryStatus.SUCCEEDED, 1)  # the outage cost none


# D10: a dead letter keeps the error an earlier attempt recorded ----------------


def test_d10_a_lapsed_last_attempt_keeps_the_earlier_error_in_the_reason() -> None:
    def down(evt: OrderPlaced) -> None:
        raise ConnectionError("down")

    receiver(OrderPlaced, key="t.lapse", max_attempts=3, lease_seconds=30)(down)
    event_id = fire_one(OrderPlaced(order_id=1))
    drain_outbox(limit=1)
    drain_outbox(limit=1)
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 2)
    start = timezone.now() + timedelta(hours=2)
    claim_batch(worker_id="dies", now=start, lease=33, limit=1)  # the third attempt's worker dies
    drain_outbox(now=start + timedelta(seconds=34))
    row.refresh_from_db()
    assert (row.status, row.attempts) == (DeliveryStatus.DEAD, 3)
    assert "lease lapsed on attempt 3 of 3" in row.last_error
    assert "The last recorded error: ConnectionError: down" in row.last_error


# D12: one relay on SQLite, and what a relay says when it starts and stops ------


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite only")
def test_d12_a_second_relay_on_one_sqlite_file_is_refused() -> None:
    stop = threading.Event()
    first = threading.Thread(target=run_relay, kwargs={"stop": stop, "prune": None})
    first.start()
    try:
        time.sleep(0.5)
        with pytest.raises(RelayHalted, match="SQLite has a single writer"):
            run_relay(once=True)
    finally:
        stop.set()
        first.join(10)
    run_relay(once=True)  # the first one is gone: the file is free again


def test_d12_the_relay_says_when_it_starts_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    receiver(OrderPlaced, key="t.say")(lambda evt: None)
    fire_one(OrderPlaced(order_id=1))
    with caplog.at_level(logging.INFO, logger="django_domain_events"):
        run_relay(once=True, worker_id="teller")
    lines = [r.getMessage() for r in caplog.records if r.name == "django_domain_events.relay"]
    assert lines[0].startswith("Relay teller started: lanes default, ")
    assert "every 1.0s at the latest" in lines[0]
    wake = "LISTEN/NOTIFY" if connection.vendor == "postgresql" else "polling"
    assert wake in lines[0]
    assert lines[-1] == "Relay teller stopped: 1 succeeded."


# Issue 11 (2): a plain function returning an awaitable is refused at every site ----


async def _work() -> None:
    return None


def test_a_sync_receiver_returning_an_awaitable_fails_its_durable_attempt() -> None:
    receiver(OrderPlaced, key="t.coro", retry=Constant(60))(lambda evt: _work())
    event_id = fire_one(OrderPlaced(order_id=1))
    deliver_pending()
    row = DeliveryRecord.objects.get(event_id=event_id)
    assert row.status == DeliveryStatus.FAILED
    assert "TypeError: receiver t.coro, a plain function, returned an awaitable" in row.last_error


def test_a_sync_inline_receiver_returning_an_awaitable_fails_fire() -> None:
    receiver(OrderPlaced, key="t.coro-inline", mode=INLINE)(lambda evt: _work())
    with pytest.raises(TypeError, match="declare it with async def"), transaction.atomic():
        fire(OrderPlaced(order_id=1))
    assert not EventRecord.objects.exists()


def test_a_sync_on_commit_receiver_returning_an_awaitable_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver(OrderPlaced, key="t.coro-commit", mode=ON_COMMIT)(lambda evt: _work())
    fire_one(OrderPlaced(order_id=1))
    assert "returned an awaitable" in caplog.text


def test_check_reports_a_concurrency_sqlite_cannot_run() -> None:
    """The relay refuses CONCURRENCY > 1 on SQLite; ``manage.py check`` says so first."""
    from django.core import checks

    with override_settings(DJANGO_DOMAIN_EVENTS={"CONCURRENCY": 4}):
        found = [m for m in checks.run_checks(databases=[]) if m.id == "django_domain_events.E008"]
    if connection.vendor == "sqlite":
        assert len(found) == 1 and "CONCURRENCY" in found[0].msg, found
    else:
        assert found == []


@pytest.mark.parametrize(
    "command_args",
    [["deliver_events", "--once"], ["prune_events"]],
)
def test_a_broken_setting_under_skip_checks_is_one_clear_line(command_args: list[str]) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env

    env = {**child_env(), "DDE_SETTINGS_JSON": json.dumps({"LEASE_SECONDS": -1})}
    done = subprocess.run(
        [sys.executable, "-m", "django", *command_args, "--skip-checks"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "LEASE_SECONDS" in lines[0], done.stderr


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's own timeout")
def test_a_transaction_postgresql_ended_for_idling_is_ridden_out_not_a_halt() -> None:
    """A connection PostgreSQL ended for idling in a transaction (a DBA's
    ``idle_in_transaction_session_timeout``, or the relay's own on a batch it holds by
    row lock) passes with a new connection: the relay waits and goes on, it does not
    stop and send the operator to the migrations."""
    from django.db import DatabaseError

    from django_domain_events.delivery.outage import is_outage

    cut = connections.create_connection(connection.alias)
    try:
        cut.set_autocommit(False)
        with cut.cursor() as cursor:
            cursor.execute("SET idle_in_transaction_session_timeout = 100")
        time.sleep(0.6)
        with pytest.raises(DatabaseError) as caught, cut.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        cut.close()
    assert "idle-in-transaction" in str(caught.value)
    assert is_outage(caught.value, connection.alias)
