"""Two services through a real broker, with real processes (PostgreSQL leg only).

Service A (a database of its own) fires 10,000 events and two relays publish them;
service B (the test database) runs two consumer processes and a relay whose receiver
writes each order id into a unique column. Midway the broker is restarted (a server of
this test's own, never the machine's shared ones), then a publishing relay and a
consumer are each killed with SIGKILL. At the end B has exactly the 10,000 ids and
exactly 10,000 consumed events; the duplicates the brokers delivered are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_domain_events import DeliveryStatus
from django_domain_events.models import DeadMessage, DeliveryRecord, EventRecord
from tests.app.models import Delivered
from tests.conftest import ROOT, child_env, needs_postgresql, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql]

EVENTS = 10_000
BASE = Path("/tmp/wt-inbox-brokers")


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
    except OSError:
        return False
    return True


@dataclass
class Server:
    """A broker server of this test's own: started, restarted and stopped by it alone."""

    kind: str
    port: int
    url: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def dir(self) -> Path:
        return BASE / self.kind

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the server's, kept open
        if self.kind == "nats":
            command = ["nats-server", "-js", "-p", str(self.port), "-sd", str(self.dir / "js")]
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        elif self.kind == "redis":
            command = [
                "redis-server",
                *("--port", str(self.port), "--appendonly", "yes"),
                *("--appendfsync", "always", "--dir", str(self.dir), "--save", ""),
            ]
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        else:
            rabbit = ["/usr/lib/rabbitmq/bin/rabbitmq-server", "-detached"]
            subprocess.run(rabbit, env=self._rabbit_env(), check=True, stdout=log, stderr=log)
            self._rabbitmqctl("wait", str(self.dir / "pid"))
        wait_for(lambda: port_open(self.port), 60, f"{self.kind} on port {self.port}")

    def stop(self) -> None:
        if self.kind == "rabbitmq":
            self._rabbitmqctl("stop", str(self.dir / "pid"))
        elif self.process is not None:
            self.process.terminate()
            self.process.wait(30)
        wait_for(lambda: not port_open(self.port), 30, f"{self.kind} to stop")

    def _rabbit_env(self) -> dict[str, str]:
        plugins = self.dir / "enabled_plugins"
        plugins.write_text("[].\n")
        return {
            **os.environ,
            "RABBITMQ_NODENAME": "rabbit-inbox@localhost",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": "25674",
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "none"),
        }

    def _rabbitmqctl(self, *args: str) -> None:
        subprocess.run(
            ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", "rabbit-inbox@localhost", *args],
            env=self._rabbit_env(),
            check=True,
            capture_output=True,
            timeout=120,
        )


SERVERS = {
    "nats": lambda: Server("nats", 4224, "nats://127.0.0.1:4224"),
    "redis": lambda: Server("redis", 6381, "redis://127.0.0.1:6381/0"),
    "rabbitmq": lambda: Server("rabbitmq", 5674, "amqp://guest:guest@127.0.0.1:5674/%2F"),
}


@pytest.fixture(params=sorted(SERVERS))
def server(request) -> Iterator[Server]:
    found = SERVERS[request.param]()
    if port_open(found.port):
        pytest.skip(f"port {found.port} is taken: another run of this test is under way")
    shutil.rmtree(found.dir, ignore_errors=True)
    found.start()
    try:
        yield found
    finally:
        with contextlib.suppress(Exception):
            found.stop()
        shutil.rmtree(found.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def service_a(django_db_setup, django_db_blocker) -> Iterator[str]:
    """Service A's own database: B's test database's name with ``_a``, migrated once for
    the three brokers (each test publishes to a destination of its own)."""
    with django_db_blocker.unblock():
        name = f"{connection.settings_dict['NAME']}_a"
        params = connection.get_connection_params()
    admin = {k: params[k] for k in ("host", "port", "user") if k in params}
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as pg:
        pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        pg.execute(f'CREATE DATABASE "{name}"')
    env = {**child_env(), "DDE_DB_NAME": name}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    try:
        yield name
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **admin) as pg:
            pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_two_services_exchange_10000_events_through_restarts_and_kills(
    server: Server, service_a: str, tmp_path: Path
) -> None:
    source = f"orders-{uuid.uuid4().hex[:8]}"
    counts_file = tmp_path / "counts.jsonl"
    brokers = {"BROKERS": {"default": {"URL": server.url, "RETRY_CONNECT_SECONDS": 0.2}}}
    a_env = {
        "DDE_DB_NAME": service_a,
        "DDE_SETTINGS_JSON": json.dumps({**brokers, "LEASE_SECONDS": 3}),
    }
    b_env = {"DDE_SETTINGS_JSON": json.dumps(brokers), "DDE_COUNTS_FILE": str(counts_file)}
    children: list[subprocess.Popen[bytes]] = []

    def start(role: str, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
        # Output to files, not pipes: nobody reads a pipe, and a full one would block.
        log = open(tmp_path / f"{role}-{len(children)}.log", "wb")  # noqa: SIM115
        child = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "procs" / "services.py"), role, source, *extra],
            env={**child_env(), **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        children.append(child)
        return child

    try:
        consumers = [start("consume", b_env) for _ in range(2)]
        start("deliver", b_env)
        # RabbitMQ routes a message only to a queue bound already: wait for the consumers.
        wait_for(lambda: counts_file.exists() or _declared(server, source), 60, "consumers")
        firing = start("fire", a_env, str(EVENTS))
        relays = [start("relay", a_env) for _ in range(2)]
        wait_for(lambda: _consumed() >= EVENTS // 4, 120, "a quarter consumed")
        server.stop()
        time.sleep(1)
        server.start()
        wait_for(lambda: _consumed() >= EVENTS // 2, 120, "half consumed")
        relays[0].send_signal(signal.SIGKILL)
        wait_for(lambda: _consumed() >= 3 * EVENTS // 4, 120, "three quarters consumed")
        consumers[0].send_signal(signal.SIGKILL)
        assert firing.wait(120) == 0
        wait_for(lambda: Delivered.objects.count() >= EVENTS, 150, "every id written")
        time.sleep(2)  # anything recorded twice would show now
    finally:
        for log in sorted(tmp_path.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
    totals: Counter[str] = Counter()
    for line in counts_file.read_text().splitlines():
        totals.update({k: v for k, v in json.loads(line).items() if k != "pid"})
    print(
        f"\n{server.kind}: recorded {totals['recorded']}, duplicates the broker delivered "
        f"{totals['duplicate']} (counted by the surviving and killed consumers' batches)"
    )
    assert Delivered.objects.count() == EVENTS
    assert set(Delivered.objects.values_list("delivery_id", flat=True)) == set(range(EVENTS))
    assert EventRecord.objects.filter(received__isnull=False).count() == EVENTS
    assert not DeadMessage.objects.exists()
    assert not DeliveryRecord.objects.exclude(status=DeliveryStatus.SUCCEEDED).exists()


def _consumed() -> int:
    return EventRecord.objects.filter(received__isnull=False).count()


def _declared(server: Server, source: str) -> bool:
    """Whether B's queue exists (RabbitMQ); the streams hold messages without a consumer."""
    if server.kind != "rabbitmq":
        return True
    found = subprocess.run(
        [
            "/usr/lib/rabbitmq/bin/rabbitmqctl",
            "-n",
            "rabbit-inbox@localhost",
            "list_queues",
            "name",
        ],
        env=server._rabbit_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return f"{source}-b" in found.stdout
