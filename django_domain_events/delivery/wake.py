"""Waking relays without waiting for their poll: LISTEN/NOTIFY on PostgreSQL.

``fire()`` and the operations call ``notify_relay()`` once their work is committed.
Notifications are coalesced to one per ``NOTIFY_COALESCE_SECONDS`` per process and
database; one that falls inside the window is sent when the window closes, so a
burst costs at most two NOTIFYs and the last event of it is not left to the poll.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from .. import conf
from ..models import database_alias

logger = logging.getLogger("django_domain_events.relay")

CHANNEL = "django_domain_events"

_lock = threading.Lock()
_last_sent: dict[str, float] = {}
_trailing: dict[str, threading.Timer] = {}


def wakes_by_notify(alias: str) -> bool:
    """Whether relays on ``alias`` are woken by NOTIFY (PostgreSQL, psycopg 3, ``WAKE``)."""
    if conf.get().WAKE != "notify" or connections[alias].vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def notify_relay(*, using: str | None = None) -> None:
    """Wake the relays of this database (coalesced); a no-op where relays only poll."""
    alias = using or database_alias()
    if not wakes_by_notify(alias):
        return
    window = conf.get().NOTIFY_COALESCE_SECONDS
    with _lock:
        since = time.monotonic() - _last_sent.get(alias, float("-inf"))
        if since < window:
            if alias not in _trailing:
                timer = threading.Timer(window - since, _send_trailing, args=(alias,))
                timer.daemon = True
                _trailing[alias] = timer
                timer.start()
            return
        _last_sent[alias] = time.monotonic()
    _send(alias)


_wakers: dict[str, Callable[[], None]] = {}


def wake_after_commit(alias: str) -> None:
    """Wake the relays once the current transaction commits: once, however many events
    or operations the transaction holds (immediately in autocommit mode)."""
    waker = _wakers.setdefault(alias, functools.partial(notify_relay, using=alias))
    if not any(entry[1] is waker for entry in connections[alias].run_on_commit):
        transaction.on_commit(waker, using=alias)


def _send(alias: str) -> None:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    except Exception:  # a lost wake-up costs one poll interval, never the event
        logger.warning("Could not NOTIFY the relays; they will find the work on their poll.")


def _send_trailing(alias: str) -> None:
    with _lock:
        _trailing.pop(alias, None)
        _last_sent[alias] = time.monotonic()
    try:
        _send(alias)
    finally:
        connections[alias].close()


class Listener:
    """A dedicated autocommit connection LISTENing for wake-ups.

    ``listen()`` before the first claim; after the connection is lost, ``wait()``
    LISTENs again and reports a wake-up, so the pass that follows catches up on what was
    fired meanwhile. A LISTEN that fails is logged once at WARNING (the relay then finds
    work on its poll) and retried every ``RETRY_SECONDS``.
    """

    RETRY_SECONDS = 10.0

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._connection: Any = None
        self._failed_at: float | None = None

    def listen(self) -> bool:
        """Connect and LISTEN; False (logged once until it works again) when it fails."""
        self.close()
        try:
            import psycopg

            params = connections[self.alias].get_connection_params()
            params.pop("context", None)
            params.pop("cursor_factory", None)
            params.pop("prepare_threshold", None)
            connection = psycopg.connect(**params, autocommit=True)
            connection.execute(f'LISTEN "{CHANNEL}"')
        except Exception as error:
            if self._failed_at is None:
                logger.warning(
                    "The relay cannot LISTEN for wake-ups (%s: %s); it finds new work on its "
                    "poll (POLL_SECONDS) until it can. Behind a transaction-mode pooler, give "
                    "the relay a direct or session-mode connection, or set WAKE='poll'.",
                    type(error).__name__,
                    error,
                )
            self._failed_at = time.monotonic()
            return False
        if self._failed_at is not None:
            logger.info("The relay LISTENs for wake-ups again.")
        self._connection = connection
        self._failed_at = None
        return True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; True when one came, or when the
        relay may have missed some while it was not listening."""
        if self._connection is None or self._connection.closed:
            retry_due = (
                self._failed_at is None or time.monotonic() - self._failed_at >= self.RETRY_SECONDS
            )
            if retry_due and self.listen():
                return True  # listening again: catch up on what came meanwhile
            time.sleep(timeout)
            return False
        woke = False
        try:
            for _ in self._connection.notifies(timeout=timeout, stop_after=1):
                woke = True
            # Drain what else queued up meanwhile: one pass serves them all.
            for _ in self._connection.notifies(timeout=0):
                pass
        except Exception:
            self.close()  # lost: the next wait LISTENs again, then catches up
            return False
        return woke

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:
                pass
            finally:
                self._connection = None
