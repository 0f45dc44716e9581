"""Redis Streams: ``XADD <to>`` per message, every batch in one pipeline.

Redis has no publisher confirm beyond its reply: an ``XADD`` answered with an entry id
is in the server's memory and, with ``appendfsync always``, on its disk. Run Redis with
AOF for an outbox: a reply from a server that loses its memory on restart is not a
delivery.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import envelope
from .options import BrokerConfig
from .transport import BrokerDown, Confirmations, Outgoing, Parsed, Refused

_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
#: The body's field name, as redis-py returns it (bytes, or text with decode_responses).
_DATA = (envelope.REDIS_DATA.encode(), envelope.REDIS_DATA)


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
        except RedisTimeoutError:
            timeout = self.config.confirm_timeout
            return [Refused(f"no reply to XADD within {timeout}s") for _ in messages]
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


# ---------------------------------------------------------------- consuming


class Consumer:
    """The consumer group ``subscription.name`` on the stream ``subscription.source``
    (created from the stream's start, with the stream, if missing), read as the consumer
    ``worker_id``. A batch is acknowledged with one ``XACK`` of all its ids. Entries a
    dead consumer left pending are claimed with ``XAUTOCLAIM`` once they have been idle
    for ``ack_wait_seconds``; this consumer's own pending entries (a batch handed back)
    are read again first, each once (from after the last one read: a batch fetched
    ahead while the one before is recorded must not read that one again).
    """

    def __init__(self, config: BrokerConfig, subscription: Any, worker_id: str) -> None:
        self.config = config
        self.subscription = subscription
        self.worker_id = worker_id
        self.client: Any = None
        self.pending_after: str | None = "0"  # own pending entries after this id; None: none
        self.claimed_at = 0.0

    async def connect(self) -> None:
        from redis.exceptions import ResponseError

        publisher = Publisher(self.config)
        await publisher.connect()
        self.client = publisher.client
        sub = self.subscription
        try:
            await self.client.xgroup_create(sub.source, sub.name, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        except _DOWN as error:
            await self.close()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error
        self.pending_after = "0"

    async def fetch(self, limit: int, wait: float) -> list[Parsed]:
        """Up to ``limit`` entries in plain values, their ids the tokens: own pending
        entries first, then idle ones claimed from dead consumers, then new ones."""
        sub = self.subscription
        while self.pending_after is not None:
            reply = await self._entries(self.pending_after, limit, None)
            self.pending_after = _text(reply[-1][0]) if reply else None
            fetched = await self._fetched(reply)
            if fetched:
                return fetched
        idle_ms = int(float(sub.options.get("ack_wait_seconds", 30.0)) * 1000)
        now = time.monotonic()
        if now - self.claimed_at >= idle_ms / 2000:
            self.claimed_at = now
            _, claimed, *_ = await self.client.xautoclaim(
                sub.source, sub.name, self.worker_id, idle_ms, "0-0", count=limit
            )
            if claimed:
                return await self._fetched(claimed)
        return await self._read(">", limit, max(1, int(wait * 1000)))

    async def _read(self, start: str, limit: int, block: int | None) -> list[Parsed]:
        return await self._fetched(await self._entries(start, limit, block))

    async def _entries(self, start: str, limit: int, block: int | None) -> list[Any]:
        sub = self.subscription
        reply = await self.client.xreadgroup(
            sub.name, self.worker_id, {sub.source: start}, count=limit, block=block
        )
        return [entry for _, stream_entries in reply or [] for entry in stream_entries]

    async def _fetched(self, entries: Sequence[Any]) -> list[Parsed]:
        gone = [entry_id for entry_id, fields in entries if not fields]
        if gone:  # trimmed from the stream while pending: nothing left to record
            await self.client.xack(self.subscription.source, self.subscription.name, *gone)
        return [_parsed(fields, entry_id) for entry_id, fields in entries if fields]

    async def ack(self, tokens: Sequence[Any]) -> None:
        """One ``XACK`` of every entry id."""
        sub = self.subscription
        await self.client.xack(sub.source, sub.name, *tokens)

    async def release(self, tokens: Sequence[Any]) -> None:
        """Nothing at the server: the entries stay pending, read again first."""
        self.pending_after = "0"  # still pending for this consumer: read again first

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parsed(fields: Any, entry_id: Any) -> Parsed:
    """A stream entry in plain values, its id the token: every field read as text once
    (an invalid UTF-8 byte replaced, so the entry is kept dead rather than stopping the
    consumer)."""
    headers = {_text(k): _text(v) for k, v in fields.items() if k not in _DATA}
    data = fields.get(_DATA[0], fields.get(_DATA[1], b""))
    body = data if isinstance(data, bytes) else str(data).encode()
    return envelope.attributes_of(headers), body, headers, entry_id
