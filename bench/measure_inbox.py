"""Section 15: messages recorded per second by one consumer, per broker, against a raw
consume-and-insert loop in the same run (see bench/README.md).

    .venv/bin/python bench/measure_inbox.py [--messages N] [--brokers rabbitmq,nats,redis]

For each reachable broker of this machine (RabbitMQ 5672, NATS 4222, Redis 6379; the
destinations are the run's own, nothing else on them is touched): N messages in the
wire format are published twice, to two destinations, by the publisher's transport.
``run_consumer`` then records the first copy through the inbox (decode,
dedupe, event row and one delivery row per message, batches of 100 in one transaction,
then one acknowledgement), and a raw loop consumes the second copy with the same client
and batch size, inserting each message into a plain table with ``ON CONFLICT DO NOTHING``
on (source, id) in one transaction per batch, then acknowledging. The two alternate
twice; the better round of each counts. NATS and Redis are consumed in both modes in the
same run (``CONSUMER_PROCESS`` True, the client in a child process, and False, on the
process's broker loop), each with this process's CPU per message and its child's
(its start included). Targets: >= 2,000 msg/s from RabbitMQ and NATS into PostgreSQL,
and >= 0.5 of the raw loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

URLS = {
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672/%2F", 5672),
    "nats": ("nats://127.0.0.1:4222", 4222),
    "redis": ("redis://127.0.0.1:6379/0", 6379),
}
#: The consumer modes measured per broker: broker name in BROKERS -> CONSUMER_PROCESS
#: (None: the option does not apply). "nats" and "redis" are the default, a child process.
MODES = {
    "rabbitmq": {"rabbitmq": None},
    "nats": {"nats": True, "nats-thread": False},
    "redis": {"redis": True, "redis-thread": False},
}
os.environ["DDE_BENCH_SETTINGS_JSON"] = json.dumps(
    {
        "BROKERS": {
            name: {"URL": URLS[kind][0]}
            if process is None
            else {"URL": URLS[kind][0], "CONSUMER_PROCESS": process}
            for kind, modes in MODES.items()
            for name, process in modes.items()
        }
    }
)
TARGET_RATE = 2_000.0  # messages/s from RabbitMQ and NATS
TARGET_RATIO = 0.5  # ours over the raw loop
BATCH = 100  # messages per transaction, both loops (subscribe()'s default); --batch
RAW_TABLE = "bench_raw_inbox"


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def publish(kind: str, to: str, count: int) -> None:
    from django_domain_events.contrib.brokers import envelope
    from django_domain_events.contrib.brokers.config import broker
    from django_domain_events.contrib.brokers.transport import Outgoing, make_transport, run

    transport = make_transport(broker(kind))
    run(transport.connect(), 30)
    try:
        for start in range(0, count, 1000):
            batch = [
                Outgoing(
                    to,
                    envelope.build(
                        id=f"{to}.{n}",
                        source="bench-a",
                        type="bench.Tick",
                        data=json.dumps({"n": n}).encode(),
                        payloadversion="1",
                    ),
                )
                for n in range(start, min(start + 1000, count))
            ]
            results = run(transport.publish(batch), 120)
            assert all(r is None for r in results), results[:3]
    finally:
        run(transport.close(), 10)


def ours(
    kind: str, name_of_broker: str, source: str, count: int
) -> tuple[float, float, float, float]:
    """msg/s through ``run_consumer`` from the broker ``name_of_broker`` (a mode of
    ``kind``): from the start (connecting, and starting the child, included) and from the
    first batch recorded on; and the CPU seconds per message of this process and of its
    consumer children (the child process of CONSUMER_PROCESS, reaped when it stops)."""
    import resource

    from django_domain_events.contrib.brokers import subscribe
    from django_domain_events.contrib.brokers.consuming import run_consumer
    from django_domain_events.inbox import forget
    from django_domain_events.models import EventRecord

    name = f"{source}-in"
    subscribe(source, broker=name_of_broker, name=name, batch_size=BATCH)
    try:
        first = run_consumer(subscription=name, once=True, wait=0.5)  # declares; nothing yet
        assert not first, f"{kind}: {source} was not new: {first}"
        publish(kind, source, count)
        # Timed until the last message is recorded, as the raw loop is (it knows the
        # count): --once would add its closing wait for an empty fetch to the figure.
        stop, done, finished, first = threading.Event(), Counter[str](), [0.0], [0.0, 0]

        def on_batch(_: object, counts: Counter[str]) -> None:
            done.update(counts)
            if not first[1]:  # the consumer is connected (its child started) and going
                first[:] = [time.perf_counter(), sum(done.values())]
            if sum(done.values()) >= count:
                finished[0] = time.perf_counter()
                stop.set()

        give_up = threading.Timer(600, stop.set)  # a consumer that never finishes
        give_up.start()
        cpu, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        try:
            counts = run_consumer(subscription=name, stop=stop, wait=0.5, on_batch=on_batch)
        finally:
            give_up.cancel()
        seconds = finished[0] - started
        cpu = time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    finally:
        forget(name)
    recorded = EventRecord.objects.filter(received__subscription=name).count()
    if counts["recorded"] != count or recorded != count:
        raise SystemExit(f"{kind}: recorded {counts} ({recorded} rows), expected {count}")
    steady = (count - first[1]) / (finished[0] - first[0])
    return count / seconds, steady, cpu / count, child_cpu / count


def raw(kind: str, source: str, count: int) -> float:
    """The same messages through the client alone: fetch, insert, commit, acknowledge."""
    import psycopg

    from bench import settings

    db: dict[str, Any] = settings.DATABASES["default"]
    pg = psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=False
    )
    pg.execute(
        f"CREATE TABLE IF NOT EXISTS {RAW_TABLE} (id bigserial PRIMARY KEY, source text, "
        "msg_id text, name text, payload jsonb, UNIQUE (source, msg_id))"
    )
    pg.execute(f"TRUNCATE {RAW_TABLE}")
    pg.commit()
    loop = {"rabbitmq": _raw_rabbitmq, "nats": _raw_nats, "redis": _raw_redis}[kind]
    try:
        return asyncio.run(loop(pg, source, count))
    finally:
        pg.close()


def _insert(pg: Any, rows: list[tuple[str, str, str, bytes]]) -> None:
    with pg.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {RAW_TABLE} (source, msg_id, name, payload) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (source, msg_id) DO NOTHING",
            [(s, i, n, p.decode()) for s, i, n, p in rows],
        )
    pg.commit()


async def _raw_rabbitmq(pg: Any, source: str, count: int) -> float:
    import aio_pika

    connection = await aio_pika.connect(URLS["rabbitmq"][0])
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=4 * BATCH)  # as the inbox consumer
    exchange = await channel.declare_exchange(source, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(f"{source}-raw", durable=True)
    await queue.bind(exchange, routing_key="#")
    await asyncio.to_thread(publish, "rabbitmq", source, count)
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    await queue.consume(inbox.put)
    done, started = 0, time.perf_counter()
    while done < count:
        batch = [await inbox.get()]
        while len(batch) < BATCH and not inbox.empty():
            batch.append(inbox.get_nowait())
        _insert(
            pg,
            [(m.headers["cloudEvents_source"], m.message_id, m.routing_key, m.body) for m in batch],
        )
        await batch[-1].ack(multiple=True)
        done += len(batch)
    seconds = time.perf_counter() - started
    await queue.delete(if_unused=False, if_empty=False)
    await connection.close()
    return count / seconds


async def _raw_nats(pg: Any, source: str, count: int) -> float:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    from django_domain_events.contrib.brokers.config import nats_stream_name

    nc = await nats.connect(URLS["nats"][0])
    js = nc.jetstream()
    stream = nats_stream_name(source)
    await js.add_stream(name=stream, subjects=[f"{source}.>"])
    await asyncio.to_thread(publish, "nats", source, count)
    pull = await js.pull_subscribe(
        f"{source}.>",
        durable="raw",
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
    )
    done, started = 0, time.perf_counter()
    while done < count:
        batch = await pull.fetch(batch=BATCH, timeout=5)
        _insert(
            pg, [(m.headers["ce-source"], m.headers["ce-id"], m.subject, m.data) for m in batch]
        )
        for message in batch:
            await message.ack()
        await nc.flush()
        done += len(batch)
    seconds = time.perf_counter() - started
    await js.delete_stream(stream)
    await nc.close()
    return count / seconds


async def _raw_redis(pg: Any, source: str, count: int) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(URLS["redis"][0])
    await client.xgroup_create(source, "raw", id="0", mkstream=True)
    await asyncio.to_thread(publish, "redis", source, count)
    done, started = 0, time.perf_counter()
    while done < count:
        reply = await client.xreadgroup("raw", "raw-1", {source: ">"}, count=BATCH, block=5000)
        entries = [entry for _, found in reply for entry in found]
        _insert(
            pg,
            [
                (f[b"ce-source"].decode(), f[b"ce-id"].decode(), f[b"ce-type"].decode(), f[b"data"])
                for _, f in entries
            ],
        )
        await client.xack(source, "raw", *[entry_id for entry_id, _ in entries])
        done += len(entries)
    seconds = time.perf_counter() - started
    await client.delete(source)
    await client.aclose()
    return count / seconds


def cleanup(kind: str, source: str) -> None:
    """Drop what the run declared on the shared broker: its queue, stream or key."""

    async def drop() -> None:
        if kind == "rabbitmq":
            import aio_pika

            connection = await aio_pika.connect(URLS["rabbitmq"][0])
            channel = await connection.channel()
            await channel.queue_delete(f"{source}-in")
            await channel.exchange_delete(source)
            await connection.close()
        elif kind == "nats":
            import nats

            from django_domain_events.contrib.brokers.config import nats_stream_name

            nc = await nats.connect(URLS["nats"][0])
            await nc.jetstream().delete_stream(nats_stream_name(source))
            await nc.close()
        else:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(URLS["redis"][0])
            await client.delete(source)
            await client.aclose()

    try:
        asyncio.run(drop())
    except Exception as error:  # the figures stand; say what was left behind
        print(f"  (cleanup of {source} on {kind} failed: {error})")


def main() -> None:
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--brokers", default="rabbitmq,nats,redis")
    parser.add_argument("--batch", type=int, default=BATCH, help="messages per transaction")
    parser.add_argument(
        "--prefix", default="bench", help="start of the run's queue, stream and key names"
    )
    args = parser.parse_args()
    BATCH = args.batch
    import django

    django.setup()
    from bench.events import Tick
    from bench.run import ensure_database, rebuild_schema
    from django_domain_events import receiver

    ensure_database()
    rebuild_schema()
    receiver(Tick, key="bench.inbox_noop")(lambda evt: None)
    print(f"== 15. consuming: {args.messages:,} messages per round, batches of {BATCH}")
    summary = []
    for kind in args.brokers.split(","):
        if not reachable(URLS[kind][1]):
            print(f"{kind}: not reachable on port {URLS[kind][1]}, skipped")
            continue
        modes = MODES[kind]
        best = dict.fromkeys(modes, (0.0, 0.0, 0.0, 0.0))
        best_raw = 0.0
        for _ in range(2):
            for mode in modes:
                source = f"{args.prefix}-{uuid.uuid4().hex[:8]}"
                try:
                    best[mode] = max(best[mode], ours(kind, mode, source, args.messages))
                finally:
                    cleanup(kind, source)
            best_raw = max(
                best_raw, raw(kind, f"{args.prefix}-raw-{uuid.uuid4().hex[:8]}", args.messages)
            )
        print(f"{kind + ': raw consume-and-insert, msg/s':<44} {best_raw:>10,.0f}")
        for mode, process in modes.items():
            best_ours, steady, parent_cpu, child_cpu = best[mode]
            label = kind if process is None else f"{kind} CONSUMER_PROCESS={process}"
            ratio = best_ours / best_raw
            rate = "-" if kind == "redis" else ("PASS" if best_ours >= TARGET_RATE else "MISS")
            share = "PASS" if ratio >= TARGET_RATIO else "MISS"
            print(f"{label + ': consume_events, msg/s':<44} {best_ours:>10,.0f}  >= 2,000: {rate}")
            print(f"{label + ': ratio ours/raw':<44} {ratio:>10.3f}  >= 0.5: {share}")
            print(f"{label + ': from the first batch, ratio':<44} {steady / best_raw:>10.3f}")
            print(
                f"{label + ': CPU us/msg parent, child':<44} "
                f"{parent_cpu * 1e6:>10.1f} {child_cpu * 1e6:>6.1f}"
            )
            summary.append((label, best_ours, best_raw, ratio, f"rate {rate}, ratio {share}"))
    print("\nbroker (mode)                    ours msg/s   raw msg/s   ratio  targets")
    for label, mine, theirs, ratio, verdict in summary:
        print(f"{label:<31} {mine:>11,.0f} {theirs:>11,.0f} {ratio:>7.3f}  {verdict}")


if __name__ == "__main__":
    main()
