"""RabbitMQ: a durable topic exchange ``to``, routing key the event's name, with
publisher confirms.

aio-pika rather than pika: pika's ``BlockingConnection`` waits for each confirm before
the next publish, one round trip per message; aio-pika sends the whole batch with every
confirm outstanding and awaits them together, on the process's broker loop. A message
RabbitMQ refuses closes the channel, failing every confirm still outstanding on it; the
rest of the batch is then sent again one message at a time on a new channel, so only
the refused message fails. Every message is published ``mandatory``: one no queue is
bound to receive comes back (``basic.return``) and fails its row, rather than being
confirmed and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.exceptions import AMQPConnectionError, ChannelClosed, ConnectionClosed, PublishError

from ...inbox import Message
from . import envelope
from .config import BrokerConfig
from .consuming import Fetched
from .transport import BrokerDown, Confirmations, Outgoing, Refused

_DOWN = (AMQPConnectionError, ConnectionClosed, ConnectionError, OSError)


class Publisher:
    """One AMQP connection and one confirming channel, kept for the life of the process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.connection: Any = None
        self.channel: Any = None
        self.exchanges: dict[str, Any] = {}

    async def connect(self) -> None:
        # Made here rather than by aio_pika.connect(), so that a connection that failed
        # is closed by us, not left to a __del__ that cannot reach the loop.
        self.connection = aio_pika.Connection(aio_pika.connection.make_url(self.config.url))
        try:
            await self.connection.connect(timeout=self.config.connect_timeout)
            await self._open_channel()
        except (TimeoutError, *_DOWN) as error:
            await self.close()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error

    async def _open_channel(self) -> None:
        # on_return_raises: a returned (unroutable) message raises instead of confirming
        self.channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self.exchanges = {}

    async def _exchange(self, to: str) -> Any:
        if to not in self.exchanges:
            self.exchanges[to] = await self.channel.declare_exchange(
                to, aio_pika.ExchangeType.TOPIC, durable=True
            )
        return self.exchanges[to]

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        try:
            for to in dict.fromkeys(message.to for message in messages):
                await self._exchange(to)
        except Exception as error:  # a declaration refused, or the connection broke
            return await self._one_by_one(messages, error)
        sends = [self._send(message) for message in messages]
        replies = await asyncio.gather(*sends, return_exceptions=True)
        results: Confirmations = [self._result(reply) for reply in replies]
        if all(result is None for result in results):
            return results
        if self._broken() or any(isinstance(r, BrokerDown) for r in results):
            return [BrokerDown("the connection broke") if r else r for r in results]
        if self.channel.is_closed:  # a refusal closed the channel: find which message
            failed = [m for m, r in zip(messages, results, strict=True) if r is not None]
            again = iter(await self._one_by_one(failed, None))
            return [next(again) if r is not None else None for r in results]
        return results

    async def _send(self, message: Outgoing) -> Any:
        exchange = await self._exchange(message.to)
        amqp = envelope.to_amqp(message.envelope)
        body = aio_pika.Message(
            amqp.body,
            headers=dict(amqp.headers),
            content_type=amqp.content_type,
            message_id=amqp.message_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            return await exchange.publish(
                body,
                routing_key=message.envelope.type,
                mandatory=True,
                timeout=self.config.confirm_timeout,
            )
        except PublishError:
            raise Refused(
                f"RabbitMQ returned it unroutable: exchange {message.to!r} has no queue bound "
                f"for routing key {message.envelope.type!r}; bind a queue for that key (a "
                "consumer's subscribe() declares one), then the row's retry sends it again"
            ) from None

    def _result(self, reply: Any) -> BaseException | None:
        if not isinstance(reply, BaseException):
            return None
        if isinstance(reply, Refused):  # already says why (an unroutable message)
            return reply
        if self._down(reply):
            return BrokerDown(f"the connection broke: {type(reply).__name__}: {reply}")
        if isinstance(reply, asyncio.TimeoutError):
            return Refused(f"no confirm within {self.config.confirm_timeout}s")
        return Refused(f"RabbitMQ refused it: {type(reply).__name__}: {reply}")

    async def _one_by_one(
        self, messages: Sequence[Outgoing], error: BaseException | None
    ) -> Confirmations:
        """Each message alone, each on a fresh channel after a refusal closed the last."""
        results: Confirmations = []
        for message in messages:
            if self._broken():
                down = BrokerDown(f"the connection broke: {error}")
                results.extend([down] * (len(messages) - len(results)))
                break
            try:
                if self.channel is None or self.channel.is_closed:
                    await self._open_channel()
                await self._send(message)
                results.append(None)
            except Exception as other:
                error = other
                if isinstance(other, Refused):
                    results.append(other)
                elif self._down(other):
                    results.append(BrokerDown(f"{type(other).__name__}: {other}"))
                else:
                    results.append(Refused(f"RabbitMQ refused it: {other}"))
        return results

    def _down(self, error: BaseException) -> bool:
        """Whether ``error`` came from the broker going away rather than from a refusal
        (a confirm that timed out is the message's failure, though TimeoutError is an
        OSError)."""
        if isinstance(error, TimeoutError) and not self._broken():
            return False
        if isinstance(error, _DOWN) or self._broken():
            return True
        return isinstance(error, ChannelClosed) and "CONNECTION_FORCED" in str(error)

    def _broken(self) -> bool:
        """Whether the connection is gone (aio-pika may learn it after aiormq does)."""
        connection = self.connection
        if connection is None or connection.is_closed:
            return True
        underlay = getattr(connection, "transport", None)  # aio-pika's UnderlayConnection
        return underlay is None or underlay.connection.is_closed

    async def close(self) -> None:
        connection, self.connection, self.channel = self.connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                await connection.close()


# ---------------------------------------------------------------- consuming


class Consumer:
    """A durable queue ``subscription.name`` bound to the exchange ``subscription.source``
    (one binding per subscribed type, or ``#``), consumed with a prefetch of four batches.

    A batch is acknowledged with one multiple-ack of its last delivery tag; a batch
    handed back is rejected with one multiple-nack, requeued, so it is delivered again.
    """

    def __init__(self, config: BrokerConfig, subscription: Any, worker_id: str) -> None:
        self.config = config
        self.subscription = subscription
        self.worker_id = worker_id
        self.connection: Any = None
        self.received: asyncio.Queue[Any] = asyncio.Queue()

    async def connect(self) -> None:
        sub = self.subscription
        try:
            self.connection = await aio_pika.connect(
                self.config.url, timeout=self.config.connect_timeout
            )
            channel = await self.connection.channel()
            await channel.set_qos(prefetch_count=4 * sub.batch_size)
            exchange = await channel.declare_exchange(
                sub.source, aio_pika.ExchangeType.TOPIC, durable=True
            )
            queue = await channel.declare_queue(sub.name, durable=True)
            for key in sorted(sub.events) if sub.events is not None else ["#"]:
                await queue.bind(exchange, routing_key=key)
            self.received = asyncio.Queue()
            await queue.consume(self.received.put, consumer_tag=f"{self.worker_id}:{sub.name}")
        except (TimeoutError, *_DOWN) as error:
            await self.close()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error

    async def fetch(self, limit: int, wait: float) -> list[Any]:
        if _broken(self.connection):
            raise BrokerDown("the connection to RabbitMQ is closed")
        try:
            first = await asyncio.wait_for(self.received.get(), wait)
        except TimeoutError:
            return []
        batch = [first]
        while len(batch) < limit and not self.received.empty():
            batch.append(self.received.get_nowait())
        return [Fetched(_amqp_message(m), m) for m in batch]

    async def ack(self, batch: Sequence[Any]) -> None:
        await batch[-1].token.ack(multiple=True)

    async def release(self, batch: Sequence[Any]) -> None:
        await batch[-1].token.nack(multiple=True, requeue=True)

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


def _broken(connection: Any) -> bool:
    """Whether the connection is gone. aio-pika leaves ``is_closed`` False when the broker
    closed it (a restart): ``connected`` is cleared then, so both are read."""
    return connection is None or connection.is_closed or not connection.connected.is_set()


def _amqp_message(incoming: Any) -> Any:
    """The inbox's view of a delivered AMQP message; its headers kept as text."""
    headers = {str(k): _header_text(v) for k, v in (incoming.headers or {}).items()}
    for name in ("content_type", "message_id"):
        if getattr(incoming, name, None):
            headers[f"amqp.{name}"] = str(getattr(incoming, name))
    try:
        attributes = envelope.from_amqp(
            incoming.headers,
            incoming.body,
            content_type=incoming.content_type,
            message_id=incoming.message_id,
        ).attributes
    except envelope.EnvelopeError:
        attributes = {}
    return Message(attributes=dict(attributes), body=bytes(incoming.body), headers=headers)


def _header_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)
