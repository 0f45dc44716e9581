"""The relay as a real process: waking, sharing, stopping, dying, outages.

A single relay's tests run on every database; several relays need a server, and
waking by LISTEN/NOTIFY or a private cluster need PostgreSQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered
from tests.conftest import (
    needs_postgresql,
    needs_several_relays,
    relay_listening,
    start_child,
    start_together,
    wait_for,
)
from tests.procs.receivers import RECORDER_KEY, declare_all

pytestmark = pytest.mark.django_db(transaction=True)


def fire_orders(count: int) -> None:
    with transaction.atomic():
        for n in range(count):
            fire(OrderPlaced(order_id=n))


def relay(*args: str, **env: str) -> subprocess.Popen[str]:
    ready = Path(tempfile.mkdtemp()) / "ready"
    process = start_child("relay", *args, env={**env, "DDE_READY_FILE": str(ready)})
    wait_for(ready.exists, 30, "the relay to start")
    return process


def finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


@needs_postgresql
def test_a_listening_relay_delivers_well_before_its_poll() -> None:
    """Woken by each commit's NOTIFY, the relay delivers long before its 60 s poll would: each
    delivery lands inside a ceiling (20 s) generous for a loaded host and still a third of
    the poll, so a relay that only polled could not meet it."""
    declare_all()
    process = relay(DDE_SETTINGS_JSON=json.dumps({"POLL_SECONDS": 60}))
    try:
        wait_for(relay_listening, 30, "the relay to listen")
        for n in range(5):
            fire_orders(1)
            wait_for(lambda n=n: Delivered.objects.count() > n, 20, f"delivery {n + 1}")
    finally:
        process.send_signal(signal.SIGTERM)
        code, output = finish(process)
    assert code == 0, output


@needs_several_relays
def test_four_relays_on_one_lane_deliver_5000_rows_each_exactly_once() -> None:
    declare_all()
    fire_orders(5000)
    # They begin at one moment, so each takes part however slowly it booted.
    relays = start_together("relay", [("--once", "--worker-id", f"r{i}") for i in range(4)])
    for process in relays:
        code, output = finish(process, timeout=300)
        assert code == 0, output
    assert Delivered.objects.count() == 5000
    assert Delivered.objects.values("delivery_id").distinct().count() == 5000
    rows = DeliveryRecord.objects.filter(receiver_key=RECORDER_KEY)
    assert rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 5000
    assert len(set(rows.values_list("claimed_by", flat=True))) > 1  # they shared the rows


def test_sigterm_finishes_the_delivery_in_hand_and_hands_back_the_rest() -> None:
    declare_all()
    fire_orders(50)
    process = relay("--batch-size", "50", DDE_SLOW_SECONDS="0.3")
    wait_for(lambda: Delivered.objects.exists(), 30, "the first delivery")
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == 0, output
    done = Delivered.objects.count()
    assert 1 <= done < 50
    rest = DeliveryRecord.objects.exclude(status=DeliveryStatus.SUCCEEDED)
    assert rest.count() == 50 - done
    assert not rest.filter(status=DeliveryStatus.CLAIMED).exists()  # no lease to wait out
    assert set(rest.values_list("attempts", flat=True)) == {0}
    second = start_child("relay", "--once")
    # Well inside the 330 s lease the rows would otherwise wait out.
    code, output = finish(second, timeout=120)
    assert code == 0, output
    assert Delivered.objects.count() == 50


def test_a_second_signal_exits_at_once() -> None:
    declare_all()
    fire_orders(5)
    process = relay(DDE_SLOW_SECONDS="5")
    wait_for(
        lambda: DeliveryRecord.objects.filter(status=DeliveryStatus.CLAIMED).exists(), 30, "a claim"
    )
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    # The exit code tells: a relay that waited for its 5 s delivery would exit 0.
    code, _ = finish(process, timeout=60)
    assert code == 128 + signal.SIGTERM


LAPSING = json.dumps({"LEASE_SECONDS": 2})


def kill_mid_batch(rows: int) -> None:
    """Fire ``rows`` orders, kill -9 a relay holding them all in one batch after a couple of
    deliveries, and wait out its lease (2 s x 1.1)."""
    declare_all()
    fire_orders(rows)
    process = relay("--batch-size", str(rows), DDE_SLOW_SECONDS="0.2", DDE_SETTINGS_JSON=LAPSING)
    wait_for(lambda: Delivered.objects.count() >= 2, 30, "some deliveries")
    process.kill()
    process.communicate()


def lapsed() -> bool:
    """Every claimed row's lease has run out (the killed relay's claim)."""
    claimed = DeliveryRecord.objects.filter(status=DeliveryStatus.CLAIMED)
    return claimed.exists() and not claimed.filter(lease_expires_at__gt=timezone.now()).exists()


def take_over(relays: int, *args: str) -> None:
    """Once the dead relay's lease has lapsed, run ``relays`` relays with ``--once``, started
    together, each to a clean exit."""
    wait_for(lapsed, 30, "the killed relay's lease to lapse")
    children = start_together(
        "relay", [("--once", *args)] * relays, env={"DDE_SETTINGS_JSON": LAPSING}
    )
    for child in children:
        code, output = finish(child, timeout=60)
        assert code == 0, output


def test_kill_9_mid_batch_every_row_is_delivered_once_and_one_attempt_is_charged() -> None:
    kill_mid_batch(20)
    assert Delivered.objects.count() < 20
    take_over(1)
    assert Delivered.objects.count() == 20
    assert Delivered.objects.values("delivery_id").distinct().count() == 20
    assert DeliveryRecord.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 20
    # Only the row the dead relay was running spent an attempt; the rest ran once.
    attempts = sorted(DeliveryRecord.objects.values_list("attempts", flat=True))
    assert attempts == [1] * 19 + [2], attempts


@needs_several_relays
def test_two_relays_taking_over_a_killed_batch_in_parts_charge_one_attempt() -> None:
    kill_mid_batch(30)
    take_over(2, "--batch-size", "4")
    assert Delivered.objects.count() == 30
    assert Delivered.objects.values("delivery_id").distinct().count() == 30
    attempts = sorted(DeliveryRecord.objects.values_list("attempts", flat=True))
    assert attempts == [1] * 29 + [2], attempts


# A database outage, on a throwaway cluster so the shared server is never touched --------


def _free_port() -> int:
    """A port nothing listens on now, chosen by the kernel."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    """A private PostgreSQL cluster on a spare port, so the shared server is never touched."""

    def __init__(self) -> None:
        bin_dir = Path(subprocess.check_output(["pg_config", "--bindir"], text=True).strip())
        self.bin = bin_dir if (bin_dir / "initdb").exists() else Path("/usr/lib/postgresql/15/bin")
        self.base = Path(tempfile.mkdtemp(prefix="dde-pg-"))
        self.data = self.base / "data"
        self.port = _free_port()  # not pid-derived: suites run side by side here
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_postgres, str(self.bin / tool), *args], check=True, capture_output=True
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-w",
            "-o",
            options,
            "-l",
            str(self.base / "log"),
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")

    def query(self, sql: str, dbname: str = "dde_outage") -> int:
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname) as c:
            return int(c.execute(sql).fetchone()[0])  # type: ignore[index]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    cluster.start()
    with psycopg.connect(
        host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute("CREATE DATABASE dde_outage")
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)


@needs_postgresql
def test_the_relay_survives_a_database_restart_and_releases_its_batch(cluster: Cluster) -> None:
    env = {"DDE_PG_PORT": str(cluster.port), "DDE_DB_NAME": "dde_outage"}
    code, output = finish(start_child("seed", "40", env=env), timeout=120)
    assert code == 0, output
    succeeded = f"SELECT count(*) FROM {DeliveryRecord._meta.db_table} WHERE status = 'succeeded'"
    process = relay("--batch-size", "40", DDE_SLOW_SECONDS="0.3", **env)
    try:
        wait_for(lambda: cluster.query(succeeded) >= 2, 30, "the first deliveries")
        cluster.stop()
        time.sleep(4)
        assert process.poll() is None, "the relay exited when the database went away"
        cluster.start()
        before = cluster.query(succeeded)
        # Far sooner than the 330 s lease: the relay released the rows it held. The
        # ceilings are generous for a loaded host and still a small part of that lease.
        wait_for(lambda: cluster.query(succeeded) > before, 30, "claims to resume")
        wait_for(lambda: cluster.query(succeeded) == 40, 60, "the interrupted batch")
        assert cluster.query("SELECT count(DISTINCT delivery_id) FROM testapp_delivered") == 40
        assert cluster.query("SELECT count(*) FROM testapp_delivered") == 40
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        finish(process)


@needs_postgresql
def test_a_transaction_with_many_events_sends_one_wake_up() -> None:

    declare_all()
    params = dict(connection.get_connection_params())
    for key in ("context", "cursor_factory", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute('LISTEN "django_domain_events"')
        time.sleep(0.6)  # let any earlier test's coalescing window close
        fire_orders(10)
        # The wake-up, within a ceiling generous for a loaded host; then no second one
        # during the coalescing window (0.5 s) and well after it.
        first = list(listener.notifies(timeout=15, stop_after=1))
        assert len(first) == 1
        assert list(listener.notifies(timeout=2)) == []
