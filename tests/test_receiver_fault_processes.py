"""Receivers that fail outside a plain exception, run by a real relay (issue 19, items 3,
6 and 6b): each such row is one charged attempt after another until it is dead, its
neighbours succeed, and ``deliver_events --once`` ends with exit 0. On every database."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from django.db import connection, transaction

from django_domain_events import DeliveryStatus, fire, receiver
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced, Pinged
from tests.conftest import start_child, wait_for
from tests.procs.receivers import (
    CANCELLED_KEY,
    DOWN_DATABASE_KEY,
    FAULTY,
    KILLS_CONNECTION_KEY,
    RUN_LOG_KEY,
    cancelled,
    declare_run_logger,
    kill_own_connection,
    query_down_database,
    run_log_relay_env,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

CONCURRENCY = [1] if connection.vendor == "sqlite" else [1, 4]


def deliver_until_settled(env: dict[str, str], concurrency: int) -> tuple[int, str]:
    """``deliver_events --once`` until no row is owed (a failed row waits out its 50 ms
    backoff, which ``--once`` does not): each run must end, and end well."""
    owed = DeliveryRecord.objects.exclude(
        status__in=(DeliveryStatus.SUCCEEDED, DeliveryStatus.DEAD)
    )
    for _ in range(5):
        code, output = deliver_once(env, concurrency)
        if code != 0 or not owed.exists():
            return code, output
        time.sleep(0.1)
    return code, output


def deliver_once(env: dict[str, str], concurrency: int) -> tuple[int, str]:
    process = start_child("relay", "--once", "--concurrency", str(concurrency), env=env)
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"deliver_events --once never ended:\n{out}{err}") from None
    return process.returncode, out + err


def assert_dead_after_attempts(key: str) -> None:
    row = DeliveryRecord.objects.get(receiver_key=key)
    assert (row.status, row.attempts) == (DeliveryStatus.DEAD, FAULTY["max_attempts"]), (
        key,
        row.status,
        row.attempts,
        row.last_error,
    )


@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_cancelled_error_and_a_killed_own_connection_are_charged_and_die_alone(
    concurrency: int,
) -> None:
    declare_run_logger()
    receiver(OrderPlaced, key=CANCELLED_KEY, **FAULTY)(cancelled)
    receiver(OrderPlaced, key=KILLS_CONNECTION_KEY, **FAULTY)(kill_own_connection)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
        for n in range(18):
            fire(Pinged(n=n))
    log, env = run_log_relay_env(0, POLL_SECONDS=0.1)
    env["DDE_RECEIVERS"] = "faulty"
    code, output = deliver_until_settled(env, concurrency)
    assert code == 0, output
    assert DeliveryRecord.objects.count() == 20
    assert_dead_after_attempts(CANCELLED_KEY)
    assert "CancelledError" in DeliveryRecord.objects.get(receiver_key=CANCELLED_KEY).last_error
    assert_dead_after_attempts(KILLS_CONNECTION_KEY)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    assert set(rows.values_list("status", "attempts")) == {(DeliveryStatus.SUCCEEDED, 1)}
    assert sorted(log.read_text().split()) == sorted(
        str(pk) for pk in rows.values_list("id", flat=True)
    )


@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_a_receiver_whose_other_database_is_down_is_charged_and_dies(concurrency: int) -> None:
    declare_run_logger()
    receiver(OrderPlaced, key=DOWN_DATABASE_KEY, **FAULTY)(query_down_database)
    with transaction.atomic():
        fire(OrderPlaced(order_id=1))
        for n in range(17):
            fire(Pinged(n=n))
    _, env = run_log_relay_env(0, POLL_SECONDS=0.1)
    env.update(DDE_RECEIVERS="faulty", DDE_DOWN_ALIAS="1")
    code, output = deliver_until_settled(env, concurrency)
    assert code == 0, output
    assert_dead_after_attempts(DOWN_DATABASE_KEY)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    assert set(rows.values_list("status", flat=True)) == {DeliveryStatus.SUCCEEDED}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_real_signal_still_stops_the_relay_and_hands_back_what_it_holds(signum: int) -> None:
    """Receivers' KeyboardInterrupt is only their attempt, but SIGINT sent to the relay
    is the operator's: the row in hand finishes, the rest of the batch goes back."""
    declare_run_logger()
    with transaction.atomic():
        for n in range(6):
            fire(Pinged(n=n))
    log, env = run_log_relay_env(0.5, POLL_SECONDS=0.1)
    relay = start_child("relay", "--batch-size", "6", env=env)
    rows = DeliveryRecord.objects.filter(receiver_key=RUN_LOG_KEY)
    wait_for(lambda: log.exists() and log.read_text().strip() != "", 60, "the first run")
    relay.send_signal(signum)
    out, err = relay.communicate(timeout=60)
    assert relay.returncode == 0, out + err
    ran = log.read_text().split()
    assert set(rows.filter(id__in=ran).values_list("status", flat=True)) == {"succeeded"}
    rest = rows.exclude(id__in=ran)
    assert rest.exists()
    assert set(rest.values_list("status", "attempts")) == {(DeliveryStatus.PENDING, 0)}
