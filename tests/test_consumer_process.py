"""A NATS or Redis consumer whose client runs in a child process (``CONSUMER_PROCESS``),
with the machine's real brokers and real processes.

A child killed mid-stream is a broker outage: nothing it held was acknowledged, the
broker delivers it again, and every message is recorded exactly once. A consumer
process killed leaves no child behind (the child reads its stdin to the end), and a new
consumer finishes the stream exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from django_domain_events import receiver, registry
from django_domain_events.contrib.brokers import config, envelope, subscribe
from django_domain_events.contrib.brokers.consumer_process import CHILD
from django_domain_events.contrib.brokers.consuming import run_consumer
from django_domain_events.contrib.brokers.transport import Outgoing, make_transport, run
from django_domain_events.ids import new_id
from django_domain_events.inbox import forget
from django_domain_events.models import EventRecord
from tests.app.events import OrderPlaced
from tests.brokers import broker_entry, remove, require
from tests.conftest import (
    children_of,
    needs_several_relays,
    running,
    start_child,
    stop_child,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = 3_000


@pytest.fixture(params=["nats", "redis"])
def kind(request) -> Iterator[str]:
    """NATS and Redis, consumed from a child process (the default)."""
    url = require(request.param)
    settings = {"BROKERS": {"default": broker_entry(url, None)}}
    with override_settings(DJANGO_DOMAIN_EVENTS=settings):
        yield request.param


@pytest.fixture
def source(kind) -> Iterator[str]:
    name = f"dde-test-{uuid.uuid4().hex[:10]}"
    yield name
    for suffix in ("-in", "-b"):
        forget(f"{name}{suffix}")
    remove(kind, require(kind), name)


def send(to: str, count: int) -> None:
    """``count`` OrderPlaced messages in the wire format, ids ``m0``... in order."""
    placed = registry.event_for_class(OrderPlaced)
    assert placed is not None
    transport = make_transport(config.broker("default"))
    run(transport.connect(), 30)
    try:
        for start in range(0, count, 500):
            batch = [
                Outgoing(
                    to,
                    envelope.build(
                        id=f"m{n}",
                        source="shop",
                        type=placed.name,
                        data=json.dumps({"order_id": n}).encode(),
                        payloadversion="1",
                    ),
                )
                for n in range(start, min(start + 500, count))
            ]
            assert run(transport.publish(batch), 60) == [None] * len(batch)
    finally:
        run(transport.close(), 10)


def recorded_once(subscription: str, count: int) -> None:
    ids = Counter(
        EventRecord.objects.filter(received__subscription=subscription).values_list(
            "received__id", flat=True
        )
    )
    assert len(ids) == count, f"{count - len(ids)} messages never recorded"
    assert ids.most_common(1)[0][1] == 1, f"recorded twice: {ids.most_common(3)}"


def test_a_child_killed_mid_stream_loses_nothing_and_records_each_message_once(
    kind, source
) -> None:
    receiver(OrderPlaced, key="t.child_killed")(lambda evt: None)
    subscribe(source, name=f"{source}-in", ack_wait_seconds=2)
    run_consumer(once=True, wait=0.5)  # declares the durable consumer or group
    send(source, MESSAGES)
    stop, done, killed = threading.Event(), Counter[str](), []

    def on_batch(_: object, counts: Counter[str]) -> None:
        done.update(counts)
        if not killed and done["recorded"] >= 500:
            (child,) = children_of(os.getpid(), CHILD)
            os.kill(child, signal.SIGKILL)
            killed.append(child)
        if done["recorded"] >= MESSAGES:
            stop.set()

    give_up = threading.Timer(120, stop.set)
    give_up.start()
    try:
        run_consumer(stop=stop, wait=0.5, on_batch=on_batch)
    finally:
        give_up.cancel()
    assert killed and not running(killed[0])
    assert done["recorded"] == MESSAGES, done
    recorded_once(f"{source}-in", MESSAGES)
    assert children_of(os.getpid(), CHILD) == []  # the consumer's stop ended its child


@needs_several_relays
def test_a_consumer_process_killed_leaves_no_child_and_the_next_finishes_the_stream(
    kind, source, tmp_path
) -> None:
    url = require(kind)
    env = {
        "DDE_SETTINGS_JSON": json.dumps({"BROKERS": {"default": {"URL": url}}}),
        "DDE_COUNTS_FILE": str(tmp_path / "counts.jsonl"),
    }
    output = tmp_path / "consumers.log"
    rows = EventRecord.objects.filter(received__subscription=f"{source}-b")
    try:
        first = start_child("services", "consume", source, env=env, output=output)
        try:
            wait_for(lambda: len(children_of(first.pid, CHILD)) == 1, 60, "the consumer's child")
            (child,) = children_of(first.pid, CHILD)
            send(source, MESSAGES)
            # The rows, not the counts the child writes after each commit: a kill between
            # the two would leave the counts short for ever.
            wait_for(lambda: rows.count() >= 300, 60, "the first batches recorded")
        finally:
            first.kill()
            first.wait(10)
        wait_for(lambda: not running(child), 10, f"the orphaned child {child} to exit")
        second = start_child("services", "consume", source, env=env, output=output)
        try:
            wait_for(lambda: len(children_of(second.pid, CHILD)) == 1, 60, "its child")
            (second_child,) = children_of(second.pid, CHILD)
            wait_for(lambda: rows.count() >= MESSAGES, 120, "the rest of the stream recorded")
            time.sleep(1)  # a message recorded twice would show now
            recorded_once(f"{source}-b", MESSAGES)
        finally:
            stop_child(second)
        wait_for(lambda: not running(second_child), 10, "the second consumer's child to stop")
    finally:
        print(f"--- the consumers' output\n{output.read_text(errors='replace')[-5000:]}")


def test_new_ids_read_as_uuid4_hex() -> None:
    drawn = {new_id() for _ in range(1_000)}
    assert len(drawn) == 1_000
    for value in drawn:
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == value


def test_a_broker_the_child_cannot_reach_is_an_outage_and_leaves_no_child(caplog) -> None:
    from django_domain_events.contrib.brokers.consuming import ConsumerHalted

    name = f"dde-test-{uuid.uuid4().hex[:10]}"
    entries = {
        "default": {
            "URL": "nats://127.0.0.1:17401",
            "CONNECT_TIMEOUT_SECONDS": 0.5,
            "CONFIRM_TIMEOUT_SECONDS": 0.5,
        }
    }
    with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": entries}):
        subscribe(name, name=f"{name}-in")
        try:
            with pytest.raises(ConsumerHalted, match="failed 5 times in a row"):
                run_consumer(once=True, wait=0.2)
        finally:
            forget(f"{name}-in")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings and all(
        "127.0.0.1:17401" in w and "ConnectionRefusedError" in w for w in warnings
    ), warnings
    assert children_of(os.getpid(), CHILD) == []


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port that takes connections and never says a word: a NATS client waits there
    for the server's INFO until its connect timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)  # the kernel completes the handshakes; nobody accepts
        yield server.getsockname()[1]


def test_the_child_program_imports_no_django() -> None:
    import subprocess
    import sys

    modules = ("consumer_child", "nats", "redis")
    imports = "; ".join(f"import django_domain_events.contrib.brokers.{m}" for m in modules)
    check = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run(
        [sys.executable, "-c", f"{imports}; {check}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.stdout.strip() == "[]"


def test_a_child_still_connecting_exits_when_its_parent_is_gone() -> None:
    """A server that takes the connection and never answers keeps the child connecting
    for up to its connect timeout: the child reads its stdin from the start, so the end
    of it (the parent killed) ends the child even then."""
    import subprocess
    import sys

    options = {
        "CONFIRM_TIMEOUT_SECONDS": 60.0,
        "CONNECT_TIMEOUT_SECONDS": 60.0,
        "RETRY_CONNECT_SECONDS": 0.5,
        "DUPLICATE_WINDOW_SECONDS": 120.0,
    }
    with silent_server() as port:
        argument = {
            "broker": {"name": "d", "url": f"nats://127.0.0.1:{port}", "transport": "nats"},
            "subscription": {"name": "s", "source": "src", "batch_size": 10, "options": {}},
            "worker_id": "w",
        }
        argument["broker"]["options"] = options
        child = subprocess.Popen(
            [sys.executable, "-m", CHILD, json.dumps(argument)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            time.sleep(1)  # connecting, never answered
            assert child.poll() is None
            child.send_signal(signal.SIGTERM)  # ignored: the parent decides
            time.sleep(0.3)
            assert child.poll() is None
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(5) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            if child.stdout is not None:
                child.stdout.close()
