"""The consumer loop: fetch a batch, record it in one transaction, then acknowledge it.

``run_consumer`` is what ``manage.py consume_events`` runs, and what a process embeds
(as ``run_relay`` is for delivery). Each subscription has its transport's ``Consumer``
(``rabbitmq.py``, ``nats.py``, ``redis.py``), whose client runs on the process's broker
loop (``transport.loop``) or, for NATS and Redis, in a child process of its own
(``consumer_process.py``, so its parsing holds no GIL of ours); recording runs here, on
the caller's thread, with Django's database connection. Nothing is acknowledged before
the batch committed: a database error hands the batch back unacknowledged (the broker
delivers it again), and a crash between commit and acknowledgement only makes the
broker deliver again what the inbox then finds recorded.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from ...inbox import Message, Subscription, record_batch, subscriptions
from ...models import database_alias
from .config import BrokerConfig, broker, import_client
from .transport import Fetcher, run, submit

logger = logging.getLogger("django_domain_events.consume")

_MODULES = {"rabbitmq": ".rabbitmq", "nats": ".nats", "redis": ".redis"}
#: How long a consumer waits after a broker or database outage, doubling up to the cap.
_BACKOFF_START, _BACKOFF_CAP = 0.25, 2.0
#: How long a stopping consumer waits for the batch it was fetching ahead, to release it.
_AHEAD_SECONDS = 5.0


#: With ``once``, a subscription whose broker or database failed this often in a row stops it.
_ONCE_FAILURES = 5


class ConsumerHalted(Exception):
    """``run_consumer(once=True)`` could not drain a subscription: its broker or the
    database kept failing."""


@dataclass(frozen=True)
class Fetched:
    """One message fetched from the broker, with what its transport acknowledges it by."""

    message: Message
    token: Any


class Consumer(Protocol):
    """One subscription's connection to its broker, kept open across batches."""

    async def connect(self) -> None:
        """Connect, declaring what is missing (queue and binding, stream and durable
        consumer, consumer group); ``BrokerDown`` when the broker cannot be reached."""

    async def fetch(self, limit: int, wait: float) -> list[Fetched]:
        """Up to ``limit`` messages, waiting at most ``wait`` seconds for the first."""

    async def ack(self, batch: Sequence[Fetched]) -> None:
        """Acknowledge every message of ``batch`` (committed): one multiple-ack where the
        broker has one."""

    async def release(self, batch: Sequence[Fetched]) -> None:
        """Hand ``batch`` back unacknowledged, for another delivery."""

    async def close(self) -> None:
        """Close the connection; never raises."""


def make_consumer(config: BrokerConfig, subscription: Subscription, worker_id: str) -> Consumer:
    """A new, unconnected consumer of ``subscription`` (imports the client library):
    for NATS and Redis, their fetcher in a child process (``CONSUMER_PROCESS``, the
    default) or on this process's broker loop."""
    import_client(config)
    if config.consumer_process:  # NATS and Redis only: config refuses it on RabbitMQ
        child = importlib.import_module(".consumer_process", __package__)
        consumer: Consumer = child.ProcessConsumer(config, subscription, worker_id)
        return consumer
    module = importlib.import_module(_MODULES[config.transport], __package__)
    if config.transport == "rabbitmq":  # builds its Messages itself
        consumer = module.Consumer(config, subscription, worker_id)
        return consumer
    return InThread(module.Consumer(config, subscription, worker_id))


class InThread:
    """A fetcher on this process's broker loop, seen as a ``Consumer``: its plain values
    become ``Message``s here (the fetcher imports nothing of Django)."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher

    async def connect(self) -> None:
        """Connect the fetcher (``BrokerDown`` when the broker cannot be reached)."""
        await self.fetcher.connect()

    async def fetch(self, limit: int, wait: float) -> list[Fetched]:
        """Up to ``limit`` messages, waiting at most ``wait`` seconds for the first."""
        return [
            Fetched(Message(attributes, body, headers), token)
            for attributes, body, headers, token in await self.fetcher.fetch(limit, wait)
        ]

    async def ack(self, batch: Sequence[Fetched]) -> None:
        """Acknowledge every message of ``batch``."""
        await self.fetcher.ack([fetched.token for fetched in batch])

    async def release(self, batch: Sequence[Fetched]) -> None:
        """Hand ``batch`` back unacknowledged."""
        await self.fetcher.release([fetched.token for fetched in batch])

    async def close(self) -> None:
        """Close the fetcher; never raises."""
        await self.fetcher.close()


def default_worker_id() -> str:
    """``host:pid``: a consumer's name in its group (Redis) and in the logs."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Worker:
    """One subscription's consumer in this process, reconnected after an outage."""

    def __init__(self, subscription: Subscription, worker_id: str) -> None:
        self.subscription = subscription
        self.config = broker(subscription.broker)
        self.worker_id = worker_id
        self.consumer: Consumer | None = None
        self.backoff = _BACKOFF_START
        self.failures = 0  # outages in a row, broker or database
        self.counts: Counter[str] = Counter()
        self.ahead: concurrent.futures.Future[list[Fetched]] | None = None  # the next batch
        self.acking: concurrent.futures.Future[None] | None = None  # the last batch's ack

    def step(self, wait: float) -> Counter[str] | None:
        """Fetch, record and acknowledge one batch and count its outcomes; None when there
        was none (or the broker or the database is down: then it waits out its backoff).

        The next batch is fetched while this one is recorded (never acknowledged before
        its own commit), and a committed batch's acknowledgement is sent without waiting
        for it (its outcome is read at the next step, before anything else reaches the
        broker), so the broker's round trips overlap the database's."""
        try:
            self._acknowledged()
        except Exception as error:  # committed: a redelivery will be found recorded
            self._down("acknowledging a recorded batch", error)
            return None
        try:
            consumer = self._connected()
            batch = self._fetched(consumer, wait)
        except Exception as error:
            self._down(f"broker {self.config.name!r} ({self.config.safe_url})", error)
            return None
        if not batch:
            self.failures = 0  # the broker answered, and had nothing
            return None
        self.ahead = submit(consumer.fetch(self.subscription.batch_size, wait))
        try:
            counts = record_batch(self.subscription, [fetched.message for fetched in batch])
        except DatabaseError as error:
            self._database_down(consumer, batch, error)
            return None
        self.counts.update(counts)
        self.backoff, self.failures = _BACKOFF_START, 0
        self.acking = submit(consumer.ack(batch))
        return counts

    def _acknowledged(self) -> None:
        """Wait for the acknowledgement sent last, if any; raises what it raised."""
        acking, self.acking = self.acking, None
        if acking is not None:
            try:
                acking.result(30)
            except BaseException:
                acking.cancel()
                raise

    def _fetched(self, consumer: Consumer, wait: float) -> list[Fetched]:
        """The batch fetched ahead during the last step, or a new fetch."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            return ahead.result(wait + 30)
        return run(consumer.fetch(self.subscription.batch_size, wait), wait + 30)

    def _hand_back(self, consumer: Consumer, batch: Sequence[Fetched] = ()) -> None:
        """Release ``batch`` and the batch fetched ahead, both unrecorded, in the order
        fetched; only once the fetch ahead has ended (or been cancelled), since a fetch
        under way and a release would both move the transport's place in its queue."""
        try:  # first: a release may make this consumer read its pending entries again
            self._acknowledged()
        except Exception:  # committed: a redelivery will be found recorded
            logger.debug("acknowledging a recorded batch of %s failed", self.subscription.name)
        ahead, self.ahead = self.ahead, None
        later: list[Fetched] = []
        if ahead is not None:
            try:
                later = ahead.result(_AHEAD_SECONDS)
            except Exception:  # still fetching, or failed: nothing of it is ours to release
                ahead.cancel()
        for unrecorded in (batch, later):
            if unrecorded:
                run(consumer.release(unrecorded), 30)

    def _connected(self) -> Consumer:
        if self.consumer is None:
            consumer = make_consumer(self.config, self.subscription, self.worker_id)
            run(consumer.connect(), self.config.connect_timeout + 30)
            self.consumer = consumer
        return self.consumer

    def _down(self, what: str, error: BaseException) -> None:
        logger.warning(
            "Consumer of %s: %s failed (%s: %s); reconnecting in %.2fs.",
            self.subscription.name,
            what,
            type(error).__name__,
            error,
            self.backoff,
        )
        self.close()
        self._wait()

    def _database_down(
        self, consumer: Consumer, batch: Sequence[Fetched], error: Exception
    ) -> None:
        logger.warning(
            "Consumer of %s: recording %d messages failed (%s: %s); nothing was "
            "acknowledged, and the broker will deliver them again.",
            self.subscription.name,
            len(batch),
            type(error).__name__,
            error,
        )
        connections[database_alias()].close()
        try:
            self._hand_back(consumer, batch)
        except Exception:
            self.close()
        self._wait()

    def _wait(self) -> None:
        self.failures += 1
        time.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, _BACKOFF_CAP)

    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            try:
                self._hand_back(consumer)
            except Exception:
                logger.debug(
                    "releasing the batch fetched ahead for %s failed", self.subscription.name
                )
            try:
                run(consumer.close(), 10)
            except Exception:
                logger.debug("closing the consumer of %s failed", self.subscription.name)


def selected(broker_name: str | None = None, name: str | None = None) -> list[Subscription]:
    """The declared subscriptions, narrowed to a broker or a subscription name."""
    found = [
        s
        for s in subscriptions()
        if (broker_name is None or s.broker == broker_name) and (name is None or s.name == name)
    ]
    if not found:
        declared = ", ".join(f"{s.name} (broker {s.broker})" for s in subscriptions()) or "none"
        raise ImproperlyConfigured(
            f"no subscription matches broker={broker_name!r}, subscription={name!r} "
            f"(declared: {declared}); declare one with subscribe() in an events.py."
        )
    return found


def run_consumer(
    *,
    broker: str | None = None,
    subscription: str | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
    worker_id: str | None = None,
    wait: float = 1.0,
    on_batch: Callable[[Subscription, Counter[str]], None] | None = None,
) -> Counter[str]:
    """Consume every declared subscription (or the ones named) until ``stop`` is set;
    with ``once``, until each has nothing left to fetch. Returns the outcomes counted
    (``recorded``, ``duplicate``, ``dead``, ``ignored``); ``on_batch(subscription,
    counts)`` is called with each batch's once it is committed and its acknowledgement
    sent (every acknowledgement has reached the broker when this returns)."""
    workers = [_Worker(s, worker_id or default_worker_id()) for s in selected(broker, subscription)]
    stop = stop or threading.Event()
    restore = _stop_on_signals(stop)
    try:
        pending = set(range(len(workers)))
        while not stop.is_set() and (pending or not once):
            for index, worker in enumerate(workers):
                if stop.is_set():
                    break
                counts = worker.step(wait / len(workers) if not once else wait)
                if counts is not None and on_batch is not None:
                    on_batch(worker.subscription, counts)
                drained = counts is None and worker.failures == 0
                if once and drained and worker.consumer is not None:
                    pending.discard(index)
                if once and worker.failures >= _ONCE_FAILURES:
                    raise ConsumerHalted(
                        f"consume_events --once: the consumer of {worker.subscription.name} "
                        f"failed {worker.failures} times in a row (see the log); is its "
                        "broker, or the database, reachable?"
                    )
    finally:
        restore()
        for worker in workers:
            worker.close()
    totals: Counter[str] = Counter()
    for worker in workers:
        totals.update(worker.counts)
    return totals


def _stop_on_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM/SIGINT finish the batch under way (committed and acknowledged) and stop;
    a second one exits at once. Only in the main thread; returns what undoes it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handle(signum: int, frame: Any) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        logger.info("Consumer stopping after its batch (signal %d).", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
