"""The relay's event loop: one per relay, for its life, shared by its ``async def``
receivers and ``on_failure`` hooks at every concurrency.

``on_relay_loop`` runs the relay's body through asgiref: ``async_to_sync`` runs a loop in
a thread of its own while the body runs back in the calling thread
(``sync_to_async(thread_sensitive=True)``), which keeps its connection and signal
handlers. asgiref then sends each ``async_to_sync`` call made in that thread, or in a
worker started from the loop (``pool.LaneWorkers``), to that loop, and the calling thread
runs the coroutine's thread-sensitive calls (the ORM's) itself, inside its delivery's
``atomic()`` block. So ``run.call_receiver`` and ``run.call_hook`` are unchanged, and
``deliver_pending()`` outside a relay keeps asgiref's loop per call.

The loop is asgiref's, not one of ours, because no public API sends a thread's
``async_to_sync`` calls to a loop that did not start that thread. When the body returns,
the loop cancels what is left on it (a task a receiver left running) and closes, as
``asyncio.run`` does.

A task a receiver leaves running may go on with async I/O for the relay's life (a
shared client's background task), but it must not use the ORM once its receiver has
returned: asgiref runs the query on the relay's thread when that thread is next free
for it, inside a later delivery's transaction or only as the relay stops.
``refusing_detached`` makes such a query fail loudly when it comes to run, naming the
receiver (``ReceiverCall``, carried by the task's context); a query queued before the
body returned runs (and is refused) before the loop cancels its task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

T = TypeVar("T")

logger = logging.getLogger("django_domain_events.relay")


@dataclass(frozen=True)
class ReceiverCall:
    """One call of an ``async def`` receiver; ``returned`` once its coroutine is over.
    Tasks it starts copy it with their context, so their queries can be traced to it."""

    key: str
    returned: list[bool] = field(default_factory=list)  # a flag the frozen call can set


_CALL: contextvars.ContextVar[ReceiverCall | None] = contextvars.ContextVar(
    "django_domain_events_receiver_call", default=None
)


def as_receiver_call(key: str, func: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """``func``, marking what runs in its context (the tasks it starts) as ``key``'s call."""

    @functools.wraps(func)
    async def call(*args: Any) -> T:
        mine = ReceiverCall(key)
        token = _CALL.set(mine)
        try:
            return await func(*args)
        finally:
            mine.returned.append(True)
            _CALL.reset(token)  # asgiref copies the context back to the caller: not this

    return call


class DetachedTaskQuery(RuntimeError):
    """A task an ``async def`` receiver left running used the database after it returned."""


def _refuse_detached(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
    call = _CALL.get()
    if call is not None and call.returned:
        message = (
            f"A task that receiver {call.key} started and left running on the relay's event "
            "loop used the database after the receiver returned; the query was refused, as "
            "it would run outside the delivery it belongs to. Await every task that uses "
            "the ORM before the receiver returns (asyncio.gather, asyncio.TaskGroup)."
        )
        logger.error(message)
        raise DetachedTaskQuery(message)
    return execute(sql, *args)


@contextlib.contextmanager
def refusing_detached(alias: str) -> Iterator[None]:
    """While it lasts, this thread's connection to ``alias`` refuses the queries of
    tasks whose receiver has returned."""
    with connections[alias].execute_wrapper(_refuse_detached):
        yield


def on_relay_loop(body: Callable[[asyncio.AbstractEventLoop], T]) -> T:
    """``body(loop)`` in this thread, while ``loop`` runs in another until it returns."""

    async def host() -> T:
        result = await sync_to_async(body, thread_sensitive=True)(asyncio.get_running_loop())
        # The queries left tasks queued for this thread meanwhile come first in its queue:
        # once this no-op has run, each was refused and logged, not cancelled unseen with
        # its task as the loop closes.
        await sync_to_async(_nothing, thread_sensitive=True)()
        return result

    return async_to_sync(host, force_new_loop=True)()


def _nothing() -> None:
    """A call that only waits its turn on the relay's thread."""
