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
import functools
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from .. import clock, conf, tally
from ..codec import get_codec
from ..declare import registry
from ..models import DeliveryStatus, LanePauseRecord
from ..retention import prune_events
from . import limits
from .claim import database_alias, release
from .loop import on_relay_loop, refusing_detached
from .outage import is_outage
from .passes import (
    Counts,
    Pass,
    check_sizes,
    default_worker_id,
    run_pass,
)
from .pool import Pools
from .run import around_hook, expire_overdue
from .tasks import get_backend
from .ticks import Ticker
from .wake import Listener, wakes_by_notify

logger = logging.getLogger("django_domain_events.relay")

TALLY_COMPACT_SECONDS = 60.0  # how often a relay folds the scheduled tally's deltas
CLOCK_CHECK_SECONDS = 60.0  # how often a relay measures its clock against the database's
MAX_CONCURRENCY = 256  # rows one relay runs at once per lane, each on its own connection


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
        self._worker_id = worker_id
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
            self._worker_id,
            self._timeout,
            extra={"worker_id": self._worker_id},
        )
        logging.shutdown()  # flush the handlers: os._exit skips them
        os._exit(1)

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


def check_relay_options(
    lane: str | Sequence[str], batch_size: int | None, lane_batch_sizes: Mapping[str, int] | None
) -> list[str]:
    """The lanes a relay serves, after refusing any option it cannot run with."""
    lanes = check_lanes([lane] if isinstance(lane, str) else lane)
    check_sizes(batch_size, lane_batch_sizes)
    for name in lane_batch_sizes or {}:
        if name not in lanes:
            raise ValueError(
                f"lane {name!r} has a batch size but this relay does not serve it; serve "
                f"lane {name!r} too, or drop its size."
            )
    return lanes


def check_configuration(lanes: Sequence[str]) -> None:
    """Load every dotted-path setting a relay of ``lanes`` will use, before it claims a row.

    Raises ``ImproperlyConfigured`` naming the setting: a codec, hook or task backend
    that cannot be loaded is the deployment's error, and no row should pay for it.
    """
    settings = conf.get()
    get_codec()
    if settings.AROUND_DELIVERY is not None:
        around_hook(settings.AROUND_DELIVERY)
    served = {key for lane in lanes for key in registry.lanes().get(lane, ())}
    if any(r.durable and r.site == "task" and r.key in served for r in registry.receivers):
        get_backend()


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
    and returns. ``once`` returns as soon as a pass finds nothing owed, instead of waiting;
    ``passes`` returns after that many passes; ``limit`` after that many rows. When idle it
    calls ``prune`` (``prune_events`` unless given; ``None`` for none) at most every
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
    if connections[alias].vendor == "sqlite" and any(n > 1 for n in slots.values()):
        raise ValueError(
            "SQLite has a single writer, so a relay on it runs one delivery at a time; drop "
            "the concurrency, or move to PostgreSQL or MariaDB to run several at once."
        )
    check_configuration(lanes)
    timeout = check_shutdown_timeout(shutdown_timeout)
    worker = worker_id or relay_worker_id()
    signals = _Signals(worker, timeout)
    with _one_relay_on_sqlite(alias):
        on_main_thread = signals.install()
        stop_event = stop if isinstance(stop, threading.Event) else None

        def stopping() -> bool:
            if signals.received is not None:
                return True
            if stop_event is not None:
                return stop_event.is_set()
            return bool(stop()) if callable(stop) else False

        state = Pass(worker, None, False, relay=True, stop=stopping)
        opened = connections[alias].connection is None  # else it is the caller's: left open
        _log_start(state.worker_id, lanes, slots, alias, on_main_thread)
        try:
            sizes = lane_batch_sizes or {}
            # Until the loop closes: a task a receiver left may run its query at the end.
            with refusing_detached(alias):
                on_relay_loop(
                    functools.partial(
                        _loop,
                        state,
                        lanes,
                        slots,
                        passes,
                        batch_size,
                        sizes,
                        limit,
                        prune,
                        once,
                        timeout,
                    )
                )
        finally:
            if on_main_thread:
                signals.restore()
            with contextlib.suppress(Exception):
                LanePauseRecord.objects.using(alias).filter(worker_id=state.worker_id).delete()
            if opened:
                with contextlib.suppress(Exception):
                    connections[alias].close()
        done = ", ".join(f"{state.counts[s]} {s.value}" for s in DeliveryStatus if state.counts[s])
        logger.info(
            "Relay %s stopped: %s.",
            state.worker_id,
            done or "nothing delivered",
            extra={"worker_id": state.worker_id, "lanes": lanes, "concurrency": dict(slots)},
        )
        return state.counts


def check_shutdown_timeout(seconds: float | None) -> float | None:
    """The stop's bound in seconds (``SHUTDOWN_TIMEOUT_SECONDS`` when not given), or None;
    refuses a value that is not a positive number."""
    if seconds is None:
        return conf.get().SHUTDOWN_TIMEOUT_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(
            f"the shutdown timeout must be a positive number of seconds, not {seconds!r}."
        )
    return float(seconds)


def lane_slots(
    lanes: Sequence[str], concurrency: int | None, lane_concurrency: Mapping[str, int] | None
) -> dict[str, int]:
    """How many rows of each lane a relay runs at once; refuses what cannot be."""
    default = concurrency if concurrency is not None else conf.get().CONCURRENCY
    chosen = [("the concurrency", default)]
    chosen += [(f"the concurrency of lane {k!r}", n) for k, n in (lane_concurrency or {}).items()]
    for what, n in chosen:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONCURRENCY:
            raise ValueError(
                f"{what} must be a whole number from 1 to {MAX_CONCURRENCY}, not {n!r}."
            )
    for lane in lane_concurrency or {}:
        if lane not in lanes:
            raise ValueError(
                f"lane {lane!r} has a concurrency but this relay does not serve it; serve "
                f"lane {lane!r} too, or drop its concurrency."
            )
    return {lane: (lane_concurrency or {}).get(lane, default) for lane in lanes}


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


def _loop(
    state: Pass,
    lanes: list[str],
    slots: Mapping[str, int],
    passes: int | None,
    batch_size: int | None,
    lane_batch_sizes: Mapping[str, int],
    limit: int | None,
    prune: Callable[[], object] | None,
    once: bool,
    shutdown_timeout: float | None,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Pass after pass until stopped, in the relay's thread; ``loop`` is the relay's event
    loop (``on_relay_loop``), on which its worker slots are awaited."""
    settings = conf.get()
    alias = database_alias()
    listener = Listener(alias) if wakes_by_notify(alias) else None
    if listener is not None:
        listener.listen()  # before the first claim: nothing fired after it is missed
    several = any(n > 1 for n in slots.values())
    pools = Pools(lanes, slots, loop, shutdown_timeout) if several else None
    ticker = Ticker()
    outage_pause = min(settings.POLL_SECONDS, 2.0)
    last_prune = last_activity = last_compact = last_clock = float("-inf")
    done = 0
    was_busy = False
    try:
        while not state.stop() and (passes is None or done < passes):
            if limit is not None and state.claimed >= limit:
                break
            try:
                if time.monotonic() - last_clock >= CLOCK_CHECK_SECONDS:
                    _synchronise(state, alias, first=last_clock == float("-inf"))
                    last_clock = time.monotonic()
                _hand_back(state)
                if pools is not None:
                    pools.wake.clear()
                    # Read before claiming: rows that finish during the claim must not
                    # make a pass that found every slot full look idle.
                    was_busy = pools.busy()
                    claimed = pools.fill(state, batch_size, lane_batch_sizes, limit)
                else:
                    claimed = run_pass(state, lanes, batch_size, lane_batch_sizes, limit)
                if not state.stop():
                    claimed += ticker.look()  # a fired tick is work: deliver it next pass
                outage_pause = min(settings.POLL_SECONDS, 2.0)
            except Exception as error:
                if not is_outage(error, alias):
                    _halt(state, error)
                logger.warning(
                    "Relay %s lost the database (%s); retrying in %.1fs.",
                    state.worker_id,
                    error,
                    outage_pause,
                    extra={"worker_id": state.worker_id},
                )
                _close(alias, listener)
                time.sleep(outage_pause)
                outage_pause = min(outage_pause * 2, 2.0)
                continue
            done += 1
            if time.monotonic() - last_compact >= TALLY_COMPACT_SECONDS:
                last_compact = time.monotonic()
                _compact_tally(alias)
            busy = pools is not None and (was_busy or pools.busy())
            if once and not claimed and not busy:
                break
            if claimed:
                last_activity = time.monotonic()
            if claimed or state.stop() or (passes is not None and done >= passes):
                continue
            if pools is not None and busy:
                # Rows are running: claim again as soon as one of them frees its slot.
                pools.wake.wait(min(settings.POLL_SECONDS, 0.05))
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
            if _wait(listener, _poll(settings.POLL_SECONDS, ticker), state):
                last_activity = time.monotonic()
    finally:
        if pools is not None:
            pools.close(state, state.worker_id)  # finish the rows being run, hand back the rest
            with contextlib.suppress(Exception):
                _hand_back(state)
        if listener is not None:
            listener.close()


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
