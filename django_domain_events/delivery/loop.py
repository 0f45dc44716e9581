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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import async_to_sync, sync_to_async

T = TypeVar("T")


def on_relay_loop(body: Callable[[asyncio.AbstractEventLoop], T]) -> T:
    """``body(loop)`` in this thread, while ``loop`` runs in another until it returns."""

    async def host() -> T:
        return await sync_to_async(body, thread_sensitive=True)(asyncio.get_running_loop())

    return async_to_sync(host, force_new_loop=True)()
