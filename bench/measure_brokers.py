"""Section 14: events published per second from one relay to each broker, against a raw
client loop publishing the same messages with confirms, batched the same way.

Ours: ``run_relay(once=True, batch_size=B)`` over N owed rows of ``publish(Tick, to=...)``,
the loop of ``manage.py deliver_events`` on the main thread as there (claim a batch by
row lock, build the CloudEvents, send them with every confirm outstanding, await them,
acknowledge the batch in one ``UPDATE``; for NATS and Redis the client runs in the
relay's child process, ``PUBLISHER_PROCESS``'s default), and on one broker the same
with the usual claim, which stamps every row claimed first. Raw: the same
envelopes, built beforehand, sent by the same client library in batches of B, each
batch's confirms awaited before the next: no database at all. Brokers are the machine's
(``DDE_AMQP_URL``, ``DDE_NATS_URL``, ``DDE_REDIS_URL``); a broker that is not reachable
is reported as skipped. Each measurement uses a destination of its own, removed after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.db import connection, transaction
from django.test import override_settings

from bench.events import Tick
from bench.measure import reset_tables, settle_database
from django_domain_events import clock, deliver_pending, fire, registry, run_relay
from django_domain_events.contrib.brokers import envelope, publish
from django_domain_events.contrib.brokers.config import nats_stream_name
from django_domain_events.contrib.brokers.links import close_all
from django_domain_events.models import DeliveryRecord

URLS = {
    "rabbitmq": os.environ.get("DDE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    "nats": os.environ.get("DDE_NATS_URL", "nats://127.0.0.1:4222"),
    "redis": os.environ.get("DDE_REDIS_URL", "redis://127.0.0.1:6379/0"),
}


def reachable(transport: str) -> bool:
    parts = urlsplit(URLS[transport])
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=1):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Published:
    """One relay's run: published rows/s, and PostgreSQL's write-ahead log per row (what
    the database wrote for it: its row versions and index entries)."""

    rate: float
    wal_per_row: float | None


def ours(transport: str, events: int, batch: int, *, by_lock: bool = True) -> Published:
    """Published rows/s of one relay (``run_relay(once=True)``) over ``events`` owed rows;
    ``by_lock=False`` claims them the usual way (``delivery/locked.py`` off)."""
    from django_domain_events.delivery import passes

    reset_tables()
    to = f"dde-bench-{uuid.uuid4().hex[:10]}"
    key = f"brokers:default:{to}:{registry.event_for_class(Tick).name}"  # type: ignore[union-attr]
    setting = {"BROKERS": {"default": {"URL": URLS[transport]}}}
    try:
        with override_settings(DJANGO_DOMAIN_EVENTS=setting):
            publish(Tick, to=to)
            _prepare(transport, to)
            for start in range(0, events, 1000):
                with transaction.atomic():
                    for n in range(start, min(events, start + 1000)):
                        fire(Tick(n=n))
            settle_database()
            with _claims(passes, by_lock):
                deliver_pending(limit=batch, batch_size=batch)  # connect and warm up
                wal = _wal_position()
                began = time.perf_counter()
                run_relay(once=True, batch_size=batch, prune=None)
                elapsed = time.perf_counter() - began
                written = _wal_since(wal)
            close_all()
        sent = DeliveryRecord.objects.filter(receiver_key=key, status="succeeded").count()
        if sent != events:
            raise RuntimeError(f"{transport}: {sent} of {events} rows published")
        rows = events - batch
        return Published(rows / elapsed, written / rows if written is not None else None)
    finally:
        registry.forget(key)
        _remove(transport, to)


@contextlib.contextmanager
def _claims(passes: Any, by_lock: bool) -> Iterator[None]:
    """The relay's claims by row lock, or (``by_lock=False``) the usual claims only."""
    if by_lock:
        yield
        return
    lockable = passes.lockable_keys
    passes.lockable_keys = lambda lane: ()
    try:
        yield
    finally:
        passes.lockable_keys = lockable


def _wal_position() -> str | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        return str(cursor.fetchone()[0])


def _wal_since(position: str | None) -> float | None:
    """Bytes of write-ahead log since ``position`` (the whole server's: nothing else runs)."""
    if position is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [position])
        return float(cursor.fetchone()[0])


def phases(events: int, batch: int) -> dict[str, float]:
    """Milliseconds per batch of each step of the relay's publish path that is not the
    broker's, timed one after another (the fastest of the batches): where ours goes."""
    from django_domain_events import clock
    from django_domain_events.contrib.brokers import publishing
    from django_domain_events.delivery.lease import lane_lease
    from django_domain_events.delivery.locked import LockedClaims

    reset_tables()
    to = f"dde-bench-{uuid.uuid4().hex[:10]}"
    key = f"brokers:default:{to}:{registry.event_for_class(Tick).name}"  # type: ignore[union-attr]
    times: dict[str, list[float]] = {}
    try:
        with override_settings(
            DJANGO_DOMAIN_EVENTS={"BROKERS": {"default": {"URL": URLS["redis"]}}}
        ):
            publish(Tick, to=to)
            with transaction.atomic():
                for n in range(events):
                    fire(Tick(n=n))
            settle_database()
            locks, source = LockedClaims(), "bench"
            while True:
                began = time.perf_counter()
                locked = locks.take(
                    0,
                    worker_id="phases",
                    keys=[key],
                    now=clock.now(),
                    lease=lane_lease(None),
                    limit=batch,
                    exclude=(),
                    ignore_backoff=False,
                )
                if not locked.claims:
                    locks.close()
                    break
                marks = [("claim (by row lock)", began, time.perf_counter())]
                start = time.perf_counter()
                func: Any = registry.receiver(key).func  # type: ignore[union-attr]
                for claim in locked.claims:
                    publishing.make_envelope(func, None, claim, source)
                marks.append(("envelopes", start, time.perf_counter()))
                start = time.perf_counter()
                with locked.connection.cursor() as cursor:
                    cursor.execute(*locked._succeeded_sql(locked.claims))
                locked.connection.commit()
                marks.append(("acknowledge", start, time.perf_counter()))
                for name, start, end in marks:
                    times.setdefault(name, []).append((end - start) * 1000)
    finally:
        registry.forget(key)
    return {name: min(values) for name, values in times.items()}


def raw(transport: str, events: int, batch: int) -> float:
    """Messages/s of the client library alone, the same envelopes, batches and confirms."""
    to = f"dde-bench-{uuid.uuid4().hex[:10]}"
    occurred = clock.now()
    messages = [  # the attributes ours carries for a Tick, ``time`` included
        envelope.build(
            id=f"{n}.{n}",
            source="bench",
            type="bench.Tick",
            data=f'{{"n":{n}}}'.encode(),
            time=occurred,
            payloadversion=1,
            correlationid=uuid.uuid4().hex,
        )
        for n in range(events)
    ]
    loops = {"rabbitmq": _raw_rabbit, "nats": _raw_nats, "redis": _raw_redis}
    try:
        _prepare(transport, to)
        return asyncio.run(loops[transport](to, messages, batch))
    finally:
        _remove(transport, to)


def _batches(messages: Sequence[envelope.Envelope], batch: int) -> list[Any]:
    return [messages[i : i + batch] for i in range(0, len(messages), batch)]


async def _raw_rabbit(to: str, messages: Sequence[envelope.Envelope], batch: int) -> float:
    import aio_pika

    connection = await aio_pika.connect(URLS["rabbitmq"])
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(to, aio_pika.ExchangeType.TOPIC, durable=True)

        async def send(env: envelope.Envelope) -> Any:
            amqp = envelope.to_amqp(env)
            message = aio_pika.Message(
                amqp.body,
                headers=dict(amqp.headers),
                content_type=amqp.content_type,
                message_id=amqp.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            return await exchange.publish(message, routing_key=env.type, mandatory=True)

        batches = _batches(messages, batch)
        await asyncio.gather(*(send(env) for env in batches[0]))  # warm up
        began = time.perf_counter()
        for chunk in batches[1:]:
            await asyncio.gather(*(send(env) for env in chunk))
        return (len(messages) - len(batches[0])) / (time.perf_counter() - began)


async def _raw_nats(to: str, messages: Sequence[envelope.Envelope], batch: int) -> float:
    import nats

    nc = await nats.connect(URLS["nats"])
    try:
        js = nc.jetstream()
        await js.add_stream(name=nats_stream_name(to), subjects=[f"{to}.>"])

        async def send(chunk: Sequence[envelope.Envelope]) -> None:
            futures = [
                await js.publish_async(f"{to}.{env.type}", env.data, headers=envelope.to_nats(env))
                for env in chunk
            ]
            await asyncio.gather(*futures)

        batches = _batches(messages, batch)
        await send(batches[0])
        began = time.perf_counter()
        for chunk in batches[1:]:
            await send(chunk)
        return (len(messages) - len(batches[0])) / (time.perf_counter() - began)
    finally:
        await nc.close()


async def _raw_redis(to: str, messages: Sequence[envelope.Envelope], batch: int) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(URLS["redis"])
    try:

        async def send(chunk: Sequence[envelope.Envelope]) -> None:
            pipe = client.pipeline(transaction=False)
            for env in chunk:
                pipe.xadd(to, envelope.to_redis(env))  # type: ignore[arg-type]
            await pipe.execute()

        batches = _batches(messages, batch)
        await send(batches[0])
        began = time.perf_counter()
        for chunk in batches[1:]:
            await send(chunk)
        return (len(messages) - len(batches[0])) / (time.perf_counter() - began)
    finally:
        await client.aclose()


def _prepare(transport: str, to: str) -> None:
    """A queue bound to the exchange, as a consumer would have (RabbitMQ only)."""
    if transport == "rabbitmq":
        asyncio.run(_rabbit_bind(to))


async def _rabbit_bind(to: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(URLS["rabbitmq"])
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(to, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(f"{to}.all", durable=True)
        await queue.bind(exchange, "#")


def _remove(transport: str, to: str) -> None:
    try:
        asyncio.run(_removers[transport](to))
    except Exception as error:  # a leftover destination is not a failed measurement
        print(f"(could not remove {transport} destination {to}: {error})")


async def _remove_rabbit(to: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(URLS["rabbitmq"])
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(f"{to}.all", if_unused=False, if_empty=False)
        await channel.exchange_delete(to)


async def _remove_nats(to: str) -> None:
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(URLS["nats"])
    try:
        with contextlib.suppress(NotFoundError):
            await nc.jetstream().delete_stream(nats_stream_name(to))
    finally:
        await nc.close()


async def _remove_redis(to: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(URLS["redis"])
    try:
        await client.delete(to)
    finally:
        await client.aclose()


_removers = {"rabbitmq": _remove_rabbit, "nats": _remove_nats, "redis": _remove_redis}
