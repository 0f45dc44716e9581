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
import os
from typing import Any, BinaryIO

from .envelope import Envelope
from .options import BrokerConfig
from .pipe import answer, connect_or_answer, read_frame, run_program, stdin_frames
from .transport import BrokerDown, Outgoing, Transport

#: What one message's answer is when the broker confirmed it, else ``(kind, why)``.
Answer = tuple[str, str] | None


class Server:
    """The transport's publisher, serving the parent's batches as they come."""

    def __init__(self, publisher: Transport, out: BinaryIO) -> None:
        self.publisher = publisher
        self.out = out
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, first: asyncio.Task[Any]) -> None:
        """Answer requests (``first`` reads the first) until ``stop``; exit at once at
        the end of stdin (the relay is gone: its rows are handed back by their lease)."""
        reading = first
        while True:
            try:
                request, op, argument = await reading
            except EOFError:
                os._exit(0)
            reading = asyncio.create_task(read_frame(reader))
            if op == "stop":
                if self.tasks:  # batches under way: their answers go first
                    await asyncio.wait(self.tasks)
                await self.publisher.close()
                answer(self.out, request, "ok", None)
                return
            task = asyncio.create_task(self.handle(request, op, argument))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def handle(self, request: int, op: str, argument: Any) -> None:
        """Publish one batch and answer it; a failure of the whole batch is an outage."""
        try:
            if op != "publish":
                raise ValueError(f"unknown request {op!r}; send publish or stop.")
            value = await self.publish(argument)
        except Exception as error:
            answer(self.out, request, "down", f"{type(error).__name__}: {error}")
        else:
            answer(self.out, request, "ok", value)

    async def publish(self, batch: list[tuple[str, dict[str, str], bytes]]) -> list[Answer]:
        """One batch through the transport, its confirmations in plain values."""
        messages = [Outgoing(to, Envelope(attributes, body)) for to, attributes, body in batch]
        return [plain(result) for result in await self.publisher.publish(messages)]


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
    reader = await stdin_frames()
    limit = broker.connect_timeout + broker.confirm_timeout
    first = await connect_or_answer(publisher.connect, limit, reader, out)
    if first is not None:
        await Server(publisher, out).serve(reader, first)


if __name__ == "__main__":
    run_program(main)
