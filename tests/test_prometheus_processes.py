"""A relay process serving its metrics (``deliver_events --metrics-port``), scraped over
HTTP while it runs; and relays sharing a host in prometheus_client's multiprocess mode."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import transaction

from django_domain_events import DeliveryStatus, fire
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced
from tests.conftest import needs_several_relays, start_child, wait_for
from tests.procs.receivers import FAILING_KEY, RECORDER_KEY, declare_all, declare_failing

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
QUICK = json.dumps({"POLL_SECONDS": 0.2})  # retries are found on the poll


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def serving(port: int, process: subprocess.Popen[str]) -> Callable[[], bool]:
    def up() -> bool:
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the relay exited: {out} {err}")
        try:
            scrape(port)
        except OSError:
            return False
        return True

    return up


def count(got: Samples, key: str, lane: str, outcome: str) -> float:
    labels = (("lane", lane), ("outcome", outcome), ("receiver", key))
    return got.get(("domain_events_deliveries_total", labels), 0.0)


def observed(got: Samples, name: str, key: str, lane: str) -> float:
    labels = (("lane", lane), ("receiver", key))
    return got.get((f"domain_events_delivery_{name}_seconds_count", labels), 0.0)


def fire_orders(first: int, count: int) -> None:
    with transaction.atomic():
        for n in range(first, first + count):
            fire(OrderPlaced(order_id=n))


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, out + err


def listening_on(port: int) -> set[str]:
    """The local addresses a TCP socket of this host listens on at ``port`` (Linux)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hexport = local.rpartition(":")
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    found.add(
                        socket.inet_ntop(
                            socket.AF_INET if len(address) == 8 else socket.AF_INET6,
                            bytes.fromhex(address)[::-1]
                            if len(address) == 8
                            else b"".join(
                                bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, 32, 8)
                            ),
                        )
                    )
    return found


def test_a_relay_serves_its_delivery_counts_on_its_metrics_port() -> None:
    declare_all()
    declare_failing()
    port = free_port()
    args = ["--metrics-port", str(port)]
    env = {"DDE_RECEIVERS": "with_failing", "DDE_SETTINGS_JSON": QUICK}
    process = start_child("relay", *args, "--lane", "default", "--lane", "mail", env=env)
    try:
        wait_for(serving(port, process), 30, "the metrics port to answer")
        assert listening_on(port) == {"127.0.0.1"}  # loopback unless told otherwise
        got = scrape(port)
        assert count(got, RECORDER_KEY, "default", "succeeded") == 0  # declared: from zero
        assert got["domain_events_owed", (("lane", "default"), ("receiver", RECORDER_KEY))] == 0

        fire_orders(0, 3)
        wait_for(
            lambda: (
                count(scrape(port), FAILING_KEY, "mail", "dead") == 3
                and count(scrape(port), RECORDER_KEY, "default", "succeeded") == 3
            ),
            30,
            "three successes and three dead letters",
        )
        got = scrape(port)
        rows = DeliveryRecord.objects.filter(receiver_key=RECORDER_KEY)
        assert rows.filter(status=DeliveryStatus.SUCCEEDED).count() == 3
        assert count(got, FAILING_KEY, "mail", "failed") == 3  # one failure each, then dead
        assert count(got, RECORDER_KEY, "default", "failed") == 0
        assert observed(got, "duration", RECORDER_KEY, "default") == 3
        assert observed(got, "lag", RECORDER_KEY, "default") == 3
        assert observed(got, "duration", FAILING_KEY, "mail") == 6  # every attempt ran
        assert observed(got, "lag", FAILING_KEY, "mail") == 6
        dead = DeliveryRecord.objects.filter(receiver_key=FAILING_KEY, status=DeliveryStatus.DEAD)
        gauge = ("domain_events_dead", (("lane", "mail"), ("receiver", FAILING_KEY)))
        # The gauges are read from the database at most every SCRAPE_CACHE_SECONDS.
        wait_for(lambda: scrape(port).get(gauge) == 3, 30, "the dead gauge to read 3")
        assert dead.count() == 3

        fire_orders(3, 2)  # more fires: the counters move
        wait_for(
            lambda: count(scrape(port), RECORDER_KEY, "default", "succeeded") == 5,
            30,
            "two more successes",
        )
        got = scrape(port)
        assert observed(got, "duration", RECORDER_KEY, "default") == 5
        bucket = (("lane", "default"), ("le", "+Inf"), ("receiver", RECORDER_KEY))
        assert got["domain_events_delivery_duration_seconds_bucket", bucket] == 5
    finally:
        stop(process)


@needs_several_relays
def test_relays_sharing_a_multiprocess_dir_are_served_together(tmp_path: Path) -> None:
    declare_all()
    port = free_port()
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DDE_SLOW_SECONDS": "0.02",
        "DDE_SETTINGS_JSON": QUICK,
    }
    batches = ["--batch-size", "2"]
    served = start_child(
        "relay", *batches, "--worker-id", "r1", "--metrics-port", str(port), env=env
    )
    counting = start_child("relay", *batches, "--worker-id", "r2", "--record-metrics", env=env)
    try:
        wait_for(serving(port, served), 30, "the metrics port to answer")
        fire_orders(0, 60)
        wait_for(
            lambda: count(scrape(port), RECORDER_KEY, "default", "succeeded") == 60,
            60,
            "sixty successes, counted by both relays",
        )
        rows = DeliveryRecord.objects.filter(receiver_key=RECORDER_KEY)
        assert set(rows.values_list("claimed_by", flat=True)) == {"r1", "r2"}
        stop(counting)
        got = scrape(port)  # a stopped relay's counts stay in its files
        assert count(got, RECORDER_KEY, "default", "succeeded") == 60
        assert observed(got, "duration", RECORDER_KEY, "default") == 60
        assert observed(got, "lag", RECORDER_KEY, "default") == 60
    finally:
        if counting.poll() is None:
            stop(counting)
        stop(served)
