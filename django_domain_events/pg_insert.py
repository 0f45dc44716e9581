"""The statements that write an event and its delivery rows on PostgreSQL.

``fire()`` (``firing.py``) builds the rows; on PostgreSQL they go out here, the event and
all its rows in one statement, and a consumed batch (the inbox) in one statement too:
every event row, then every delivery row. Elsewhere the ORM writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper

from .models import DeliveryRecord, EventRecord


class Row(NamedTuple):
    """One delivery row's own values; every other column starts at its default."""

    receiver_key: str
    target: str
    max_attempts: int | None
    due_at: datetime  # also its available_at
    expires_at: datetime | None
    priority_credit: int = 0  # priority.credit of the receiver's priority
    claim_rank: int = 0  # priority.rank(due_at) - priority_credit
    order_key: str | None = None  # the ordered receiver's key (delivery/ordering.py)


class PgInsert:
    """The statements that write an event and its deliveries on PostgreSQL, built once.

    The event and all its rows are one statement, a data-modifying CTE:

        WITH e AS (INSERT INTO event (...) VALUES (...)
                   ON CONFLICT (name, dedupe_key) DO NOTHING RETURNING id),
             d AS (INSERT INTO delivery (...) SELECT e.id, v.*, <defaults>
                   FROM e, unnest(%s::varchar[], ...) AS v (...) RETURNING id, receiver_key)
        SELECT e.id, ARRAY(SELECT d.id FROM d WHERE receiver_key = ANY(<eager keys>)) FROM e

    The rows travel as one array per column, not as ``VALUES`` tuples: the SQL text is
    the same for any number of rows (nothing to build per call, one shape for the server
    and for ``pg_stat_statements``), and no fan-out can reach the 65,535-parameter limit.
    ``ON CONFLICT DO NOTHING`` finds a taken dedupe key without a savepoint: the
    statement then writes nothing and returns no row. (A null key never conflicts.)
    """

    _built: PgInsert | None = None

    @classmethod
    def get(cls, connection: BaseDatabaseWrapper) -> PgInsert:
        if cls._built is None:
            cls._built = cls(connection)
        return cls._built

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        quote = connection.ops.quote_name
        self.event_fields = [f for f in EventRecord._meta.concrete_fields if not f.primary_key]
        values = ", ".join(["%s"] * len(self.event_fields))
        insert_event = (
            f"INSERT INTO {quote(EventRecord._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in self.event_fields)}) VALUES ({values}) "
            f"ON CONFLICT ({quote('name')}, {quote('dedupe_key')}) DO NOTHING RETURNING id"
        )
        # Each delivery column: the event's id, a value of the row, or the column default.
        given = {
            "receiver_key": "v.receiver_key",
            "target": "v.target",
            "max_attempts": "v.max_attempts",
            "available_at": "v.due_at",
            "due_at": "v.due_at",
            "expires_at": "v.expires_at",
            "priority_credit": "v.priority_credit",
            "claim_rank": "v.claim_rank",
            "order_key": "v.order_key",
        }
        columns, select, self.defaults = [], [], []
        for f in DeliveryRecord._meta.concrete_fields:
            if f.primary_key or f.generated:  # error_type: the database computes it
                continue
            columns.append(quote(f.column))
            if f.name == "event":
                select.append("{event_id}")  # filled in per statement below
            elif f.name in given:
                select.append(given[f.name])
            else:
                select.append(f"CAST(%s AS {_cast_type(f, connection)})")
                self.defaults.append(f.get_db_prep_save(f.get_default(), connection))
        arrays = ", ".join(
            f"%s::{_cast_type(DeliveryRecord._meta.get_field(name), connection)}[]"
            for name in Row._fields
        )
        rows_into = f"INSERT INTO {quote(DeliveryRecord._meta.db_table)} ({', '.join(columns)}) "
        row_fields = ", ".join(Row._fields)
        eager = "ARRAY(SELECT d.id FROM d WHERE d.receiver_key = ANY(%s::varchar[]) ORDER BY d.id)"
        self.event_sql = (
            f"WITH e AS ({insert_event}), "
            f"d AS ({rows_into}SELECT {', '.join(select).format(event_id='e.id')} "
            f"FROM e, unnest({arrays}) AS v ({row_fields}) RETURNING id, receiver_key) "
            f"SELECT e.id, {eager} FROM e"
        )
        self.deliveries_sql = (
            f"WITH d AS ({rows_into}SELECT {', '.join(select).format(event_id='%s')} "
            f"FROM unnest({arrays}) AS v ({row_fields}) RETURNING id, receiver_key) "
            f"SELECT {eager}"
        )
        # A batch (the inbox): every event in one INSERT from one array per column, in
        # the given order; each delivery row names its event by (name, dedupe_key).
        self.converters = [_converter(f) for f in self.event_fields]
        event_arrays = ", ".join(f"%s::{_cast_type(f, connection)}[]" for f in self.event_fields)
        given_names = ", ".join(f"c{i}" for i in range(len(self.event_fields)))
        insert_events = (
            f"INSERT INTO {quote(EventRecord._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in self.event_fields)}) "
            f"SELECT {given_names} FROM unnest({event_arrays}) WITH ORDINALITY "
            f"AS v ({given_names}, ord) ORDER BY ord "
            f"ON CONFLICT ({quote('name')}, {quote('dedupe_key')}) DO NOTHING "
            f"RETURNING id, {quote('name')}, {quote('dedupe_key')}"
        )
        # The eager rows by event in one grouped pass over d, not one scan of d per event.
        eager_by_event = (
            "(SELECT d.event_id, array_agg(d.id ORDER BY d.id) AS ids FROM d "
            "WHERE d.receiver_key = ANY(%s::varchar[]) GROUP BY d.event_id)"
        )
        self.batch_sql = (
            f"WITH e AS ({insert_events}), "
            f"d AS ({rows_into}SELECT {', '.join(select).format(event_id='e.id')} "
            f"FROM e JOIN unnest(%s::varchar[], %s::varchar[], {arrays}) WITH ORDINALITY "
            f"AS v (event_name, event_key, {row_fields}, ord) "
            f"ON e.{quote('name')} = v.event_name AND e.{quote('dedupe_key')} = v.event_key "
            # Rows take their ids in the batch's order: an ordered key's order is theirs.
            f"ORDER BY v.ord RETURNING id, {quote('event_id')}, receiver_key) "
            f"SELECT e.{quote('name')}, e.{quote('dedupe_key')}, e.id, "
            f"COALESCE(x.ids, ARRAY[]::bigint[]) FROM e LEFT JOIN {eager_by_event} AS x "
            "ON x.event_id = e.id"
        ).replace("%s", "%b")  # every parameter in binary: no escaping of array elements

    def event(
        self,
        connection: BaseDatabaseWrapper,
        record: EventRecord,
        rows: Sequence[Row],
        eager_keys: Sequence[str],
    ) -> tuple[int, list[int]] | None:
        """``(event id, eager row ids)``, or None when the dedupe key is taken."""
        params = [
            f.get_db_prep_save(getattr(record, f.attname), connection) for f in self.event_fields
        ]
        params += self.defaults
        params += _columns(rows)
        params.append(list(eager_keys))
        with connection.cursor() as cursor:
            cursor.execute(self.event_sql, params)
            found = cursor.fetchone()
        return None if found is None else (found[0], found[1])

    def batch(
        self,
        connection: BaseDatabaseWrapper,
        events: Sequence[tuple[Mapping[str, Any], Sequence[Row]]],
        eager_keys: Sequence[str],
    ) -> dict[tuple[str, str], tuple[int, list[int]]]:
        """Write a batch of keyed events (their values by field name, as ``EventRecord``
        takes them) and their rows in one statement: the written ones by ``(name,
        dedupe_key)``, with the ids of their eager rows. An event whose key is taken is
        left out (nothing written for it). The keys must be distinct."""
        event_columns: list[list[Any]] = [[] for _ in self.event_fields]
        owners: tuple[list[str], list[str]] = ([], [])
        rows: list[Row] = []
        for values, its_rows in events:
            for column, field, convert in zip(
                event_columns, self.event_fields, self.converters, strict=True
            ):
                column.append(convert(values[field.name]))
            for row in its_rows:
                owners[0].append(values["name"])
                owners[1].append(values["dedupe_key"])
                rows.append(row)
        params = [*event_columns, *self.defaults, *owners, *_columns(rows), list(eager_keys)]
        connection.ensure_connection()
        # psycopg's own cursor, binding on the server: the statement is prepared once per
        # connection, and the arrays travel as arrays rather than quoted into the text.
        with connection.wrap_database_errors, psycopg_cursor(connection.connection) as raw:
            raw.execute(self.batch_sql, params)
            found = raw.fetchall()
        return {(name, key): (pk, list(eager)) for name, key, pk, eager in found}

    def deliveries(
        self,
        connection: BaseDatabaseWrapper,
        event_id: int,
        rows: Sequence[Row],
        eager_keys: Sequence[str],
    ) -> list[int]:
        params = [event_id, *self.defaults, *_columns(rows), list(eager_keys)]
        with connection.cursor() as cursor:
            cursor.execute(self.deliveries_sql, params)
            return list(cursor.fetchone()[0])


def psycopg_cursor(raw_connection: Any) -> Any:
    """A server-binding cursor on Django's psycopg 3 connection (Django's own binds on
    the client, quoting every parameter into the text)."""
    import psycopg

    return psycopg.Cursor(raw_connection)


def _columns(rows: Sequence[Row]) -> list[list[Any]]:
    """``rows`` turned into one list per column, in ``Row`` order: the unnest arrays."""
    if not rows:
        return [[] for _ in Row._fields]
    return [list(column) for column in zip(*rows, strict=True)]


def _cast_type(field: Any, connection: BaseDatabaseWrapper) -> str:
    """The column's type without its length (``varchar``, not ``varchar(255)``)."""
    return str(field.db_type(connection)).split("(")[0]


def _converter(field: Any) -> Any:
    """How one event column's value travels in its array: JSON as text (cast to
    ``jsonb`` by the statement), a related object as its key, anything else as given."""
    from django.db.models import ForeignKey, JSONField

    if isinstance(field, ForeignKey):
        return _key_of
    if isinstance(field, JSONField):
        # What json.dumps(value, cls=field.encoder) returns, without building an encoder
        # per value (three JSON columns per consumed message).
        encode = (field.encoder or json.JSONEncoder)().encode

        def as_json(value: Any) -> str | None:
            return None if value is None else encode(value)

        return as_json
    return _same


def _key_of(value: Any) -> Any:
    return None if value is None else value.pk


def _same(value: Any) -> Any:
    return value
