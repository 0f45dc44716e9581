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

from collections.abc import Sequence
from typing import Any

from ...inbox import Message, Subscription
from .config import BrokerConfig
from .consuming import Fetched
from .pipe import Child

#: The child program, run with this process's interpreter.
CHILD = "django_domain_events.contrib.brokers.consumer_child"


class ProcessConsumer:
    """One subscription's fetcher in a child process, spoken to over its stdin and stdout;
    a token is the id of the batch a message came in."""

    def __init__(self, config: BrokerConfig, subscription: Subscription, worker_id: str) -> None:
        self.config = config
        self.subscription = subscription
        self.worker_id = worker_id
        self.child = Child(CHILD, self.argument(), "consumer child", config.safe_url)

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self.child.pid

    def argument(self) -> dict[str, Any]:
        """The child's configuration: the broker and what the fetcher reads of the
        subscription, in plain values."""
        sub = self.subscription
        options = {k: v for k, v in sub.options.items() if isinstance(v, int | float | str)}
        return {
            "broker": self.config.plain(),
            "subscription": {
                "name": sub.name,
                "source": sub.source,
                "batch_size": sub.batch_size,
                "options": options,
            },
            "worker_id": self.worker_id,
        }

    async def connect(self) -> None:
        """Start the child and wait for it to connect (``BrokerDown`` if it cannot)."""
        await self.child.start(self.config.connect_timeout + 30)

    async def fetch(self, limit: int, wait: float) -> list[Fetched]:
        """Up to ``limit`` messages, parsed by the child."""
        batch, parsed = await self.child.request("fetch", (limit, wait))
        return [
            Fetched(Message(attributes, body, headers), batch)
            for attributes, body, headers in parsed
        ]

    async def ack(self, batch: Sequence[Fetched]) -> None:
        """Acknowledge the batches ``batch`` came in (the worker acknowledges whole ones)."""
        await self.child.request("ack", sorted({fetched.token for fetched in batch}))

    async def release(self, batch: Sequence[Fetched]) -> None:
        """Hand the batches ``batch`` came in back unacknowledged."""
        await self.child.request("release", sorted({fetched.token for fetched in batch}))

    async def close(self) -> None:
        """Stop the child (killed if it does not stop in time) and wait for it; never
        raises."""
        await self.child.close()
