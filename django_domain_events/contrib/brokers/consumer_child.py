"""The consumer child: one subscription's NATS or Redis fetcher, in a process of its own.

    python -m django_domain_events.contrib.brokers.consumer_child '<config as JSON>'

``consumer_process.ProcessConsumer`` starts it, so that the client library's parsing (most
of a consumer's Python per message) runs beside the parent's recording instead of
sharing its GIL. It imports nothing of Django: only the stdlib, the client library and
the Django-free modules of this package (``options``, ``envelope``, ``transport``, the
transport's fetcher).

It connects and declares what the in-process consumer declares (the fetcher is the
same class), answers the connection with frame 0, then serves requests from stdin, each
answered on stdout by request id (several may be under way at once: the parent fetches
the next batch while acknowledging the last):

- ``fetch (limit, wait)``: ``(batch id, [(attributes, body, headers), ...])``; the child
  keeps the batch's tokens under its id until it is acknowledged or released, and reads
  the next batch ahead while the parent records this one (released with a release, or at
  the stop);
- ``ack [batch ids]`` / ``release [batch ids]``: those batches' messages;
- ``stop``: close the connection, answer, exit.

A frame is a 4-byte big-endian length and a ``marshal`` dump. An answer is ``(request
id, "ok", value)`` or ``(request id, "down", "why")`` (the broker failed: the parent
treats it as an outage). stdin at its end means the parent is gone (even killed): the
child exits at once, and what it held unacknowledged the broker delivers again. SIGINT
and SIGTERM are ignored: the parent decides when the child stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import marshal
import os
import signal
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .options import BrokerConfig
from .transport import Fetcher, Parsed

#: The length that starts every frame, both ways.
HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class Subscribed:
    """What a fetcher reads of a subscription, rebuilt from the parent's JSON."""

    name: str
    source: str
    batch_size: int
    options: dict[str, Any] = field(default_factory=dict)


def frame(value: Any) -> bytes:
    """``value`` as one frame: its length, then its ``marshal`` dump."""
    data = marshal.dumps(value)
    return HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's value; ``EOFError`` at the end of the stream."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        return marshal.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError as error:
        raise EOFError from error


class Child:
    """The fetcher and the batches it handed out, by id, until acknowledged or released."""

    def __init__(self, fetcher: Fetcher, out: BinaryIO) -> None:
        self.fetcher = fetcher
        self.out = out
        self.batches: dict[int, list[Any]] = {}
        self.next_batch = 1
        self.tasks: set[asyncio.Task[None]] = set()
        self.ahead: asyncio.Task[list[Parsed]] | None = None  # the next batch, read ahead

    def answer(self, request: int, status: str, value: Any) -> None:
        """Write one answer (whole: a frame is never interleaved with another)."""
        self.out.write(frame((request, status, value)))
        self.out.flush()

    async def serve(self, reader: asyncio.StreamReader, first: asyncio.Task[Any]) -> None:
        """Answer requests (``first`` reads the first) until ``stop``; exit at once at
        the end of stdin."""
        reading = first
        while True:
            try:
                request, op, argument = await reading
            except EOFError:  # the parent is gone: nothing here is anyone's any more
                os._exit(0)
            reading = asyncio.create_task(read_frame(reader))
            if op == "stop":
                with contextlib.suppress(Exception):  # closing: redelivered after ack_wait
                    await self.hand_back([])
                await self.fetcher.close()
                self.answer(request, "ok", None)
                return
            task = asyncio.create_task(self.handle(request, op, argument))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def handle(self, request: int, op: str, argument: Any) -> None:
        """Run one request and answer it; a failure is the broker's."""
        try:
            value = await self.run(op, argument)
        except Exception as error:
            self.answer(request, "down", f"{type(error).__name__}: {error}")
        else:
            self.answer(request, "ok", value)

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
    child = Child(fetcher, out)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    # stdin is read from the start: a parent gone (or stopping it) while the connection
    # is still being made ends the child too.
    first = asyncio.create_task(read_frame(reader))
    # Bounded here too: a server that takes the connection and never answers would
    # otherwise hold it for as long as the client library allows.
    limit = broker.connect_timeout + broker.confirm_timeout
    connecting = asyncio.create_task(asyncio.wait_for(fetcher.connect(), limit))
    await asyncio.wait({first, connecting}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        os._exit(0)
    try:
        connecting.result()
    except TimeoutError:
        why = "CONNECT_TIMEOUT_SECONDS + CONFIRM_TIMEOUT_SECONDS"
        child.answer(0, "down", f"TimeoutError: not connected within {limit:g}s ({why})")
        return
    except Exception as error:
        child.answer(0, "down", f"{type(error).__name__}: {error}")
        return
    child.answer(0, "ok", os.getpid())
    await child.serve(reader, first)


def run() -> None:
    """The program: frames on a private copy of stdout (anything a library prints goes
    to stderr instead), signals left to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    asyncio.run(main(json.loads(sys.argv[1]), out))


if __name__ == "__main__":
    run()
