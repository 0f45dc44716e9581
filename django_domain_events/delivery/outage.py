"""Which errors waiting can fix, and who pays for an error a receiver raised.

A relay rides out an *outage*: the server restarting, the network gone, a deadlock or
a lock timeout. It waits, reconnects and hands back what it held. Any other error (a
missing column, a value out of range, a programming error) would come back on every
retry, so the relay stops on it instead of spinning. When the type of an error does
not settle it, a fresh connection decides: if the server cannot be reached, it is an
outage (SQLite, a local file, is never out: only locked).

An error a receiver raised is judged by ``blame``, the one place that decides it: the
row pays (one failed attempt) unless the outbox's own database is out, seen from a
fresh connection. A receiver's error on another database or service, or on a
connection it broke itself while the database answers, is the row's: were it taken
for an outage the row would never be charged, and so never end.
"""

from __future__ import annotations

import contextlib
import enum
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

# PostgreSQL SQLSTATE classes and codes that pass: connection exceptions, insufficient
# resources, serialization failures and deadlocks, lock not available, operator
# intervention (shutdown, crash recovery), system errors, and a connection the server
# ended for idling in a transaction or for its transaction's length (25P03, 25P04).
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_PG_TRANSIENT_CODES = ("55P03", "25P03", "25P04")

# MySQL/MariaDB error numbers that pass: lock wait timeout, deadlock, server shutting
# down, connection killed or lost, too many connections, server gone away.
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}

_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "disk i/o error")


class Blame(enum.Enum):
    """Who pays for an error that ended an attempt (see ``blame``)."""

    ATTEMPT = "attempt"  # the row: one failed attempt, recorded as decide() rules
    OUTBOX = "outbox"  # the outbox's database is out: hand the row back, uncharged, wait


def blame(error: BaseException, alias: str) -> Blame:
    """Who pays for ``error``, raised while a receiver ran on a row of database ``alias``.

    ``OUTBOX`` only when the outbox's own connection is broken and a fresh connection
    cannot reach the database either; every other error is the row's failed attempt.
    """
    if not isinstance(error, DatabaseError | InterfaceError):
        return Blame.ATTEMPT
    if answers(connections[alias]) or _reachable(alias):
        return Blame.ATTEMPT
    return Blame.OUTBOX


def is_outage(error: BaseException, alias: str) -> bool:
    """Whether ``error``, raised by the database ``alias``, may pass by waiting."""
    if not isinstance(error, DatabaseError | InterfaceError):
        return False
    vendor = connections[alias].vendor
    if isinstance(error, InterfaceError) or _transient(error, vendor):
        return True
    return vendor != "sqlite" and not _reachable(alias)  # a local file is always there


def _transient(error: DatabaseError, vendor: str) -> bool:
    cause = error.__cause__ or error
    if vendor == "postgresql":
        code = getattr(cause, "sqlstate", None)
        if code is None:  # raised by the client: the connection failed or broke
            return isinstance(error, OperationalError)
        return code[:2] in _PG_TRANSIENT_CLASSES or code in _PG_TRANSIENT_CODES
    if vendor == "mysql":
        args: tuple[object, ...] = getattr(cause, "args", ())
        return bool(args) and args[0] in _MYSQL_TRANSIENT
    if vendor == "sqlite":
        return any(text in str(cause).lower() for text in _SQLITE_TRANSIENT)
    return isinstance(error, OperationalError)


def answers(connection: Any) -> bool:
    """Whether ``connection`` is open and answers a query: not closed (by Django, after
    a failed rollback), not broken, not in a transaction a failed statement aborted
    (Django's ``is_usable`` runs a query, which such a transaction refuses)."""
    if connection.connection is None:
        return False
    try:
        return bool(connection.is_usable())
    except Exception:
        return False


def _reachable(alias: str) -> bool:
    """Whether a fresh connection to ``alias`` can run a query now."""
    probe = connections.create_connection(alias)
    try:
        probe.ensure_connection()
        with probe.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            probe.close()
