"""The machine's real brokers for the broker tests: URLs, a destination per test, and
readers that take back what reached a destination (the tests never trust the rows)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from collections.abc import Callable
from contextlib import suppress
from urllib.parse import urlsplit

import pytest

from django_domain_events.contrib.brokers import envelope
from django_domain_events.contrib.brokers.config import nats_stream_name
from django_domain_events.contrib.brokers.envelope import Envelope

URLS = {
    "rabbitmq": os.environ.get("DDE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    "nats": os.environ.get("DDE_NATS_URL", "nats://127.0.0.1:4222"),
    "redis": os.environ.get("DDE_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
TRANSPORTS = tuple(URLS)
#: Each way a consumer may run: RabbitMQ in the process; NATS and Redis with their client in
#: a child process (CONSUMER_PROCESS, the default) or on the process's broker loop.
CONSUMER_MODES = (
    ("rabbitmq", None),
    ("nats", True),
    ("nats", False),
    ("redis", True),
    ("redis", False),
)


def consumer_mode_id(mode: tuple[str, bool | None]) -> str:
    transport, process = mode
    return transport if process is None else f"{transport}-{'child' if process else 'thread'}"


def broker_entry(url: str, process: bool | None) -> dict[str, object]:
    """A ``BROKERS`` entry for ``url``, with ``CONSUMER_PROCESS`` when it is not None."""
    return {"URL": url} if process is None else {"URL": url, "CONSUMER_PROCESS": process}


def reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 0), timeout=1):
            return True
    except OSError:
        return False


def require(transport: str, url: str | None = None) -> str:
    """The broker's URL; a skip when it is down, a failure under CI=true."""
    url = url or URLS[transport]
    if not reachable(url):
        message = f"{transport} is not reachable at {url}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: the broker tests are required under CI=true")
        pytest.skip(message)
    return url


def new_destination() -> str:
    return f"dde-test-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------ preparing


def prepare(transport: str, url: str, to: str) -> None:
    """What a consumer would have made before the publisher ran: a RabbitMQ queue bound to
    the exchange (else RabbitMQ drops what it confirms); nothing for NATS and Redis."""
    if transport == "rabbitmq":
        asyncio.run(_rabbit_bind(url, to))


async def _rabbit_bind(url: str, to: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(to, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(f"{to}.all", durable=True)
        await queue.bind(exchange, "#")


# ------------------------------------------------------------------ reading back


def read(transport: str, url: str, to: str) -> list[tuple[str, Envelope]]:
    """Every message at the destination, in order: (routing key or subject, envelope)."""
    readers = {"rabbitmq": _rabbit_read, "nats": _nats_read, "redis": _redis_read}
    return asyncio.run(readers[transport](url, to))


async def _rabbit_read(url: str, to: str) -> list[tuple[str, Envelope]]:
    import aio_pika

    found = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        queue = await channel.declare_queue(f"{to}.all", durable=True, passive=True)
        while True:
            message = await queue.get(no_ack=True, fail=False, timeout=5)
            if message is None:
                return found
            env = envelope.from_amqp(
                message.headers,
                message.body,
                content_type=message.content_type,
                message_id=message.message_id,
            )
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            found.append((message.routing_key or "", env))


async def _nats_read(url: str, to: str) -> list[tuple[str, Envelope]]:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    found = []
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{to}.>", stream=nats_stream_name(to))
        while True:
            try:
                batch = await sub.fetch(1000, timeout=1)
            except (NatsTimeout, TimeoutError):
                return found
            for msg in batch:
                found.append((msg.subject, envelope.from_nats(msg.headers, msg.data)))
                await msg.ack()
    finally:
        await nc.close()


async def _redis_read(url: str, to: str) -> list[tuple[str, Envelope]]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        entries = await client.xrange(to, "-", "+")
    finally:
        await client.aclose()
    return [(to, envelope.from_redis(fields)) for _, fields in entries]


# ------------------------------------------------------------------ cleaning up


def remove(transport: str, url: str, to: str) -> None:
    """Delete the destination (and the test's queue), so the brokers do not fill up."""
    with suppress(Exception):
        asyncio.run(_removers[transport](url, to))


async def _rabbit_remove(url: str, to: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        with suppress(Exception):
            await channel.queue_delete(f"{to}.all")
        channel = await connection.channel()
        await channel.exchange_delete(to)


async def _nats_remove(url: str, to: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(nats_stream_name(to))
    finally:
        await nc.close()


async def _redis_remove(url: str, to: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        await client.delete(to)
    finally:
        await client.aclose()


_removers = {"rabbitmq": _rabbit_remove, "nats": _nats_remove, "redis": _redis_remove}


# ------------------------------------------------------------------ relaying


def relay_until_published(
    count: int, each: Callable[[int], None] = lambda done: None, batch_size: int = 100
) -> int:
    """Run a relay in this thread until ``count`` rows are acknowledged (two minutes at
    most), calling ``each(acknowledged so far)`` after every acknowledgement; the count."""
    from django_domain_events import signals
    from django_domain_events.delivery.relay import run_relay

    done, give_up = [0], threading.Event()

    def acknowledged(**kwargs: object) -> None:
        done[0] += 1
        each(done[0])

    timer = threading.Timer(120, give_up.set)
    timer.start()
    signals.delivery_succeeded.connect(acknowledged, weak=False)
    try:
        run_relay(
            batch_size=batch_size, prune=None, stop=lambda: done[0] >= count or give_up.is_set()
        )
    finally:
        signals.delivery_succeeded.disconnect(acknowledged)
        timer.cancel()
    return done[0]
