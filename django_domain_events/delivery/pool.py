"""Several deliveries at once inside one relay: a lane's worker threads.

Each worker thread runs one claimed row at a time in its own transaction on its own
database connection, so a slow receiver holds back only its own slot. The relay claims
no more rows for a lane than it has free slots, so no claimed row waits behind a slow
one while its lease runs, and every row of a claim starts at once (``at_once``: a crash
charges each row still held, ``lapse.py``); each row's lease is renewed when it starts
and kept alive while it runs, as in a relay that runs one row at a time. A row charged
for a lapse runs alone: claimed only when no slot of any lane is busy, and nothing is
claimed beside it until it is done.

The workers are started from the relay's event loop (``loop.on_relay_loop``), through
``sync_to_async``, so that an ``async def`` receiver's coroutine runs on that loop, beside
the other slots', while its ORM calls come back to its worker's thread and transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from .. import clock
from ..models import database_alias
from .claim import claim_batch, release
from .claim_rows import Claim
from .lease import lane_lease
from .loop import refusing_detached
from .outage import is_outage
from .passes import Pass, Result, batch_size_of, run_one

logger = logging.getLogger("django_domain_events.relay")


@dataclass(frozen=True)
class Done:
    """One claim a worker finished with: what it answered, or what escaped it."""

    lane: str
    claim: Claim
    result: Result = None
    error: BaseException | None = None


class LaneWorkers:
    """``size`` threads running the claims of one lane, one claim each at a time.

    Each thread runs one ``_work`` call for the relay's life, awaited on ``loop``: asgiref
    then sends the ``async_to_sync`` calls made in that thread to ``loop``.
    """

    def __init__(
        self,
        lane: str,
        size: int,
        run: Callable[[Claim], Result],
        done: queue.Queue[Done],
        wake: threading.Event,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.lane = lane
        self.size = size
        self._run = run
        self._done = done
        self._wake = wake
        self._todo: queue.Queue[Claim | None] = queue.Queue()
        self._lock = threading.Lock()
        self._busy = 0  # claims submitted and not yet done
        self._running: dict[int, Claim] = {}  # by delivery id: the claims workers run now
        # Each _work call holds its thread until close(), so size calls take size threads.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=f"relay {lane}"
        )
        work = sync_to_async(self._work, thread_sensitive=False, executor=self._threads)
        # Each starts in an empty context, as a new thread does: under asgiref 3.8, copies
        # of the relay thread's context would share the storage of asgiref's Locals, and a
        # worker's receiver could send its ORM calls to another worker's thread.
        self._workers = [
            contextvars.Context().run(asyncio.run_coroutine_threadsafe, work(), loop)
            for _ in range(size)
        ]

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def free(self) -> int:
        return self.size - self.busy

    def submit(self, claims: Sequence[Claim]) -> None:
        with self._lock:
            self._busy += len(claims)
        for claim in claims:
            self._todo.put(claim)

    def take_back(self) -> list[Claim]:
        """The claims no worker has started: for the relay to hand back."""
        taken: list[Claim] = []
        while True:
            try:
                claim = self._todo.get_nowait()
            except queue.Empty:
                break
            if claim is not None:
                taken.append(claim)
        with self._lock:
            self._busy -= len(taken)
        return taken

    def running(self) -> list[Claim]:
        """The claims a worker is running right now."""
        with self._lock:
            return list(self._running.values())

    def close(self, *, wait: bool = True) -> None:
        """Stop the threads once they finish what they run; each closes its connections.
        Without ``wait``, threads still running a row are left to finish it."""
        for _ in self._workers:
            self._todo.put(None)
        if wait:
            concurrent.futures.wait(self._workers)
        self._threads.shutdown(wait=wait)

    def _work(self) -> None:
        try:
            with refusing_detached(database_alias()):
                self._serve()
        finally:
            connections.close_all()

    def _serve(self) -> None:
        while (claim := self._todo.get()) is not None:
            _close_spent_connections()
            with self._lock:
                self._running[claim.id] = claim
            try:
                done = Done(self.lane, claim, result=self._run(claim))
            except BaseException as error:  # for the relay to judge: outage or halt
                done = Done(self.lane, claim, error=error)
            self._done.put(done)
            with self._lock:
                self._busy -= 1
                self._running.pop(claim.id, None)
            self._wake.set()


def _close_spent_connections() -> None:
    """Before each row, as Django's request cycle does: close this thread's connections
    that broke (``CONN_HEALTH_CHECKS``) or passed a positive ``CONN_MAX_AGE``, so the row
    opens new ones.

    ``CONN_MAX_AGE = 0``, Django's default, means "close at the end of each request"; a
    worker thread serves no request, so its connections then live as long as it does, as
    the relay's main thread's do. Closing them per row would open a database connection
    for every row (3 ms on a local PostgreSQL, more than the row's own work).
    """
    for connection in connections.all(initialized_only=True):
        if connection.settings_dict["CONN_MAX_AGE"] == 0:
            connection.close_at = None
        connection.close_if_unusable_or_obsolete()


class Pools:
    """The worker threads of a relay that runs several deliveries at once, per lane.

    The main thread claims as many rows as a lane has free slots and counts what the
    workers report; the workers only run rows.
    """

    def __init__(
        self,
        lanes: Sequence[str],
        sizes: Mapping[str, int],
        loop: asyncio.AbstractEventLoop,
        shutdown_timeout: float | None = None,
    ) -> None:
        self.shutdown_timeout = shutdown_timeout  # how long a drain waits; None: for ever
        self.done: queue.Queue[Done] = queue.Queue()
        self.wake = threading.Event()  # set when a worker finishes a row
        self.lanes = {
            lane: LaneWorkers(lane, sizes[lane], self._run, self.done, self.wake, loop)
            for lane in lanes
        }
        self.alone: set[int] = set()  # the row running alone, if any

    @staticmethod
    def _run(claim: Claim) -> Result:
        return run_one(claim, clock.now())

    def busy(self) -> bool:
        return any(workers.busy for workers in self.lanes.values())

    def fill(
        self,
        state: Pass,
        batch_size: int | None,
        lane_batch_sizes: Mapping[str, int],
        limit: int | None,
    ) -> int:
        """Count what finished, then claim for every free slot; returns rows claimed."""
        self.collect(state)
        if self.alone:
            return 0
        claimed = 0
        for lane, workers in self.lanes.items():
            room = workers.free()
            if limit is not None:
                room = min(room, limit - state.claimed)
            if room <= 0 or not state.may_go_on(lane):
                continue
            claims = claim_batch(
                worker_id=state.worker_id,
                now=clock.now(),
                lease=lane_lease(lane),
                limit=min(room, batch_size_of(lane, batch_size, lane_batch_sizes)),
                lane=lane,
                at_once=True,
                alone_ok=not claimed and not self.busy(),
            )
            state.claimed += len(claims)
            claimed += len(claims)
            self.alone.update(claim.id for claim in claims if claim.alone)
            workers.submit(claims)
            if self.alone:
                break
        return claimed

    def collect(self, state: Pass) -> None:
        """Count the rows the workers finished; raise what escaped one, once the others
        are done, leaving every row not settled in ``state.in_hand`` to hand back. Every
        error that escaped a worker is logged, not only the one raised."""
        errors: list[BaseException] = []
        for done in self._finished():
            if done.error is not None:
                errors.append(_report(done))
                state.in_hand.append(done.claim)
            elif done.result is not None and (pause := state.note(done.claim, *done.result)):
                state.pause(done.lane, pause)
                self._give_back(state, self.lanes[done.lane].take_back())
        if errors:
            self.drain(state)
            raise errors[0]

    def drain(self, state: Pass) -> list[Claim]:
        """Hand back the rows no worker started, and wait for the rows being run, for
        ``shutdown_timeout`` at most; returns the claims still running then."""
        for workers in self.lanes.values():
            self._give_back(state, workers.take_back())
        timeout = self.shutdown_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.busy() and (deadline is None or time.monotonic() < deadline):
            self.wake.wait(0.1)
            self.wake.clear()
        for done in self._finished():
            if done.error is not None:
                _report(done)
                state.in_hand.append(done.claim)
            elif done.result is not None:
                state.note(done.claim, *done.result)
        return [claim for workers in self.lanes.values() for claim in workers.running()]

    def close(self, state: Pass, worker_id: str = "") -> None:
        """Finish the rows being run, hand back the rest, and end the threads; rows still
        running after ``shutdown_timeout`` are left to their threads, and said."""
        left = self.drain(state)
        if left:
            logger.error(
                "Relay %s gave up waiting for %s rows at its shutdown timeout (%ss): "
                "%s. They keep their claim until their lease lapses, then another relay "
                "takes them over, counting the attempt.",
                worker_id,
                len(left),
                self.shutdown_timeout,
                ", ".join(f"delivery {c.id} to {c.receiver_key}" for c in left),
                extra={"worker_id": worker_id, "delivery_ids": [c.id for c in left]},
            )
        for workers in self.lanes.values():
            workers.close(wait=not left)

    def _give_back(self, state: Pass, claims: list[Claim]) -> None:
        self.alone.difference_update(claim.id for claim in claims)
        give_back(state, claims)

    def _finished(self) -> list[Done]:
        found: list[Done] = []
        while True:
            try:
                done = self.done.get_nowait()
            except queue.Empty:
                return found
            self.alone.discard(done.claim.id)
            found.append(done)


def _report(done: Done) -> BaseException:
    """Log what escaped a worker, naming its row; returns the error."""
    error = done.error
    assert error is not None
    logger.log(
        logging.WARNING if is_outage(error, database_alias()) else logging.ERROR,
        "A relay worker stopped on delivery %s to %s: %s: %s. The row is handed back uncharged.",
        done.claim.id,
        done.claim.receiver_key,
        type(error).__name__,
        error,
        exc_info=None if isinstance(error, DatabaseError | ImproperlyConfigured) else error,
        extra={"delivery_id": done.claim.id, "receiver": done.claim.receiver_key},
    )
    return error


def give_back(state: Pass, claims: list[Claim]) -> None:
    """Hand back claims no worker started; while the database is away, keep them in
    ``state.in_hand`` for the relay to hand back once it is back."""
    try:
        release(claims)
    except Exception:
        state.in_hand.extend(claims)
