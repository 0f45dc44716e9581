"""A NATS or Redis consumer whose client runs in a child process (``CONSUMER_PROCESS``).

Per message, a consumer spends about as much Python in the client library (reading the
socket, parsing the protocol) as in building the rows; in one process both hold the
same GIL, so they take turns. ``ProcessConsumer`` moves the client into a child
(``consumer_child.py``) that fetches and parses there and sends plain values over a
pipe; this process only turns them into ``Message``s and records them.

It is a ``consuming.Consumer`` like the others, so the worker is unchanged: it fetches
the next batch while recording one, acknowledges after the commit and hands a batch
back after a database error. A child that dies is a broker outage: what it held was
never acknowledged, so the broker delivers it again (NATS after ``ack_wait_seconds``,
Redis to the next child of this consumer at once, its own pending entries read first),
and the inbox finds what was already recorded; the worker's reconnection starts a new
child. A child reads its stdin to the end, so it exits with this process however this
process ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...inbox import Message, Subscription
from .config import BrokerConfig
from .consumer_child import frame, read_frame
from .consuming import Fetched
from .transport import BrokerDown

#: The child program, run with this process's interpreter.
CHILD = "django_domain_events.contrib.brokers.consumer_child"
#: How long a stopping child may take to close its connection before it is killed.
_STOP_SECONDS = 10.0


class ProcessConsumer:
    """One subscription's fetcher in a child process, spoken to over its stdin and stdout;
    a token is the id of the batch a message came in."""

    def __init__(self, config: BrokerConfig, subscription: Subscription, worker_id: str) -> None:
        self.config = config
        self.subscription = subscription
        self.worker_id = worker_id
        self.process: subprocess.Popen[bytes] | None = None
        self.reading: asyncio.Task[None] | None = None
        self.replies: dict[int, asyncio.Future[Any]] = {}
        self.next_request = 1
        self.gone = ""  # why the child can no longer answer; "" while it can

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self.process.pid if self.process is not None else None

    def argument(self) -> str:
        """The child's configuration: the broker and what the fetcher reads of the
        subscription, as JSON."""
        sub = self.subscription
        options = {k: v for k, v in sub.options.items() if isinstance(v, int | float | str)}
        return json.dumps(
            {
                "broker": {
                    "name": self.config.name,
                    "url": self.config.url,
                    "transport": self.config.transport,
                    "options": dict(self.config.options),
                },
                "subscription": {
                    "name": sub.name,
                    "source": sub.source,
                    "batch_size": sub.batch_size,
                    "options": options,
                },
                "worker_id": self.worker_id,
            }
        )

    async def connect(self) -> None:
        """Start the child and wait for it to connect (``BrokerDown`` if it cannot)."""
        loop = asyncio.get_running_loop()
        root = str(Path(__file__).resolve().parents[3])  # the child imports this package
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", CHILD, self.argument()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        assert self.process.stdout is not None
        reader = asyncio.StreamReader(limit=2**20)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self.process.stdout
        )
        connected = self.replies[0] = loop.create_future()
        self.reading = asyncio.create_task(self._read(reader))
        try:
            await asyncio.wait_for(connected, self.config.connect_timeout + 30)
        except BaseException:
            await self.close()
            raise

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Hand each answer to its request; at the end, fail every request still waiting."""
        try:
            while True:
                request, status, value = await read_frame(reader)
                waiting = self.replies.pop(request, None)
                if waiting is None or waiting.done():
                    continue
                if status == "ok":
                    waiting.set_result(value)
                else:
                    waiting.set_exception(BrokerDown(f"{self.config.safe_url}: {value}"))
        except (EOFError, OSError, ValueError) as error:
            self._lost(f"the consumer child (pid {self.pid}) is gone ({error or 'exited'})")

    def _lost(self, why: str) -> None:
        self.gone = self.gone or why
        replies, self.replies = self.replies, {}
        for waiting in replies.values():
            if not waiting.done():
                waiting.set_exception(BrokerDown(self.gone))

    async def _request(self, op: str, argument: Any = None) -> Any:
        if self.gone or self.process is None or self.process.stdin is None:
            raise BrokerDown(self.gone or "the consumer child is not running")
        request, self.next_request = self.next_request, self.next_request + 1
        answer = self.replies[request] = asyncio.get_running_loop().create_future()
        try:
            self.process.stdin.write(frame((request, op, argument)))
            self.process.stdin.flush()
        except OSError as error:
            self._lost(f"the consumer child (pid {self.pid}) is gone ({error})")
        return await answer

    async def fetch(self, limit: int, wait: float) -> list[Fetched]:
        """Up to ``limit`` messages, parsed by the child."""
        batch, parsed = await self._request("fetch", (limit, wait))
        return [
            Fetched(Message(attributes, body, headers), batch)
            for attributes, body, headers in parsed
        ]

    async def ack(self, batch: Sequence[Fetched]) -> None:
        """Acknowledge the batches ``batch`` came in (the worker acknowledges whole ones)."""
        await self._request("ack", sorted({fetched.token for fetched in batch}))

    async def release(self, batch: Sequence[Fetched]) -> None:
        """Hand the batches ``batch`` came in back unacknowledged."""
        await self._request("release", sorted({fetched.token for fetched in batch}))

    async def close(self) -> None:
        """Stop the child (killed if it does not stop in time) and wait for it; never
        raises."""
        process = self.process
        if process is None:
            return
        if not self.gone:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._request("stop"), _STOP_SECONDS)
        self.process = None
        self._lost("the consumer was closed")
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            process.stdin.close()  # a child that did not stop exits at the end of stdin
        try:
            await asyncio.to_thread(process.wait, _STOP_SECONDS)
        except Exception:
            process.kill()
            await asyncio.to_thread(process.wait)
        if self.reading is not None:
            self.reading.cancel()
            self.reading = None
