"""The consumer child: one subscription's NATS or Redis fetcher, in a process of its own.

    python -m django_domain_events.contrib.brokers.consumer_child '<config as JSON>'

``consumer_process.ProcessConsumer`` starts it, so that the client library's parsing (most
of a consumer's Python per message) runs beside the parent's recording instead of
sharing its GIL. It imports nothing of Django: only the stdlib, the client library and
the Django-free modules of this package (``options``, ``envelope``, ``transport``,
``pipe``, the transport's fetcher).

It connects and declares what the in-process consumer declares (the fetcher is the
same class), answers the connection with frame 0, then serves requests from stdin
(``pipe.py`` has the frames and the child's life; the parent fetches the next batch
while acknowledging the last):

- ``fetch (limit, wait)``: ``(batch id, [(attributes, body, headers), ...])``; the child
  keeps the batch's tokens under its id until it is acknowledged or released, and reads
  the next batch ahead while the parent records this one (released with a release, or at
  the stop);
- ``ack [batch ids]`` / ``release [batch ids]``: those batches' messages;
- ``stop``: close the connection, answer, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .options import BrokerConfig
from .pipe import Server, run_program
from .transport import Fetcher, Parsed


@dataclass(frozen=True)
class Subscribed:
    """What a fetcher reads of a subscription, rebuilt from the parent's JSON."""

    name: str
    source: str
    batch_size: int
    options: dict[str, Any] = field(default_factory=dict)


class ConsumerServer(Server):
    """The fetcher and the batches it handed out, by id, until acknowledged or released."""

    def __init__(self, fetcher: Fetcher, out: BinaryIO) -> None:
        super().__init__(out)
        self.fetcher = fetcher
        self.batches: dict[int, list[Any]] = {}
        self.next_batch = 1
        self.ahead: asyncio.Task[list[Parsed]] | None = None  # the next batch, read ahead

    async def stop(self) -> None:
        """Release what was read ahead, then close the connection."""
        with contextlib.suppress(Exception):  # closing: redelivered after ack_wait
            await self.hand_back([])
        await self.fetcher.close()

    async def run(self, op: str, argument: Any) -> Any:
        """What one request answers: a batch (its tokens kept), or None once done."""
        if op == "fetch":
            parsed = await self.fetched(*argument)
            if not parsed:
                return (0, [])
            batch, self.next_batch = self.next_batch, self.next_batch + 1
            self.batches[batch] = [token for *_, token in parsed]
            return (batch, [(attributes, body, headers) for attributes, body, headers, _ in parsed])
        tokens = [token for batch in argument for token in self.batches.pop(batch, ())]
        if op == "ack":
            await self.fetcher.ack(tokens)
        elif op == "release":
            await self.hand_back(tokens)
        else:
            raise ValueError(f"unknown request {op!r}; send fetch, ack, release or stop.")
        return None

    async def fetched(self, limit: int, wait: float) -> list[Parsed]:
        """The batch read ahead (or a new one), and the next one read ahead meanwhile: the
        parent asks for a batch only when it starts recording the one before, so the
        child keeps one more ready for it."""
        ahead, self.ahead = self.ahead, None
        parsed = await ahead if ahead is not None else await self.fetcher.fetch(limit, wait)
        if parsed:  # an idle broker is not read ahead: a stop would wait for the read
            self.ahead = asyncio.create_task(self.fetcher.fetch(limit, wait))
        return parsed

    async def hand_back(self, tokens: list[Any]) -> None:
        """Release ``tokens`` and the batch read ahead, in the order fetched; only once
        the read ahead has ended, since a read under way and a release would both move
        the fetcher's place in its queue."""
        ahead, self.ahead = self.ahead, None
        later: list[Parsed] = []
        if ahead is not None:
            try:
                later = await ahead
            except Exception:  # failed: nothing of it is ours to release
                later = []
        tokens = tokens + [token for *_, token in later]
        if tokens:
            await self.fetcher.release(tokens)


async def main(config: dict[str, Any], out: BinaryIO) -> None:
    """Connect, answer frame 0, then serve the parent."""
    broker = BrokerConfig(**config["broker"])
    module = importlib.import_module(f"{__package__}.{broker.transport}")
    fetcher: Fetcher = module.Consumer(
        broker, Subscribed(**config["subscription"]), config["worker_id"]
    )
    await ConsumerServer(fetcher, out).connect_and_serve(fetcher.connect, broker)


if __name__ == "__main__":
    run_program(main)
