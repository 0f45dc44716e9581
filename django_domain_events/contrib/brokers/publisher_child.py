"""The publisher child: a relay's NATS or Redis client, in a process of its own.

    python -m django_domain_events.contrib.brokers.publisher_child '<broker as JSON>'

``publisher_process.ProcessPublisher`` starts it, so that the client library's Python
(writing the protocol, reading the confirms: about as much per message as the relay's
own) runs beside the relay's claiming and acknowledging instead of sharing its GIL. It
imports nothing of Django: only the stdlib, the client library and the Django-free
modules of this package (``options``, ``envelope``, ``transport``, ``pipe``, the
transport's publisher).

It connects with the transport's own ``Publisher``, answers the connection with frame
0, then serves requests from stdin (``pipe.py`` has the frames and the child's life):

- ``publish [(to, attributes, body), ...]``: per message None (confirmed),
  ``("down", why)`` (an outage: uncharged) or ``("refused", why)`` (a failed attempt);
  the relay sends its next batch while the confirms of this one are outstanding, so
  two may be under way at once;
- ``stop``: close the connection, answer, exit.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, BinaryIO

from .envelope import Envelope
from .options import BrokerConfig
from .pipe import Server, run_program
from .transport import BrokerDown, Outgoing, Transport

#: What one message's answer is when the broker confirmed it, else ``(kind, why)``.
Answer = tuple[str, str] | None


class PublisherServer(Server):
    """The transport's publisher, serving the parent's batches as they come."""

    def __init__(self, publisher: Transport, out: BinaryIO) -> None:
        super().__init__(out)
        self.publisher = publisher

    async def run(self, op: str, argument: Any) -> list[Answer]:
        """One batch through the transport, its confirmations in plain values; a failure
        of the whole batch is an outage."""
        if op != "publish":
            raise ValueError(f"unknown request {op!r}; send publish or stop.")
        messages = [Outgoing(to, Envelope(attrs, body)) for to, attrs, body in argument]
        return [plain(result) for result in await self.publisher.publish(messages)]

    async def stop(self) -> None:
        """Let the batches under way answer first, then close the connection."""
        if self.tasks:
            await asyncio.wait(self.tasks)
        await self.publisher.close()


def plain(result: BaseException | None) -> Answer:
    """One confirmation in plain values: None, or whether it is an outage and why."""
    if result is None:
        return None
    return ("down" if isinstance(result, BrokerDown) else "refused", str(result))


async def main(config: dict[str, Any], out: BinaryIO) -> None:
    """Connect, answer frame 0, then serve the parent."""
    broker = BrokerConfig(**config)
    module = importlib.import_module(f"{__package__}.{broker.transport}")
    publisher: Transport = module.Publisher(broker)
    await PublisherServer(publisher, out).connect_and_serve(publisher.connect, broker)


if __name__ == "__main__":
    run_program(main)
