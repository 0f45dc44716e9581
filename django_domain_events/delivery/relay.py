"""Passes over the owed rows: ``deliver_one``, ``deliver_pending`` and the relay loop.

A pass visits each lane in sorted order, claims one batch there just before running
it, and runs the batch row by row (``run.attempt``). ``run_relay`` repeats passes,
waiting between them on LISTEN/NOTIFY or the poll, for as long as it is let.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from .. import clock, conf, tally
from ..declare import registry
from ..models import DeliveryStatus, LanePause
from ..retention import prune_events
from .claim import (
    Claim,
    claim_batch,
    database_alias,
    lane_lease,
    release,
    release_held,
    take_over,
)
from .run import attempt, expire_overdue, record_failure
from .run import logger as delivery_logger
from .tasks import hand_off
from .wake import Listener, wakes_by_notify

logger = logging.getLogger("django_domain_events.relay")

TALLY_COMPACT_SECONDS = 60.0  # how often a relay folds the scheduled tally's deltas

Counts = dict[DeliveryStatus, int]


def default_worker_id() -> str:
    """``host:pid``, unique among the relays of a deployment."""
    return f"{socket.gethostname()}:{os.getpid()}"


def empty_counts() -> Counts:
    return {status: 0 for status in DeliveryStatus}


def _parse_claimed_at(value: datetime | str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"claimed_at must be the ISO 8601 string the relay enqueued, not {value!r}."
        ) from None


def deliver_one(
    delivery_id: int,
    *,
    worker_id: str | None = None,
    claimed_by: str | None = None,
    claimed_at: datetime | str | None = None,
) -> DeliveryStatus | None:
    """Run one owed row now; None for a row that is not owed or not yet due.

    With ``claimed_by`` and ``claimed_at`` (a task worker), the row is first taken under
    exactly that claim; a duplicate or stale message runs nothing. Returns ``PENDING``
    when the receiver answered ``NotYet``.
    """
    if (claimed_by is None) != (claimed_at is None):
        raise TypeError("deliver_one() takes claimed_by and claimed_at together, or neither.")
    worker = worker_id or default_worker_id()
    now = clock.now()
    if claimed_by is not None and claimed_at is not None:
        claim = take_over(
            delivery_id,
            claimed_by=claimed_by,
            claimed_at=_parse_claimed_at(claimed_at),
            worker_id=worker,
            now=now,
            lease=lane_lease(None),
        )
        if claim is None:
            delivery_logger.info(
                "Delivery %s: the claim %s at %s no longer holds the row (a duplicate, late "
                "or stale message); nothing run.",
                delivery_id,
                claimed_by,
                claimed_at,
            )
            return None
    else:
        claims = claim_batch(
            worker_id=worker, now=now, lease=lane_lease(None), limit=1, ids=[delivery_id]
        )
        if not claims:
            return None
        claim = claims[0]
    status, _ = attempt(claim, now=now)
    return status


@dataclass
class _Pass:
    """What one call of ``deliver_pending``, or one relay, keeps between batches.

    A lane set aside by ``RetryAfter(counts=False)`` stays aside for the rest of a
    ``deliver_pending`` call; a relay pauses it for the time asked, recorded in
    ``LanePause`` for operators.
    """

    worker_id: str
    now: datetime | None
    ignore_backoff: bool
    relay: bool = False
    counts: Counts = field(default_factory=empty_counts)
    excluded: set[int] = field(default_factory=set)
    paused_until: dict[str, float] = field(default_factory=dict)  # lane -> monotonic
    stop: Callable[[], bool] = lambda: False
    claimed: int = 0

    def pause(self, lane: str, seconds: float) -> None:
        self.paused_until[lane] = time.monotonic() + seconds
        if self.relay:
            record_pause(lane, self.worker_id, seconds)

    def lane_paused(self, lane: str) -> bool:
        until = self.paused_until.get(lane)
        if until is None:
            return False
        if self.relay and time.monotonic() >= until:
            del self.paused_until[lane]
            end_pause(lane, self.worker_id)
            return False
        return True


def record_pause(lane: str, worker_id: str, seconds: float) -> None:
    """Show the pause to operators; clears pauses whose relay never came back to end them."""
    now = clock.now()
    alias = database_alias()
    pauses = LanePause.objects.using(alias)
    pauses.filter(until__lt=now).delete()
    pauses.update_or_create(
        lane=lane,
        worker_id=worker_id,
        defaults={"paused_at": now, "until": now + timedelta(seconds=seconds)},
    )


def end_pause(lane: str, worker_id: str) -> None:
    LanePause.objects.using(database_alias()).filter(lane=lane, worker_id=worker_id).delete()


def _batch_size(lane: str, batch_size: int | None, lane_batch_sizes: Mapping[str, int]) -> int:
    return lane_batch_sizes.get(lane) or batch_size or conf.get().BATCH_SIZE


def check_sizes(batch_size: int | None, lane_batch_sizes: Mapping[str, int] | None) -> None:
    """Refuse a batch size below one, naming it."""
    for name, size in [("batch_size", batch_size), *(lane_batch_sizes or {}).items()]:
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"batch size for {name!r} must be a whole number >= 1, not {size!r}.")


def deliver_pending(
    limit: int | None = None,
    *,
    worker_id: str = "deliver_pending",
    ignore_backoff: bool = False,
    lane: str | None = None,
    batch_size: int | None = None,
    lane_batch_sizes: Mapping[str, int] | None = None,
    now: datetime | None = None,
) -> Counts:
    """Claim and deliver until nothing is claimable (or ``limit`` rows), every lane in turn.

    ``now`` is the moment every claim of the call is made at; receivers still run on the
    real clock. Returns the count of each outcome recorded; a task hand-off is not counted.
    """
    check_sizes(batch_size, lane_batch_sizes)
    if limit is not None and limit < 0:
        raise ValueError(f"deliver_pending(limit=) must be >= 0 or None, not {limit!r}.")
    state = _Pass(worker_id, clock.normalize(now) if now is not None else None, ignore_backoff)
    lanes = [lane] if lane is not None else list(registry.lanes())
    while limit is None or state.claimed < limit:
        before = state.claimed
        for name in lanes:
            room = None if limit is None else limit - state.claimed
            if room == 0:
                break
            run_lane_batch(state, name, _batch_size(name, batch_size, lane_batch_sizes or {}), room)
        if state.claimed == before:
            break
    return state.counts


def run_lane_batch(state: _Pass, lane: str, size: int, room: int | None = None) -> int:
    """Claim one batch in ``lane`` and run it; returns how many rows were claimed."""
    if state.lane_paused(lane):
        return 0
    now = state.now if state.now is not None else clock.now()
    claims = claim_batch(
        worker_id=state.worker_id,
        now=now,
        lease=lane_lease(lane),
        limit=size if room is None else min(size, room),
        lane=lane,
        exclude_ids=state.excluded,
        ignore_backoff=state.ignore_backoff,
    )
    state.claimed += len(claims)
    run_batch(state, lane, claims, now)
    return len(claims)


def run_batch(state: _Pass, lane: str, claims: Sequence[Claim], now: datetime) -> None:
    """Run a claimed batch in order; hand back the unstarted rest on a pause or a stop."""
    decoded: dict[int, Any] = {}
    for index, claim in enumerate(claims):
        if state.stop():
            release(claims[index:])
            return
        receiver = registry.receiver(claim.receiver_key)
        if receiver is not None and receiver.durable and receiver.site == "task":
            try:
                hand_off(claim)
            except Exception as error:  # no backend, or the queue refused: a failed attempt
                status, outcome = record_failure(claim, receiver, error, now=now)
            else:
                if state.now is not None:
                    state.excluded.add(claim.id)
                continue
        else:
            status, outcome = attempt(claim, now=now, decoded=decoded)
        if status is not None:
            state.counts[status] += 1
        if status is DeliveryStatus.PENDING and state.now is not None:
            state.excluded.add(claim.id)
        if status is DeliveryStatus.FAILED and state.ignore_backoff and claim.max_attempts is None:
            # Unbounded attempts end by lifetime, not count: once per call, or it would spin.
            state.excluded.add(claim.id)
        if outcome is not None and outcome.pause_seconds > 0:
            state.pause(lane, outcome.pause_seconds)
            release(claims[index + 1 :])
            return


# The long-running loop --------------------------------------------------------


class _Signals:
    """SIGTERM/SIGINT: the first finishes the delivery in hand, the second exits at once."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            os._exit(128 + signum)
        self.received = signum
        logger.info("Signal %s: finishing the delivery in hand, then stopping.", signum)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def check_lanes(lanes: Iterable[str]) -> list[str]:
    """The lanes, sorted; refuses one that no receiver declares."""
    declared = registry.lanes()
    chosen = sorted(set(lanes))
    for lane in chosen:
        if lane not in declared:
            raise ValueError(
                f"No receiver declares lane {lane!r}; declared lanes are "
                f"{', '.join(sorted(declared))}. Check the spelling, or declare "
                f"@receiver(..., lane={lane!r})."
            )
    return chosen


def run_relay(
    *,
    worker_id: str | None = None,
    passes: int | None = None,
    stop: Callable[[], bool] | threading.Event | None = None,
    lane: str | Sequence[str] = "default",
    batch_size: int | None = None,
    lane_batch_sizes: Mapping[str, int] | None = None,
    limit: int | None = None,
    prune: Callable[[], object] | None = prune_events,
    once: bool = False,
) -> Counts:
    """Deliver owed rows until stopped: the loop behind ``manage.py deliver_events``.

    Waits on LISTEN/NOTIFY where available with ``POLL_SECONDS`` as the floor; survives
    the database going away; on SIGTERM/SIGINT hands back the unstarted rest of its batch
    and returns. ``once`` returns as soon as a pass finds nothing owed, instead of waiting;
    ``passes`` returns after that many passes; ``limit`` after that many rows. When idle it
    calls ``prune`` (``prune_events`` unless given; ``None`` for none) at most every
    ``RELAY_PRUNE_SECONDS``, if ``RELAY_PRUNE``.
    """
    lanes = check_lanes([lane] if isinstance(lane, str) else lane)
    check_sizes(batch_size, lane_batch_sizes)
    for name in lane_batch_sizes or {}:
        if name not in lanes:
            raise ValueError(f"lane {name!r} has a batch size but this relay does not serve it.")
    signals = _Signals()
    on_main_thread = signals.install()
    if not on_main_thread and passes is None:
        logger.info("Relay started off the main thread: signals are not handled here.")
    stop_event = stop if isinstance(stop, threading.Event) else None

    def stopping() -> bool:
        if signals.received is not None:
            return True
        if stop_event is not None:
            return stop_event.is_set()
        return bool(stop()) if callable(stop) else False

    state = _Pass(worker_id or default_worker_id(), None, False, relay=True, stop=stopping)
    try:
        return _loop(state, lanes, passes, batch_size, lane_batch_sizes or {}, limit, prune, once)
    finally:
        if on_main_thread:
            signals.restore()
        with contextlib.suppress(DatabaseError, InterfaceError):
            LanePause.objects.using(database_alias()).filter(worker_id=state.worker_id).delete()


def _loop(
    state: _Pass,
    lanes: list[str],
    passes: int | None,
    batch_size: int | None,
    lane_batch_sizes: Mapping[str, int],
    limit: int | None,
    prune: Callable[[], object] | None,
    once: bool,
) -> Counts:
    settings = conf.get()
    alias = database_alias()
    listener = Listener(alias) if wakes_by_notify(alias) else None
    outage_pause = min(settings.POLL_SECONDS, 2.0)
    last_prune = last_activity = last_compact = float("-inf")
    done = 0
    try:
        while not state.stop() and (passes is None or done < passes):
            if limit is not None and state.claimed >= limit:
                break
            try:
                claimed = 0
                for name in lanes:
                    if state.stop():
                        break
                    room = None if limit is None else limit - state.claimed
                    if room == 0:
                        break
                    size = _batch_size(name, batch_size, lane_batch_sizes)
                    claimed += run_lane_batch(state, name, size, room)
                outage_pause = min(settings.POLL_SECONDS, 2.0)
            except (DatabaseError, InterfaceError) as error:
                logger.warning(
                    "Relay %s lost the database (%s); retrying in %.1fs.",
                    state.worker_id,
                    error,
                    outage_pause,
                )
                _close(alias, listener)
                time.sleep(outage_pause)
                outage_pause = min(outage_pause * 2, 2.0)
                _release_held(state.worker_id)
                continue
            done += 1
            if time.monotonic() - last_compact >= TALLY_COMPACT_SECONDS:
                last_compact = time.monotonic()
                _compact_tally(alias)
            if once and not claimed:
                break
            if claimed:
                last_activity = time.monotonic()
            if claimed or state.stop() or (passes is not None and done >= passes):
                continue
            # Senders hold back NOTIFYs for NOTIFY_COALESCE_SECONDS after each one, so
            # right after activity the relay looks often instead of waiting to be woken.
            if time.monotonic() - last_activity < settings.NOTIFY_COALESCE_SECONDS:
                _wait(listener, min(settings.POLL_SECONDS, 0.05), state)
                continue
            prune_now = (
                prune is not None
                and settings.RELAY_PRUNE
                and time.monotonic() - last_prune >= settings.RELAY_PRUNE_SECONDS
            )
            if prune_now:
                last_prune = time.monotonic()
            _idle_work(prune if prune_now else None)
            if _wait(listener, settings.POLL_SECONDS, state):
                last_activity = time.monotonic()
    finally:
        _close(alias, listener)
    return state.counts


def _idle_work(prune: Callable[[], object] | None) -> None:
    """What a relay does when a pass found nothing: expire overdue rows, maybe prune."""
    try:
        expire_overdue()
        if prune is not None:
            prune()
    except Exception:
        logger.exception("The relay's idle work (expiry sweep, prune) failed; it will retry.")


def _compact_tally(alias: str) -> None:
    """Fold the scheduled tally's deltas, busy or idle, so health stays a few rows' read."""
    try:
        tally.compact(alias)
    except Exception:
        logger.exception("The relay could not compact the scheduled tally; it will retry.")


def _wait(listener: Listener | None, poll: float, state: _Pass) -> bool:
    """Sleep until woken (True), the poll interval passes, a pause ends, or a stop arrives."""
    timeout = poll
    if state.paused_until:
        timeout = max(0.0, min(timeout, min(state.paused_until.values()) - time.monotonic()))
    deadline = time.monotonic() + timeout
    while not state.stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        step = min(left, 0.25)
        if listener is not None:
            try:
                if listener.wait(step):
                    return True
            except Exception:
                listener.close()
                time.sleep(step)
        else:
            time.sleep(step)
    return False


def _close(alias: str, listener: Listener | None) -> None:
    if listener is not None:
        listener.close()
    with contextlib.suppress(Exception):
        connections[alias].close()


def _release_held(worker_id: str) -> None:
    """After an outage, hand back the rows this relay still holds, so they run at once."""
    try:
        count = release_held(worker_id)
    except (DatabaseError, InterfaceError):
        return
    if count:
        logger.info("Relay %s released %s rows it held before the outage.", worker_id, count)
