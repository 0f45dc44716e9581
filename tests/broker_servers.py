"""Broker servers of the broker tests' own, on ports of their own, for the restart tests:
never the machine's shared brokers, which other engineers and suites use.

NATS ``nats-server -js -p 4223``, Redis ``redis-server --port 6380`` with an fsynced
append-only file, and a second RabbitMQ node ``rabbit-pub@localhost`` on 5673 (no
plugins, so it binds no other shared port). ``stop`` and ``restart`` touch only these.
Two engineers' suites on one machine take other ports, node name and directory from
the environment: ``DDE_TEST_NATS_PORT``, ``DDE_TEST_REDIS_PORT``, ``DDE_TEST_RABBIT_PORT``,
``DDE_TEST_RABBIT_NODE``, ``DDE_TEST_RABBIT_DIST_PORT`` and ``DDE_BROKER_SERVERS_DIR``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

BASE = Path(os.environ.get("DDE_BROKER_SERVERS_DIR", "/tmp/wt-publish-servers"))


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(port: int, up: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _listening(port) != up:
        if time.monotonic() > deadline:
            raise AssertionError(f"port {port} still {'down' if up else 'up'} after {timeout}s")
        time.sleep(0.05)


class Server:
    """One broker server process of the tests."""

    transport = ""
    port = 0

    @property
    def url(self) -> str:
        raise NotImplementedError

    def available(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.start()


class NatsServer(Server):
    transport, port = "nats", int(os.environ.get("DDE_TEST_NATS_PORT", "4223"))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def available(self) -> bool:
        return shutil.which("nats-server") is not None

    def start(self) -> None:
        store = BASE / "nats"
        store.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(store)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(self.port, up=True)
        time.sleep(0.5)  # JetStream recovers its streams after the port opens

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None
        _wait(self.port, up=False)


class RedisServer(Server):
    transport, port = "redis", int(os.environ.get("DDE_TEST_REDIS_PORT", "6380"))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def available(self) -> bool:
        return shutil.which("redis-server") is not None

    def start(self) -> None:
        store = BASE / "redis"
        store.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(store)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(self.port, up=True)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()  # SIGTERM: redis fsyncs the AOF and exits
            self.process.wait(30)
            self.process = None
        _wait(self.port, up=False)


class RabbitServer(Server):
    transport, port = "rabbitmq", int(os.environ.get("DDE_TEST_RABBIT_PORT", "5673"))
    node = os.environ.get("DDE_TEST_RABBIT_NODE", "rabbit-pub@localhost")
    dist_port = os.environ.get("DDE_TEST_RABBIT_DIST_PORT", "25673")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def available(self) -> bool:
        return shutil.which("rabbitmq-server") is not None

    def _env(self) -> dict[str, str]:
        base = BASE / "rabbitmq"
        if not base.exists():
            (base / "log").mkdir(parents=True)
            (base / "enabled_plugins").write_text("[].\n")
            (base / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = {self.port}\nloopback_users = none\n"
            )
            (base / "env").write_text("")
            shutil.chown(base, "rabbitmq", "rabbitmq")
            for path in base.rglob("*"):
                shutil.chown(path, "rabbitmq", "rabbitmq")
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": self.dist_port,
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "env"),
        }

    def start(self) -> None:
        env = self._env()
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True)
        _wait(self.port, up=True, timeout=90)

    def stop(self) -> None:
        subprocess.run(
            ["rabbitmqctl", "-n", self.node, "stop"],
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(self.port, up=False)


SERVERS: dict[str, type[Server]] = {
    "nats": NatsServer,
    "redis": RedisServer,
    "rabbitmq": RabbitServer,
}
