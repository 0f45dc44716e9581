"""Which database errors waiting can fix.

A relay rides out an *outage*: the server restarting, the network gone, a deadlock or
a lock timeout. It waits, reconnects and hands back what it held. Any other error (a
missing column, a value out of range, a programming error) would come back on every
retry, so the relay stops on it instead of spinning. When the type of an error does
not settle it, a fresh connection decides: if the server cannot be reached, it is an
outage (SQLite, a local file, is never out: only locked).
"""

from __future__ import annotations

import contextlib

from django.db import DatabaseError, InterfaceError, OperationalError, connections

# PostgreSQL SQLSTATE classes and codes that pass: connection exceptions, insufficient
# resources, serialization failures and deadlocks, lock not available, operator
# intervention (shutdown, crash recovery), system errors.
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_PG_TRANSIENT_CODES = ("55P03",)

# MySQL/MariaDB error numbers that pass: lock wait timeout, deadlock, server shutting
# down, connection killed or lost, too many connections, server gone away.
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}

_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "disk i/o error")

# Of those, the ones that mean the connection itself is gone.
_PG_LOST = ("08", "57P01", "57P02", "57P03")
_MYSQL_LOST = {1053, 1927, 2002, 2003, 2006, 2013, 2055, 4031}


def is_outage(error: BaseException, alias: str) -> bool:
    """Whether ``error``, raised by the database ``alias``, may pass by waiting."""
    if not isinstance(error, DatabaseError | InterfaceError):
        return False
    vendor = connections[alias].vendor
    if isinstance(error, InterfaceError) or _transient(error, vendor):
        return True
    return vendor != "sqlite" and not _reachable(alias)  # a local file is always there


def connection_lost(error: BaseException, alias: str) -> bool:
    """Whether ``error`` came with the loss of the connection to ``alias`` itself: a
    receiver that fails so did not fail, the database went away under it."""
    if isinstance(error, InterfaceError):
        return True
    if not isinstance(error, DatabaseError):
        return False
    connection = connections[alias]
    if connection.connection is None:  # closed by Django: its rollback failed
        return True
    cause = error.__cause__ or error
    if connection.vendor == "postgresql":
        code = getattr(cause, "sqlstate", None)
        if code is None:
            return isinstance(error, OperationalError)
        return code.startswith(_PG_LOST)
    if connection.vendor == "mysql":
        args: tuple[object, ...] = getattr(cause, "args", ())
        return bool(args) and args[0] in _MYSQL_LOST
    return False


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
