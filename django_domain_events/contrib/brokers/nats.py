"""NATS JetStream: subject ``<to>.<type>`` in the stream capturing ``<to>.>``.

Each message carries ``Nats-Msg-Id`` = the CloudEvent's id, so a resend within the
stream's duplicate window is dropped by JetStream itself. A batch is sent with
``publish_async`` (every PubAck outstanding at once) and then awaited. The stream is
created when missing (named by ``config.nats_stream_name``, file storage, the
``DUPLICATE_WINDOW_SECONDS`` option); an existing stream is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import nats
from nats.errors import ConnectionClosedError, NoServersError, StaleConnectionError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError

from . import envelope
from .options import BrokerConfig, nats_stream_name
from .transport import BrokerDown, Confirmations, Outgoing, Parsed, Refused

logger = logging.getLogger("django_domain_events.brokers")

_DOWN = (ConnectionClosedError, NoServersError, StaleConnectionError, OSError)


class Publisher:
    """One NATS connection and its JetStream context, kept for the life of the process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.nc: Any = None
        self.js: Any = None
        self.streams: set[str] = set()

    async def connect(self) -> None:
        failure: Exception | None = None  # nats-py reports each failed try here, not raised

        async def failed(error: Exception) -> None:
            nonlocal failure
            if self.nc is None:  # connecting: the last try's reason goes in BrokerDown
                failure = error
            else:  # connected: what nats-py would have logged itself
                logger.warning("NATS %s: %s: %s", self.config.safe_url, type(error).__name__, error)

        try:
            self.nc = await nats.connect(
                self.config.url,
                connect_timeout=self.config.connect_timeout,
                allow_reconnect=False,  # a broken connection is an outage; we reconnect
                # Give up at once on a server that refuses: with max_reconnect_attempts=0
                # nats-py tries it again for ever, every reconnect_time_wait, and the relay
                # would wait out its whole connect bound at every probe of an outage.
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=failed,
            )
        except (TimeoutError, *_DOWN, NatsTimeoutError) as error:
            why = failure or error
            raise BrokerDown(f"{type(why).__name__}: {why}") from error
        self.js = self.nc.jetstream(timeout=self.config.confirm_timeout)
        self.streams = set()

    async def ensure_stream(self, to: str) -> None:
        """Create the stream capturing ``<to>.>`` unless it exists."""
        name = nats_stream_name(to)
        if name in self.streams:
            return
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            window = float(self.config.options["DUPLICATE_WINDOW_SECONDS"])
            await self.js.add_stream(name=name, subjects=[f"{to}.>"], duplicate_window=window)
        self.streams.add(name)

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        results: Confirmations = [None] * len(messages)
        futures: dict[int, asyncio.Future[Any]] = {}
        try:
            for to in {message.to for message in messages}:
                await self.ensure_stream(to)
        except _DOWN as error:
            return self._down(messages, error, futures)
        except Exception as error:  # the stream cannot be made: every message refused
            if self._broken():
                return self._down(messages, error, futures)
            return [Refused(f"NATS refused the stream for {m.to!r}: {error}") for m in messages]
        for index, message in enumerate(messages):
            env = message.envelope
            try:
                futures[index] = await self.js.publish_async(
                    f"{message.to}.{env.type}", env.data, headers=envelope.to_nats(env)
                )
            except _DOWN as error:
                return self._down(messages, error, futures)
            except Exception as error:  # too large, a bad subject: this message only
                if self._broken():
                    return self._down(messages, error, futures)
                results[index] = Refused(f"NATS refused it: {type(error).__name__}: {error}")
        await self._wait(futures, results)
        if any(r is not None for r in results) and self._broken():
            return [BrokerDown("the connection to NATS broke") if r else r for r in results]
        return results

    async def _wait(self, futures: dict[int, asyncio.Future[Any]], results: Confirmations) -> None:
        if not futures:
            return
        await asyncio.wait(futures.values(), timeout=self.config.confirm_timeout)
        for index, future in futures.items():
            if not future.done():
                future.cancel()
                results[index] = Refused(
                    f"no PubAck within {self.config.confirm_timeout}s (CONFIRM_TIMEOUT_SECONDS)"
                )
            elif future.exception() is not None:
                results[index] = Refused(f"JetStream refused it: {future.exception()}")

    def _broken(self) -> bool:
        return self.nc is None or not self.nc.is_connected

    def _down(
        self,
        messages: Sequence[Outgoing],
        error: BaseException,
        futures: dict[int, asyncio.Future[Any]],
    ) -> Confirmations:
        for future in futures.values():
            future.cancel()
        return [BrokerDown(f"{type(error).__name__}: {error}") for _ in messages]

    async def close(self) -> None:
        nc, self.nc, self.js = self.nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                await nc.close()


# ---------------------------------------------------------------- consuming


class Consumer:
    """A durable pull consumer on the stream capturing ``<source>.>`` (created if
    missing, as the publisher would), named ``subscription.name`` with the characters
    NATS forbids replaced (``config.nats_stream_name``'s rule). Processes sharing the name
    share the messages. Each message is acknowledged on its own (JetStream's ack-all
    would also acknowledge messages another process holds); the acks are flushed once.
    """

    def __init__(self, config: BrokerConfig, subscription: Any, worker_id: str) -> None:
        self.config = config
        self.subscription = subscription
        self.nc: Any = None
        self.pull: Any = None

    async def connect(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig

        sub = self.subscription
        publisher = Publisher(self.config)
        await publisher.connect()
        self.nc = publisher.nc
        try:
            await publisher.ensure_stream(sub.source)
            durable = nats_stream_name(sub.name).replace(":", "_")
            wait = float(sub.options.get("ack_wait_seconds", 30.0))
            self.pull = await publisher.js.pull_subscribe(
                f"{sub.source}.>",
                durable=durable,
                stream=nats_stream_name(sub.source),
                config=ConsumerConfig(
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=wait,
                    max_ack_pending=max(1000, 4 * sub.batch_size),
                ),
            )
        except (TimeoutError, *_DOWN, NatsTimeoutError) as error:
            await self.close()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error

    async def fetch(self, limit: int, wait: float) -> list[Parsed]:
        """Up to ``limit`` messages in plain values, each its own token."""
        if self.nc is None or not self.nc.is_connected:
            raise BrokerDown("the connection to NATS is closed")
        try:
            got = await self.pull.fetch(batch=limit, timeout=max(wait, 0.05))
        except (TimeoutError, NatsTimeoutError):
            return []
        return [_parsed(m) for m in got]

    async def ack(self, tokens: Sequence[Any]) -> None:
        """Acknowledge each message, then flush the acks once."""
        for message in tokens:
            await message.ack()
        await self.nc.flush(timeout=self.config.confirm_timeout)

    async def release(self, tokens: Sequence[Any]) -> None:
        """``nak`` each message, for another delivery at once."""
        for message in tokens:
            await message.nak()
        await self.nc.flush(timeout=self.config.confirm_timeout)

    async def close(self) -> None:
        nc, self.nc, self.pull = self.nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()


def _parsed(incoming: Any) -> Parsed:
    """A JetStream message in plain values, itself the token (nats-py parses its headers
    as text)."""
    headers = dict(incoming.headers) if incoming.headers else {}
    return envelope.attributes_of(headers), bytes(incoming.data), headers, incoming
