"""What every transport offers the publisher, and the event loop their clients run on.

The clients are asyncio libraries (aio-pika, nats-py, redis.asyncio): one loop per
process, in a daemon thread of its own, holds every broker connection for the life of
the process; the relay's thread hands it a batch and waits for the confirms. A
transport module is imported only when a broker of its kind is used. This module and
the transport modules import nothing of Django: the client's child processes run them alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .envelope import Envelope
from .options import BrokerConfig

T = TypeVar("T")


class BrokerDown(Exception):
    """The broker cannot be reached, or the connection broke: an outage, charged to no row."""


class Refused(Exception):
    """The broker refused one message (nack, no such destination, too large...): its reason."""


@dataclass(frozen=True)
class Outgoing:
    """One message to send: the destination (``publish(to=)``) and the envelope."""

    to: str
    envelope: Envelope


# What a transport answers for each message: None when the broker confirmed it, else
# the exception (``BrokerDown`` for an outage, anything else a failed attempt).
Confirmations = list[BaseException | None]


class Transport(Protocol):
    """A connection to one broker, kept open across batches."""

    async def connect(self) -> None:
        """Connect (``BrokerDown`` when the broker cannot be reached)."""

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        """Send every message with confirms outstanding, then wait for them all."""

    async def close(self) -> None:
        """Close the connection; never raises."""


#: One message a fetcher parsed, in plain values (what a pipe carries): its CloudEvents
#: attributes, its body, its headers as received, and what the fetcher acknowledges it by.
Parsed = tuple[dict[str, str], bytes, dict[str, str], Any]


class Fetcher(Protocol):
    """One subscription's connection to a NATS or Redis broker, in plain values: what the
    consumer runs on the broker loop, or in a child process of its own."""

    async def connect(self) -> None:
        """Connect, declaring what is missing; ``BrokerDown`` when it cannot be reached."""

    async def fetch(self, limit: int, wait: float) -> list[Parsed]:
        """Up to ``limit`` messages, waiting at most ``wait`` seconds for the first."""

    async def ack(self, tokens: Sequence[Any]) -> None:
        """Acknowledge the messages of ``tokens`` (committed)."""

    async def release(self, tokens: Sequence[Any]) -> None:
        """Hand the messages of ``tokens`` back unacknowledged, for another delivery."""

    async def close(self) -> None:
        """Close the connection; never raises."""


_TRANSPORTS = {"rabbitmq": ".rabbitmq", "nats": ".nats", "redis": ".redis"}


def make_transport(config: BrokerConfig) -> Transport:
    """A new, unconnected transport for ``config`` (imports its client library); its
    client in a child process when the broker's ``PUBLISHER_PROCESS`` says so."""
    from .config import import_client  # reads Django's settings: not for the consumer child

    import_client(config)  # ImproperlyConfigured naming the extra when it is missing
    if config.publisher_process:
        from .publisher_process import ProcessPublisher

        return ProcessPublisher(config)
    module = importlib.import_module(_TRANSPORTS[config.transport], __package__)
    transport: Transport = module.Publisher(config)
    return transport


_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """The process's broker loop, started on first use in a daemon thread."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            new = asyncio.new_event_loop()
            thread = threading.Thread(
                target=new.run_forever, name="django_domain_events.brokers", daemon=True
            )
            thread.start()
            _loop = new
        return _loop


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coroutine`` on the broker loop; its future, to wait for later."""
    return asyncio.run_coroutine_threadsafe(coroutine, loop())


def run(coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run ``coroutine`` on the broker loop and wait at most ``timeout`` seconds."""
    future = submit(coroutine)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise
