"""The claim on PostgreSQL: one statement picks the owed rows (``FOR UPDATE SKIP
LOCKED``, in rank order), applies the lapse rule (``lapse.py``) and the order per key
(``ordering.py``), stamps the lease and returns the rows joined to their events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.db import connections

from .. import priority
from ..models import (
    STATUS_SQL,
    DeliveryRecord,
    EventRecord,
)
from . import ordering
from .claim_rows import INLINE_PAYLOAD_BYTES, Claim, ClaimArgs, as_claims, table
from .lapse import KEPT_SQL, ROW_COLUMNS, running_sql


def _pg_is_task(expr: str) -> str:
    return f"({expr} = ANY(%(task_keys)s::text[]))"


# The lapse rule (lapse.py) inside the claim: ``numbered`` judges each picked row,
# ``kept`` keeps the rows the claim takes, ``unstarted`` finds the rows of a batch run in
# order after the one charged, whose own leases lapsed too, to hand back. It looks under
# each kept row that lapsed (a lateral subquery, so the held rows are read only there):
# as a join, the planner was free to read every held row first, at every claim.
_POSTGRESQL_CLAIM = """
WITH picked AS ({picked}
), judged AS (
    SELECT p.*, row_number() OVER (ORDER BY p.was_rank, p.id) AS position,
           {running} AS charged, {is_task} AS is_task
    FROM picked AS p
), numbered AS (
    SELECT j.*, j.charged AND NOT j.is_task AS alone FROM judged AS j
), kept AS ({kept}
), unstarted AS (
    SELECT u.id
    FROM kept AS n
    CROSS JOIN LATERAL (
        SELECT d.id
        FROM {delivery} AS d
        WHERE d.status = {claimed} AND d.claimed_by = n.was_by AND d.claimed_at = n.was_at
          AND d.claim_position > n.was_position AND d.available_at <= %(now)s
          AND d.id NOT IN (SELECT id FROM kept)
        FOR UPDATE OF d SKIP LOCKED
    ) AS u
    WHERE n.alone AND n.was_position > 0
), handed_back AS (
    UPDATE {delivery} AS d
    SET status = CASE WHEN d.attempts = 0 THEN {pending} ELSE {failed} END,
        available_at = %(now)s,
        claim_rank = %(now_rank)s - d.priority_credit,
        lease_expires_at = NULL
    FROM unstarted AS u
    WHERE d.id = u.id
), claimed AS (
    UPDATE {delivery} AS d
    SET status = {claimed},
        claimed_by = %(worker)s,
        claimed_at = %(now)s,
        lease_expires_at = %(lease_end)s,
        available_at = %(lease_end)s,
        claim_rank = %(lease_end_rank)s - d.priority_credit,
        claim_position = CASE
            WHEN %(at_once)s OR n.alone THEN 0 ELSE n.position + %(first)s - 1
        END,
        -- never past the budget: a row already spent is dead-lettered unrun, uncharged
        attempts = CASE
            WHEN n.charged AND (d.max_attempts IS NULL OR d.attempts < d.max_attempts)
            THEN d.attempts + 1 ELSE d.attempts
        END
    FROM kept AS n
    WHERE d.id = n.id
    RETURNING d.id, d.event_id, d.receiver_key, d.target, d.attempts, d.max_attempts,
              d.due_at, d.expires_at, d.last_error, n.was_rank, n.alone
)
SELECT c.id, c.event_id, c.receiver_key, c.target, c.attempts, c.max_attempts,
       {micros_due}, {micros_expires}, e.name, e.version,
       CASE WHEN octet_length(e.text) <= %(inline)s THEN e.text END, {micros_occurred},
       e.actor_key, e.actor_label, e.scope::text, e.correlation_id, c.last_error,
       e.trace_context, e.causation_id, c.alone
FROM claimed AS c
CROSS JOIN LATERAL ({event_of_row}) AS e
ORDER BY c.was_rank, c.id
"""

# The event of each claimed row ``c``, read by its primary key. A lateral subquery with
# a LIMIT is never flattened into a join, so the planner cannot choose to hash the whole
# event log instead (it did, on a log of 10,000 events): the log grows without bound,
# a claim reads only its rows' events. The payload's stored size is looked at first: a
# payload far too large is never turned into text here.
_EVENT_OF_ROW = """
    SELECT name, version, occurred_at, actor_key, actor_label, scope, correlation_id,
           trace_context, causation_id,
           CASE WHEN pg_column_size(payload) <= %(inline)s THEN payload::text END AS text
    FROM {event} WHERE id = c.event_id LIMIT 1
"""


# The owed rows a claim takes, in rank order, read from the rank index, with
# ``columns``: what the claim's lapse rule reads of each (``_CLAIM_COLUMNS``), or what
# a claim by row lock returns (``_LOCK_COLUMNS``).
_PICKED = """
    SELECT id, claim_rank AS was_rank, {columns}
    FROM {delivery}
    WHERE status IN {owed} AND {due} {filters}
    ORDER BY {order}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED"""

# The same rows taken from each receiver's own rank index, then merged: the rest of a
# lane whose limited receivers are claimed apart (``skip``), so the claim never steps
# over their waiting rows in the lane's rank order (2,000 ahead cost a claim 0.25 ms).
# Each receiver locks up to the batch, the merge keeps the batch: for a few receivers
# only (PER_KEY_MOST), since the rows locked and not kept grow with their number.
_PICKED_PER_KEY = """
    SELECT x.* FROM unnest(%(keys)s::text[]) AS k(key)
    CROSS JOIN LATERAL ({picked}
    ) AS x
    ORDER BY x.was_rank, x.id
    LIMIT %(limit)s"""
PER_KEY_MOST = 4

_CLAIM_COLUMNS = """status AS was_status, claimed_by AS was_by, claimed_at AS was_at,
           claim_position AS was_position, receiver_key"""
_LOCK_COLUMNS = """event_id, receiver_key, target, attempts, max_attempts, due_at,
           expires_at, last_error"""


def claim_postgresql(alias: str, args: ClaimArgs) -> list[Claim]:
    filters = []
    picked, order, per_key = _PICKED, "claim_rank, id", False
    if args.skip and args.only is not None and args.orphans is None:
        rest = tuple(key for key in args.only if key not in args.skip)
        if len(rest) <= PER_KEY_MOST:  # each receiver's own index, not the lane's filtered
            args = replace(args, only=rest, skip=())
            per_key = len(rest) > 1
    if per_key:
        picked = _PICKED_PER_KEY.format(picked=_PICKED)
        order = "receiver_key, claim_rank, id"
        # A range, not "=": the planner would drop a key equal to a parameter from the
        # order and read the lane's rank index, filtering (it cannot see that the limited
        # rows lie ahead of the others'); the range keeps the order only the receiver's
        # own index gives.
        filters.append("AND receiver_key >= k.key AND receiver_key <= k.key")
    params: dict[str, Any] = {
        "now": args.now,
        "limit": args.limit,
        "worker": args.worker_id,
        "lease_end": args.lease_end,
        "task_keys": list(args.task_keys),
        "inline": INLINE_PAYLOAD_BYTES,
        "at_once": args.at_once,
        "alone_ok": args.alone_ok,
        "now_rank": priority.rank(args.now),
        "lease_end_rank": priority.rank(args.lease_end),
        "window": priority.window(args.now),
        "first": args.first,
    }
    if per_key:
        params["keys"] = list(args.only or ())
    elif args.only is not None and len(args.only) == 1 and args.orphans is None:
        filters.append("AND receiver_key = %(one)s")  # one receiver: its own index
        params["one"] = args.only[0]
    elif args.only is not None and args.orphans is None:
        filters.append("AND receiver_key = ANY(%(only)s)")
        params["only"] = list(args.only)
    elif args.only is not None and args.orphans is not None:
        filters.append(
            "AND (receiver_key = ANY(%(only)s) OR (due_at <= %(orphans_due)s "
            "AND NOT (receiver_key = ANY(%(declared)s))))"
        )
        params.update(only=list(args.only), orphans_due=args.orphans[0])
        params["declared"] = list(args.orphans[1])
    if args.skip:
        filters.append("AND NOT (receiver_key = ANY(%(skip)s))")
        params["skip"] = list(args.skip)
    if args.exclude:
        filters.append("AND NOT (id = ANY(%(exclude)s))")
        params["exclude"] = list(args.exclude)
    if args.ids is not None:
        filters.append("AND id = ANY(%(ids)s)")
        params["ids"] = list(args.ids)
    connection = connections[alias]
    delivery = connection.ops.quote_name(table(DeliveryRecord))
    if ordering.in_use():
        filters.append("AND " + ordering.head_sql(delivery, delivery))
        params["blocking"] = list(ordering.blocking_keys())
    due = _due_sql(args.ignore_backoff)
    old_claim = ("p.was_status", "p.was_position", "p.was_by", "p.was_at", "p.receiver_key")
    sql = _POSTGRESQL_CLAIM.format(
        picked=picked.format(
            columns=_CLAIM_COLUMNS,
            delivery=delivery,
            owed=STATUS_SQL["owed"],
            due=due,
            filters=" ".join(filters),
            order=order,
        ),
        delivery=delivery,
        event_of_row=_EVENT_OF_ROW.format(event=connection.ops.quote_name(table(EventRecord))),
        running=running_sql(
            dict(zip(ROW_COLUMNS, old_claim, strict=True)), delivery=delivery, is_task=_pg_is_task
        ),
        is_task=_pg_is_task("p.receiver_key"),
        kept=KEPT_SQL,
        micros_due=_micros("c.due_at"),
        micros_expires=_micros("c.expires_at"),
        micros_occurred=_micros("e.occurred_at"),
        **STATUS_SQL,
    )
    return as_claims(_fetch(connection, sql, params), args)


# The rows a claim by row lock takes (``locked.py``): the same owed rows in the same
# order, locked and returned with their events, nothing written.
_POSTGRESQL_LOCK = """
WITH picked AS ({picked}
)
SELECT c.id, c.event_id, c.receiver_key, c.target, c.attempts, c.max_attempts,
       {micros_due}, {micros_expires}, e.name, e.version,
       CASE WHEN octet_length(e.text) <= %(inline)s THEN e.text END, {micros_occurred},
       e.actor_key, e.actor_label, e.scope::text, e.correlation_id, c.last_error,
       e.trace_context, e.causation_id, false
FROM picked AS c
CROSS JOIN LATERAL ({event_of_row}) AS e
ORDER BY c.was_rank, c.id
"""


def lock_postgresql(connection: Any, args: ClaimArgs) -> list[Claim]:
    """Lock up to ``args.limit`` owed rows of the receivers ``args.only`` in the claim's
    order, in the transaction open on ``connection``, and return them as claims of
    ``args.worker_id`` at ``args.now``: a claim by row lock (``locked.py``)."""
    delivery = connection.ops.quote_name(table(DeliveryRecord))
    filters = ["AND receiver_key = ANY(%(only)s)"]
    params: dict[str, Any] = {
        "now": args.now,
        "limit": args.limit,
        "only": list(args.only or ()),
        "inline": INLINE_PAYLOAD_BYTES,
        "window": priority.window(args.now),
    }
    if args.exclude:
        filters.append("AND NOT (id = ANY(%(exclude)s))")
        params["exclude"] = list(args.exclude)
    sql = _POSTGRESQL_LOCK.format(
        picked=_PICKED.format(
            columns=_LOCK_COLUMNS,
            delivery=delivery,
            owed=STATUS_SQL["owed"],
            due=_due_sql(args.ignore_backoff),
            filters=" ".join(filters),
            order="claim_rank, id",
        ),
        event_of_row=_EVENT_OF_ROW.format(event=connection.ops.quote_name(table(EventRecord))),
        micros_due=_micros("c.due_at"),
        micros_expires=_micros("c.expires_at"),
        micros_occurred=_micros("e.occurred_at"),
    )
    return as_claims(_fetch(connection, sql, params), args)


def _fetch(connection: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of a claim statement.

    Where the database's ``OPTIONS`` allow prepared statements (``prepare_threshold``,
    which Django leaves off by default for transaction-mode connection poolers), the
    statement is bound on the server, so psycopg prepares it once it has run that many
    times on the connection: PostgreSQL then parses and analyses it once per connection,
    not at every claim. Elsewhere it runs as every other statement does.
    """
    with _cursor(connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _cursor(connection: Any) -> Any:
    """A cursor on ``connection`` that psycopg may prepare statements on, where its
    ``prepare_threshold`` is set; else the connection's usual cursor."""
    connection.ensure_connection()
    driver = connection.connection
    if getattr(driver, "prepare_threshold", None) is None:  # psycopg 2, or Django's default
        return connection.cursor()
    from psycopg import Cursor  # psycopg 3: the only driver with prepare_threshold

    connection.validate_thread_sharing()
    bound = Cursor(driver)
    if connection.queries_logged:
        return connection.make_debug_cursor(bound)
    return connection.make_cursor(bound)


def _due_sql(ignore_backoff: bool) -> str:
    """Which owed rows are due: by ``available_at`` within the priority window, or, with
    ``ignore_backoff`` (tests), also failed rows waiting out their backoff."""
    if ignore_backoff:
        return "(available_at <= %(now)s OR (status = {failed} AND due_at <= %(now)s))".format(
            **STATUS_SQL
        )
    return "available_at <= %(now)s AND claim_rank <= %(window)s"


def _micros(column: str) -> str:
    """A ``timestamptz`` column as microseconds since the epoch: a claim's 500 rows read
    as integers cost a tenth of their timestamps parsed by the driver (about 3 ms)."""
    return f"(extract(epoch FROM {column}) * 1000000)::bigint"
