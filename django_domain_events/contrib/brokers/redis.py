"""Redis Streams: ``XADD <to>`` per message, every batch in one pipeline.

Redis has no publisher confirm beyond its reply: an ``XADD`` answered with an entry id
is in the server's memory and, with ``appendfsync always``, on its disk. Run Redis with
AOF for an outbox: a reply from a server that loses its memory on restart is not a
delivery.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import envelope
from .config import BrokerConfig
from .transport import BrokerDown, Confirmations, Outgoing, Refused

_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


class Publisher:
    """One Redis connection pool, kept for the life of the process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.client: Any = None

    async def connect(self) -> None:
        client = aioredis.Redis.from_url(
            self.config.url,
            socket_connect_timeout=self.config.connect_timeout,
            socket_timeout=self.config.confirm_timeout,
        )
        try:
            await client.ping()
        except _DOWN as error:
            await client.aclose()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error
        self.client = client

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        maxlen = self.config.options.get("MAXLEN")
        pipe = self.client.pipeline(transaction=False)
        for message in messages:
            fields = envelope.to_redis(message.envelope)
            pipe.xadd(message.to, fields, maxlen=maxlen, approximate=maxlen is not None)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except _DOWN as error:
            down = BrokerDown(f"{type(error).__name__}: {error}")
            return [down for _ in messages]
        return [
            Refused(f"Redis refused XADD {message.to!r}: {reply}")
            if isinstance(reply, Exception)
            else None
            for message, reply in zip(messages, replies, strict=True)
        ]

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                await client.aclose()
