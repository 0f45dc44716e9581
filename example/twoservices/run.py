"""Two services talking through a broker: ``make demo-brokers``.

Service A ("shop", settings_a, shop.sqlite3) fires three orders and its relay publishes
them; service B ("billing", settings_b, billing.sqlite3) consumes them into its inbox and
its relay opens an invoice per order. Then the shop replays the orders (the same
CloudEvents ids again) and billing records nothing new. The first broker reachable on
this machine is used (Redis 6379, NATS 4222, RabbitMQ 5672), or DDE_DEMO_BROKER_URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANDIDATES = [
    ("redis://127.0.0.1:6379/0", 6379),
    ("nats://127.0.0.1:4222", 4222),
    ("amqp://guest:guest@127.0.0.1:5672/%2F", 5672),
]


def reachable_broker() -> str | None:
    if os.environ.get("DDE_DEMO_BROKER_URL"):
        return os.environ["DDE_DEMO_BROKER_URL"]
    for url, port in CANDIDATES:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            continue
        return url
    return None


def service(name: str, *args: str, code: str | None = None) -> str:
    """Run a manage.py command (or ``code``) as service ``name`` ("a" or "b")."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": f"twoservices.settings_{name}"}
    env["PYTHONPATH"] = f"{HERE.parent}{os.pathsep}{env.get('PYTHONPATH', '')}"
    if code is not None:
        command = [sys.executable, "-c", "import django; django.setup()\n" + code]
    else:
        command = [sys.executable, "-m", "django", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE.parent)
    if done.returncode != 0:
        raise SystemExit(f"service {name}: {' '.join(args) or 'code'} failed:\n{done.stderr}")
    return done.stdout.rstrip()


FIRE = """
from django.db import transaction
from django_domain_events import fire
from twoservices.shop_a.events import OrderPlaced
with transaction.atomic():
    for n, cents in ((1, 1250), (2, 990), (3, 4200)):
        fire(OrderPlaced(order_id=n, total_cents=cents))
"""
SHOW = """
from django_domain_events.models import EventRecord
from twoservices.billing_b.models import Invoice
for e in EventRecord.objects.order_by("pk"):
    print(f"  event #{e.pk} {e.name} from {e.actor_label!r}, message {e.received['id']!r}")
for i in Invoice.objects.order_by("order_id"):
    print(f"  {i}: {i.total_cents / 100:.2f}")
"""


def main() -> None:
    url = reachable_broker()
    if url is None:
        print("No broker reachable (Redis 6379, NATS 4222, RabbitMQ 5672): nothing to show.")
        return
    os.environ["DDE_DEMO_BROKER_URL"] = url
    os.environ["DDE_DEMO_DESTINATION"] = f"orders-demo-{uuid.uuid4().hex[:8]}"
    print(f"Broker: {url}; destination {os.environ['DDE_DEMO_DESTINATION']}")
    for name in ("shop", "billing"):
        (HERE / f"{name}.sqlite3").unlink(missing_ok=True)
    service("a", "migrate", "--run-syncdb", "-v", "0")
    service("b", "migrate", "--run-syncdb", "-v", "0")
    print("billing: " + service("b", "consume_events", "--once"))  # declares what it needs
    service("a", code=FIRE)
    print("shop fired 3 orders; " + service("a", "deliver_events", "--once"))
    print("billing: " + service("b", "consume_events", "--once"))
    print("billing: " + service("b", "deliver_events", "--once"))
    print(service("b", code=SHOW))
    print("shop replays its 3 orders: " + service("a", "replay_events", "1", "2", "3"))
    print("shop: " + service("a", "deliver_events", "--once"))
    print("billing: " + service("b", "consume_events", "--once"))
    if url.startswith("nats"):
        print("  (JetStream itself drops a resend within its duplicate window: Nats-Msg-Id)")
    print(service("b", code=SHOW))
    service("a", code=CLEANUP)


# The destination is this run's own: remove it from the (possibly shared) broker.
CLEANUP = """
import asyncio
from django.conf import settings
from django_domain_events.contrib.brokers.config import broker, nats_stream_name

async def drop():
    config, to = broker("default"), settings.DESTINATION
    if config.transport == "redis":
        import redis.asyncio as aioredis
        client = aioredis.Redis.from_url(config.url)
        await client.delete(to)
        await client.aclose()
    elif config.transport == "nats":
        import nats
        nc = await nats.connect(config.url)
        await nc.jetstream().delete_stream(nats_stream_name(to))
        await nc.close()
    else:
        import aio_pika
        connection = await aio_pika.connect(config.url)
        channel = await connection.channel()
        await channel.queue_delete(f"billing.{to}")
        await channel.exchange_delete(to)
        await connection.close()

asyncio.run(drop())
"""


if __name__ == "__main__":
    main()
