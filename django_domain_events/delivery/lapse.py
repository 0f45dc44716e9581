"""The lapse rule: what claiming a row whose lease lapsed costs it, and how it runs next.

A claimed row whose lease lapsed lost its worker: killed (a segfault, an OOM kill,
``os._exit``), or hung past ``RUN_LIMIT_SECONDS``. The claim that takes it over is
charged the attempt the lost worker was making, exactly when that worker had started
the row:

- a row its worker ran at once with the rest of its claim (``claim_position`` 0: a
  relay's pool claims only for free slots, a task worker takes one row, a row runs
  alone) was running;
- a ``site="task"`` row was handed to the queue: the hand-off is its attempt, so a
  message no worker takes is charged at each lapse and ends dead after its attempts;
- a row of a batch run in order (``claim_position`` 1, 2, ...) was running exactly when
  no row before it in that batch is still held by it (not counting task rows, which the
  relay only handed on). The rows after it had not started: those whose own lease
  lapsed too are handed back, uncharged, by the statement that charges it.

A row whose lease is alive is never touched. A charged row (other than a task row) is
claimed alone, with ``Claim.alone`` set, and runs with nothing beside it in its relay:
a row that kills its relay then identifies itself and dies after its attempts, while
the rows that ran beside it the first time are charged once and then run on their own.
A claim that finds a row to run alone takes that row by itself when it is first in
line and the relay runs nothing else (``alone_ok``), and otherwise only the rows before
it; so a busy relay stops claiming until it is idle, and the row's turn comes.

PostgreSQL applies the rule inside its one claim statement, the other databases in the
portable claim (``running_ids``): both test a row with ``running_sql`` and keep rows
with ``keep_count`` (whose SQL twin is ``KEPT_SQL``), and ``tests/test_lapse.py`` runs
the same cases against each.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from django.db import connections
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from ..models import STATUS_SQL, DeliveryRecord

# The columns of the row being judged, as the caller's SQL names them.
ROW_COLUMNS = ("status", "position", "claimed_by", "claimed_at", "receiver_key")


def running_sql(row: dict[str, str], *, delivery: str, is_task: Callable[[str], str]) -> str:
    """SQL true when the picked ``row`` (its old claim's columns, by ``ROW_COLUMNS``) was
    running when its lease lapsed; ``is_task(expr)`` tests a receiver key for
    ``site="task"``. Used twice by ``is_task``: the row's key, then a sibling's."""
    return (
        f"(CASE WHEN {row['status']} <> {STATUS_SQL['claimed']} THEN false "
        f"WHEN {row['position']} = 0 THEN true "
        f"WHEN {is_task(row['receiver_key'])} THEN true "
        f"ELSE NOT EXISTS (SELECT 1 FROM {delivery} AS earlier "
        f"WHERE earlier.status = {STATUS_SQL['claimed']} "
        f"AND earlier.claimed_by = {row['claimed_by']} "
        f"AND earlier.claimed_at = {row['claimed_at']} "
        f"AND earlier.claim_position > 0 AND earlier.claim_position < {row['position']} "
        f"AND NOT {is_task('earlier.receiver_key')}) END)"
    )


def keep_count(alone: Sequence[bool], *, alone_ok: bool) -> int:
    """How many of the picked rows, in claim order, a claim keeps: the first alone when it
    must run alone and the relay may run it so, else the rows before the first such row."""
    first = next((i for i, flag in enumerate(alone) if flag), None)
    if first is None:
        return len(alone)
    if first == 0:
        return 1 if alone_ok else 0
    return first


# keep_count in SQL, over the numbered picked rows (``position``, ``alone``) as ``n``.
KEPT_SQL = """
SELECT n.* FROM numbered AS n
CROSS JOIN (SELECT min(position) AS at FROM numbered WHERE alone) AS first_alone
WHERE first_alone.at IS NULL OR n.position < first_alone.at
   OR (n.position = 1 AND %(alone_ok)s)
"""


def running_ids(alias: str, lapsed: Sequence[int], task_keys: Collection[str]) -> set[int]:
    """Of the ``lapsed`` rows a portable claim picked (still claimed by a lost worker),
    those it was running, by ``running_sql``. Read after the pick, not in it: a locking
    read would skip the siblings it looks at."""
    if not lapsed:
        return set()
    quote = connections[alias].ops.quote_name
    table = quote(DeliveryRecord._meta.db_table)
    keys = list(task_keys)

    def is_task(expr: str) -> str:
        return f"({expr} IN ({', '.join(['%s'] * len(keys))}))" if keys else "(1 = 0)"

    columns = ("status", "claim_position", "claimed_by", "claimed_at", "receiver_key")
    row = {name: f"{table}.{quote(c)}" for name, c in zip(ROW_COLUMNS, columns, strict=True)}
    sql = running_sql(row, delivery=table, is_task=is_task)
    judged = (
        DeliveryRecord.objects.using(alias)
        .filter(id__in=lapsed)
        .annotate(running=RawSQL(sql, [*keys, *keys], output_field=BooleanField()))
        .values_list("id", "running")
    )
    return {pk for pk, running in judged if running}
