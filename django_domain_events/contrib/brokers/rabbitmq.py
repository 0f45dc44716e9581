"""RabbitMQ: a durable topic exchange ``to``, routing key the event's name, with
publisher confirms.

aio-pika rather than pika: pika's ``BlockingConnection`` waits for each confirm before
the next publish, one round trip per message; aio-pika sends the whole batch with every
confirm outstanding and awaits them together, on the process's broker loop. A message
RabbitMQ refuses closes the channel, failing every confirm still outstanding on it; the
rest of the batch is then sent again one message at a time on a new channel, so only
the refused message fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.exceptions import AMQPConnectionError, ChannelClosed, ConnectionClosed

from . import envelope
from .config import BrokerConfig
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
        try:
            self.connection = await aio_pika.connect(
                self.config.url, timeout=self.config.connect_timeout
            )
            await self._open_channel()
        except (TimeoutError, *_DOWN) as error:
            await self.close()
            raise BrokerDown(f"{type(error).__name__}: {error}") from error

    async def _open_channel(self) -> None:
        self.channel = await self.connection.channel(publisher_confirms=True)
        self.exchanges = {}

    async def _exchange(self, to: str) -> Any:
        if to not in self.exchanges:
            self.exchanges[to] = await self.channel.declare_exchange(
                to, aio_pika.ExchangeType.TOPIC, durable=True
            )
        return self.exchanges[to]

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        try:
            sends = [await self._send(message) for message in messages]
        except Exception as error:  # the declaration refused, or the connection broke
            return await self._one_by_one(messages, error)
        replies = await asyncio.gather(*sends, return_exceptions=True)
        results: Confirmations = [self._result(reply) for reply in replies]
        if all(result is None for result in results):
            return results
        if self._broken():
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
        return exchange.publish(
            body,
            routing_key=message.envelope.type,
            mandatory=False,
            timeout=self.config.confirm_timeout,
        )

    def _result(self, reply: Any) -> BaseException | None:
        if not isinstance(reply, BaseException):
            return None
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
                await (await self._send(message))
                results.append(None)
            except (ChannelClosed, aio_pika.exceptions.DeliveryError) as refused:
                results.append(Refused(f"RabbitMQ refused it: {refused}"))
            except Exception as other:
                error = other
                if self._broken():
                    results.append(BrokerDown(f"{type(other).__name__}: {other}"))
                else:
                    results.append(Refused(f"RabbitMQ refused it: {other}"))
        return results

    def _broken(self) -> bool:
        return self.connection is None or self.connection.is_closed

    async def close(self) -> None:
        connection, self.connection, self.channel = self.connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                await connection.close()
