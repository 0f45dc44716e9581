"""The relay: ``run_relay``, the loop behind ``manage.py deliver_events``.

It repeats passes (``passes.run_pass``, or ``pool.Pools`` with concurrency), waiting
between them on LISTEN/NOTIFY or the poll, for as long as it is let, beside the event
loop its ``async def`` receivers share (``loop.on_relay_loop``).

The relay rides out an outage (``outage.is_outage``): it waits, reconnects and hands
back the rows it held. Any other error, and a configuration that cannot be loaded,
stops it with ``RelayHalted`` and one ERROR line saying what to do, after handing back
what it held uncharged: an error that waiting cannot fix must not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from .. import clock, conf, tally
from ..models import DeliveryStatus, LanePauseRecord, database_alias
from ..retention import prune_events
from . import limits
from .claim import release
from .loop import on_relay_loop, refusing_detached
from .outage import is_outage
from .passes import (
    Counts,
    Pass,
    default_worker_id,
    run_pass,
)
from .pool import Pools
from .relay_options import (
    check_configuration,
    check_relay_options,
    check_shutdown_timeout,
    lane_slots,
    refuse_concurrency_on_sqlite,
)
from .run import expire_overdue
from .ticks import Ticker
from .wake import Listener, wakes_by_notify

logger = logging.getLogger("django_domain_events.relay")

TALLY_COMPACT_SECONDS = 60.0  # how often a relay folds the scheduled tally's deltas
CLOCK_CHECK_SECONDS = 60.0  # how often a relay measures its clock against the database's


class RelayHalted(RuntimeError):
    """The relay stopped on an error that waiting cannot fix; the message says what to do.

    Raised by ``run_relay`` (``deliver_events`` exits non-zero with it) after the rows it
    held were handed back uncharged. The original error is its ``__cause__``.
    """


def relay_worker_id() -> str:
    """``host:pid:token``: unique among relays, even two in one process."""
    return f"{default_worker_id()}:{secrets.token_hex(3)}"


# The long-running loop --------------------------------------------------------


class _Signals:
    """SIGTERM/SIGINT: the first finishes the delivery in hand, the second exits at once.

    With a shutdown timeout, the first also starts a watchdog: a relay still not stopped
    when it runs out (a receiver that hangs) exits the process, leaving the rows it runs
    to lapse and be taken over like a dead relay's.
    """

    def __init__(self, worker_id: str = "", shutdown_timeout: float | None = None) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self.worker_id = worker_id
        self._timeout = shutdown_timeout

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
        if self._timeout is not None:
            # A second more than the drain waits, so that a relay running rows at once
            # names the rows it leaves before the watchdog ends it.
            watchdog = threading.Timer(self._timeout + 1.0, self._expire)
            watchdog.daemon = True
            watchdog.start()

    def _expire(self) -> None:
        logger.error(
            "Relay %s did not stop within its shutdown timeout (%ss): exiting now. The "
            "rows it was running keep their claim until their lease lapses, then another "
            "relay takes them over, counting the attempt.",
            self.worker_id,
            self._timeout,
            extra={"worker_id": self.worker_id},
        )
        logging.shutdown()  # flush the handlers: os._exit skips them
        os._exit(1)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


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
    concurrency: int | None = None,
    lane_concurrency: Mapping[str, int] | None = None,
    shutdown_timeout: float | None = None,
) -> Counts:
    """Deliver owed rows until stopped: the loop behind ``manage.py deliver_events``.

    Waits on LISTEN/NOTIFY where available with ``POLL_SECONDS`` as the floor; rides out
    the database going away; on SIGTERM/SIGINT hands back the unstarted rest of its batch
    and returns. On the main thread it owns the process until it returns: it takes those
    signals and switches threads every ``SWITCH_INTERVAL_SECONDS``. ``once`` returns as
    soon as a pass finds nothing owed, instead of waiting; ``passes`` returns after that
    many passes; ``limit`` after that many rows. When idle it calls ``prune``
    (``prune_events`` unless given; ``None`` for none) at most every
    ``RELAY_PRUNE_SECONDS``, if ``RELAY_PRUNE``. ``concurrency`` (default
    ``CONCURRENCY``) runs up to that many rows of each lane at once, each on its own
    connection; ``lane_concurrency`` sets it per lane. Its ``async def`` receivers and
    hooks share one event loop, for the relay's life. ``shutdown_timeout`` (default
    ``SHUTDOWN_TIMEOUT_SECONDS``; None waits for ever) bounds how long a stop waits for
    the rows being run: then the relay returns (or, stopped by a signal, exits the
    process), and those rows lapse to another relay. Raises ``RelayHalted`` on an error
    that waiting cannot fix, ``ImproperlyConfigured`` or ``ValueError`` before starting.
    """
    lanes = check_relay_options(lane, batch_size, lane_batch_sizes)
    slots = lane_slots(lanes, concurrency, lane_concurrency)
    alias = database_alias()
    refuse_concurrency_on_sqlite(alias, slots)
    check_configuration(lanes)
    timeout = check_shutdown_timeout(shutdown_timeout)
    plan = _Plan(
        lanes, slots, passes, batch_size, lane_batch_sizes or {}, limit, prune, once, timeout
    )
    signals = _Signals(worker_id or relay_worker_id(), timeout)
    with _one_relay_on_sqlite(alias):
        state = Pass(signals.worker_id, None, False, relay=True, stop=_stopping(signals, stop))
        opened = connections[alias].connection is None  # else it is the caller's: left open
        on_main_thread = signals.install()
        try:  # from the install on: whatever escapes, the caller's handlers come back
            _log_start(state.worker_id, lanes, slots, alias, on_main_thread)
            # Until the loop closes: a task a receiver left may run its query at the end.
            with refusing_detached(alias), _switching_often(on_main_thread):
                on_relay_loop(lambda loop: _Loop(plan, state, loop).run())
        finally:
            if on_main_thread:
                signals.restore()
            _clean_up(alias, state.worker_id, close=opened)
        _log_stop(state, plan)
        return state.counts


# Python hands its lock (the GIL) from thread to thread every 5 ms by default, so a
# relay's thread that waited on a database reply while its broker client's thread, or a
# receiver's, ran Python waits up to that long again at each reply: several times per
# batch. A relay that owns its process (on the main thread) switches every millisecond:
# one relay publishing to NATS and Redis gained 7 and 4 % (bench/README.md section 14,
# "sixth pass"); a switch costs microseconds.
SWITCH_INTERVAL_SECONDS = 0.001


@contextlib.contextmanager
def _switching_often(owns_process: bool) -> Iterator[None]:
    """``SWITCH_INTERVAL_SECONDS`` while the relay runs, when it owns the process; the
    caller's interval back after."""
    previous = sys.getswitchinterval()
    if owns_process:
        sys.setswitchinterval(min(previous, SWITCH_INTERVAL_SECONDS))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _stopping(
    signals: _Signals, stop: Callable[[], bool] | threading.Event | None
) -> Callable[[], bool]:
    """Whether to stop: a signal arrived, the event is set, or ``stop()`` says so."""
    if isinstance(stop, threading.Event):
        event = stop
        return lambda: signals.received is not None or event.is_set()
    if callable(stop):
        asked = stop
        return lambda: signals.received is not None or bool(asked())
    return lambda: signals.received is not None


def _clean_up(alias: str, worker_id: str, *, close: bool) -> None:
    """Drop the relay's lane pauses, and the connection it opened (not a caller's)."""
    with contextlib.suppress(Exception):
        LanePauseRecord.objects.using(alias).filter(worker_id=worker_id).delete()
    if close:
        with contextlib.suppress(Exception):
            connections[alias].close()


def _log_stop(state: Pass, plan: _Plan) -> None:
    done = ", ".join(f"{state.counts[s]} {s.value}" for s in DeliveryStatus if state.counts[s])
    logger.info(
        "Relay %s stopped: %s.",
        state.worker_id,
        done or "nothing delivered",
        extra={"worker_id": state.worker_id, "lanes": plan.lanes, "concurrency": dict(plan.slots)},
    )


def _log_start(
    worker_id: str, lanes: Sequence[str], slots: Mapping[str, int], alias: str, main: bool
) -> None:
    settings = conf.get()
    if wakes_by_notify(alias):
        wake = "woken by LISTEN/NOTIFY"
    elif settings.WAKE == "poll":
        wake = "polling (WAKE='poll')"
    elif connections[alias].vendor != "postgresql":
        wake = f"polling ({connections[alias].vendor} has no LISTEN/NOTIFY)"
    else:
        wake = "polling (psycopg 3 is not installed, so it cannot LISTEN)"
    logger.info(
        "Relay %s started: lanes %s, %s, every %ss at the latest%s.",
        worker_id,
        ", ".join(lane if slots[lane] == 1 else f"{lane} (x{slots[lane]})" for lane in lanes),
        wake,
        settings.POLL_SECONDS,
        "" if main else "; off the main thread, so signals are not handled here",
        extra={"worker_id": worker_id, "lanes": list(lanes), "concurrency": dict(slots)},
    )


@contextlib.contextmanager
def _one_relay_on_sqlite(alias: str) -> Iterator[None]:
    """Refuse a second relay on one SQLite file: it has one writer, so a second relay
    only waits on locks. A lock file beside the database says who runs; the operating
    system drops it when the process ends, however it ends."""
    connection = connections[alias]
    name = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor != "sqlite" or not name or name == ":memory:" or "mode=memory" in name:
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows: nothing enforces it; docs/relay.md says one relay
        yield
        return
    path = Path(f"{name}.relay-lock")
    try:
        handle = path.open("a+")
    except OSError:  # a read-only directory: the relay cannot write the database either
        yield
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RelayHalted(
                f"Another relay ({holder}) is already running on the SQLite database {name}. "
                "SQLite has a single writer, so it takes one relay: stop the other one, or "
                "move to PostgreSQL to run several."
            ) from None
        handle.truncate(0)
        handle.write(default_worker_id())
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class _Plan:
    """What a relay was asked to do, once ``run_relay`` checked it."""

    lanes: list[str]
    slots: Mapping[str, int]
    passes: int | None
    batch_size: int | None
    lane_batch_sizes: Mapping[str, int]
    limit: int | None
    prune: Callable[[], object] | None
    once: bool
    shutdown_timeout: float | None

    @property
    def several(self) -> bool:
        """Whether some lane runs rows at once (``pool.Pools``) rather than one by one."""
        return any(n > 1 for n in self.slots.values())

    def passes_done(self, done: int) -> bool:
        return self.passes is not None and done >= self.passes

    def let_go(self, state: Pass, done: int) -> bool:
        """Whether the relay ran the passes or claimed the rows it was let."""
        return self.passes_done(done) or (self.limit is not None and state.claimed >= self.limit)


class _Loop:
    """Pass after pass until stopped, in the relay's thread, and what it does between them.

    ``loop`` is the relay's event loop (``on_relay_loop``), on which its worker slots are
    awaited. The ``last_*`` times are monotonic: when the relay last did each chore.
    """

    def __init__(self, plan: _Plan, state: Pass, loop: asyncio.AbstractEventLoop) -> None:
        self.plan = plan
        self.state = state
        self.settings = conf.get()
        self.alias = database_alias()
        self.listener = Listener(self.alias) if wakes_by_notify(self.alias) else None
        if self.listener is not None:
            self.listener.listen()  # before the first claim: nothing fired after it is missed
        self.pools = (
            Pools(plan.lanes, plan.slots, loop, plan.shutdown_timeout) if plan.several else None
        )
        self.ticker = Ticker()
        self.outage_pause = self._first_outage_pause()
        self.last_prune = self.last_activity = float("-inf")
        self.last_compact = self.last_clock = float("-inf")
        self.done = 0

    def run(self) -> None:
        try:
            while not self.state.stop() and not self.plan.let_go(self.state, self.done):
                found = self._pass()
                if found is None:
                    continue  # an outage, waited out: try again
                claimed, was_busy = found
                self.done += 1
                self._compact_when_due()
                busy = self.pools is not None and (was_busy or self.pools.busy())
                if self.plan.once and not claimed and not busy:
                    break
                self._between_passes(claimed, busy)
        finally:
            self._wind_down()

    def _pass(self) -> tuple[int, bool] | None:
        """Claim and run: the rows claimed (and ticks fired), and whether rows were
        running before the claim; None when the database went away (after waiting)."""
        try:
            self._synchronise_when_due()
            _hand_back(self.state)
            claimed, was_busy = self._claim()
            if not self.state.stop():
                claimed += self.ticker.look()  # a fired tick is work: deliver it next pass
        except Exception as error:
            self._ride_out(error)
            return None
        self.outage_pause = self._first_outage_pause()
        return claimed, was_busy

    def _claim(self) -> tuple[int, bool]:
        plan, state = self.plan, self.state
        if self.pools is None:
            return run_pass(
                state, plan.lanes, plan.batch_size, plan.lane_batch_sizes, plan.limit
            ), False
        self.pools.wake.clear()
        # Read before claiming: rows that finish during the claim must not make a pass
        # that found every slot full look idle.
        was_busy = self.pools.busy()
        return self.pools.fill(state, plan.batch_size, plan.lane_batch_sizes, plan.limit), was_busy

    def _ride_out(self, error: Exception) -> None:
        """Wait out an outage (doubling the pause up to 2s); halt on any other error."""
        if not is_outage(error, self.alias):
            _halt(self.state, error)
        logger.warning(
            "Relay %s lost the database (%s); retrying in %.1fs.",
            self.state.worker_id,
            error,
            self.outage_pause,
            extra={"worker_id": self.state.worker_id},
        )
        _close(self.alias, self.listener)
        time.sleep(self.outage_pause)
        self.outage_pause = min(self.outage_pause * 2, 2.0)

    def _first_outage_pause(self) -> float:
        return min(self.settings.POLL_SECONDS, 2.0)

    def _between_passes(self, claimed: int, busy: bool) -> None:
        """Claim again at once after work; otherwise wait, doing the idle chores first."""
        if claimed:
            self.last_activity = time.monotonic()
        if claimed or self.state.stop() or self.plan.passes_done(self.done):
            return
        poll = self.settings.POLL_SECONDS
        if self.pools is not None and busy:
            # Rows are running: claim again as soon as one of them frees its slot.
            self.pools.wake.wait(min(poll, 0.05))
            return
        # Senders hold back NOTIFYs for NOTIFY_COALESCE_SECONDS after each one, so right
        # after activity the relay looks often instead of waiting to be woken.
        if time.monotonic() - self.last_activity < self.settings.NOTIFY_COALESCE_SECONDS:
            _wait(self.listener, min(poll, 0.05), self.state)
            return
        _idle_work(self._prune_when_due())
        if _wait(self.listener, _poll(poll, self.ticker), self.state):
            self.last_activity = time.monotonic()

    def _synchronise_when_due(self) -> None:
        if time.monotonic() - self.last_clock >= CLOCK_CHECK_SECONDS:
            _synchronise(self.state, self.alias, first=self.last_clock == float("-inf"))
            self.last_clock = time.monotonic()

    def _compact_when_due(self) -> None:
        if time.monotonic() - self.last_compact >= TALLY_COMPACT_SECONDS:
            self.last_compact = time.monotonic()
            _compact_tally(self.alias)

    def _prune_when_due(self) -> Callable[[], object] | None:
        """The prune, if this idle moment should run it (``RELAY_PRUNE_SECONDS`` apart)."""
        prune = self.plan.prune
        if prune is None or not self.settings.RELAY_PRUNE:
            return None
        if time.monotonic() - self.last_prune < self.settings.RELAY_PRUNE_SECONDS:
            return None
        self.last_prune = time.monotonic()
        return prune

    def _wind_down(self) -> None:
        self.state.locked.close()  # the claims by row lock (none is open between passes)
        if self.pools is not None:
            # Finish the rows being run, hand back the rest.
            self.pools.close(self.state, self.state.worker_id)
            with contextlib.suppress(Exception):
                _hand_back(self.state)
        if self.listener is not None:
            self.listener.close()


def _synchronise(state: Pass, alias: str, *, first: bool) -> None:
    """Follow the database's clock (``clock.synchronise``). Before the first pass a clock
    that cannot be read stops the relay; later the last offset measured stays."""
    try:
        reading = clock.synchronise(alias)
    except clock.ClockUnknown as error:
        if first:
            raise
        logger.warning("%s; keeping the offset measured before.", error)
        return
    if abs(reading.offset) >= 1.0:
        logger.warning(
            "Relay %s: this host's clock is %.1fs %s the database's; leases and ticks are "
            "judged by the database's clock. Keep the hosts' clocks synchronised (NTP).",
            state.worker_id,
            abs(reading.offset),
            "behind" if reading.offset > 0 else "ahead of",
            extra={"worker_id": state.worker_id, "clock_offset": reading.offset},
        )


def _hand_back(state: Pass) -> None:
    """After an outage, hand back the rows of the batch the relay was running, so they
    run at once, uncharged; raises while the database is still away."""
    if not state.in_hand:
        return
    count = release(state.in_hand)
    state.in_hand = []
    if count:
        logger.info(
            "Relay %s handed back %s rows it held before the outage.",
            state.worker_id,
            count,
            extra={"worker_id": state.worker_id},
        )


def _halt(state: Pass, error: Exception) -> None:
    """Stop the relay on an error that waiting cannot fix, saying what to do."""
    with contextlib.suppress(Exception):
        release(state.in_hand)
    if isinstance(error, clock.ClockUnknown):
        advice = ""
    elif isinstance(error, ImproperlyConfigured):
        advice = "Fix the setting, then start the relay again."
    elif isinstance(error, DatabaseError):
        advice = (
            "Waiting will not fix it: check that every migration is applied "
            "(manage.py migrate) and that the database is the one the relay expects, then "
            "start the relay again."
        )
    else:
        advice = "This is a bug: please report it with the traceback above."
    message = (
        f"Relay {state.worker_id} stopped: {type(error).__name__}: {error}. {advice} The rows "
        "it held were handed back uncharged."
    ).replace(".  ", ". ")
    logger.error(
        message,
        exc_info=not isinstance(error, ImproperlyConfigured | DatabaseError | clock.ClockUnknown),
        extra={"worker_id": state.worker_id},
    )
    raise RelayHalted(message) from error


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


def _poll(poll: float, ticker: Ticker) -> float:
    """The idle wait: the poll interval, or less when a schedule's tick comes due sooner
    or a rate limit's next token does (``limits.seconds_to_token``)."""
    soonest = [s for s in (ticker.seconds_to_next(), limits.seconds_to_token()) if s is not None]
    return min([poll, *(max(s, 0.01) for s in soonest)])


def _wait(listener: Listener | None, poll: float, state: Pass) -> bool:
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
            if listener.wait(step):
                return True
        else:
            time.sleep(step)
    return False


def _close(alias: str, listener: Listener | None) -> None:
    """Drop a connection the outage broke; the next query opens a new one."""
    if listener is not None:
        listener.close()
    with contextlib.suppress(Exception):
        connections[alias].close()
