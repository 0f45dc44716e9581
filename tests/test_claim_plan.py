"""The claim's plan on PostgreSQL under a large backlog: the rank index, never the table.

50,000 owed rows over five priorities and four receivers in two lanes, 10,000 scheduled
for later and 100,000 settled, analysed as production statistics would be: each claim a
relay makes (a lane, the default lane with its orphans, a lane with a limited receiver)
reads a partial index in claim order and stops at its batch; no statement of it reads the
delivery table through a sequential scan, and the rows it picks need no sort.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_domain_events import fire, priority, receiver
from django_domain_events.delivery import limits
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.delivery.claim_postgresql import lock_postgresql
from django_domain_events.delivery.claim_rows import ClaimArgs
from django_domain_events.models import DeliveryRecord, EventRecord
from tests.app.events import OrderPlaced
from tests.conftest import needs_postgresql

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql]

OWED, SCHEDULED, SETTLED = 50_000, 10_000, 100_000
PRIORITIES = (0, 1, 5, 10, -1)
KEYS = ("plan.bulk", "plan.urgent", "plan.mail", "plan.slow")

# Rows of one event, as generate_series(1, n) AS g numbers them: the key, target and
# priority follow g, and available_at (with claim_rank) spreads over the hour before
# %(now)s (owed) or the days after it (scheduled).
_SEED = """
INSERT INTO {table} (event_id, receiver_key, target, status, attempts, max_attempts,
    available_at, due_at, priority_credit, claim_rank, claimed_by, claim_position,
    last_error, completed_at)
SELECT %(event)s, (%(keys)s::text[])[1 + g %% 4], %(tag)s || g, %(status)s, 0, 10,
       at, at, c.credit,
       floor(extract(epoch FROM at) * 1000000)::bigint - c.credit, '', 0, '',
       CASE WHEN %(status)s = 'succeeded' THEN at END
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (SELECT %(now)s::timestamptz + g * %(step)s * interval '1 millisecond'
                    AS at) AS t
CROSS JOIN LATERAL (SELECT (%(credits)s::bigint[])[1 + g %% 5] AS credit) AS c
"""


def seed(one_lane: str | None = None, **mail_limits: Any) -> None:
    """The backlog; ``mail_limits``: the limits ``plan.mail`` declares; ``one_lane``:
    every receiver in that lane (else ``plan.slow`` in "slow", the others "default")."""
    for key in KEYS:
        lane = one_lane or ("slow" if key == "plan.slow" else "default")
        options = mail_limits if key == "plan.mail" else {}
        receiver(OrderPlaced, key=key, lane=lane, **options)(lambda evt: None)
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=1))
    DeliveryRecord.objects.all().delete()
    now = timezone.now()
    credits = [priority.credit(p) for p in PRIORITIES]
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    batches = [
        ("owed-", "pending", OWED, -3600_000 // OWED),  # due over the last hour
        ("later-", "pending", SCHEDULED, 7 * 86400_000 // SCHEDULED),  # the next week
        ("done-", "succeeded", SETTLED, -86400_000 // SETTLED),  # the last day
    ]
    with connection.cursor() as cursor:
        for tag, status, n, step in batches:
            cursor.execute(
                _SEED.format(table=table),
                {
                    "event": event_id,
                    "keys": list(KEYS),
                    "tag": tag,
                    "status": status,
                    "n": n,
                    "now": now,
                    "step": step,
                    "credits": credits,
                },
            )
        cursor.execute(f"ANALYZE {table}")
    assert DeliveryRecord.objects.count() == OWED + SCHEDULED + SETTLED


def sent(claim: Callable[[], object]) -> list[tuple[str, Any]]:
    """The statements ``claim`` sends, with their parameters, rolled back."""
    statements: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(record):
            claim()
        transaction.set_rollback(True)
    return statements


def claim_plans(claim: Callable[[], object]) -> list[dict[str, Any]]:
    """The plan of every claim statement ``claim`` sends (EXPLAIN, not run)."""
    plans = []
    with connection.cursor() as cursor:
        for sql, params in sent(claim):
            if "SKIP LOCKED" in sql and "picked AS" in sql:  # not a limit's lock
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                found = cursor.fetchone()[0]
                plans.append((json.loads(found) if isinstance(found, str) else found)[0]["Plan"])
    assert plans, "the claim sent no claim statement"
    return plans


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def picked(plan: dict[str, Any]) -> dict[str, Any]:
    """The CTE that picks the rows (``WITH picked AS (... FOR UPDATE SKIP LOCKED)``)."""
    return next(n for n in nodes(plan) if n.get("Subplan Name") == "CTE picked")


def assert_reads_the_index(plan: dict[str, Any], *indexes: str) -> None:
    table = DeliveryRecord._meta.db_table
    seq = [n for n in nodes(plan) if n["Node Type"] == "Seq Scan"]
    assert not [n for n in seq if n.get("Relation Name") == table], json.dumps(plan, indent=1)
    pick = list(nodes(picked(plan)))
    scans = [n for n in pick if n.get("Relation Name") == table]
    assert [n["Node Type"] for n in scans] == ["Index Scan"], json.dumps(plan, indent=1)
    assert scans[0]["Index Name"] in indexes
    assert not [n for n in pick if n["Node Type"] in ("Sort", "Incremental Sort")]
    assert picked(plan)["Node Type"] == "Limit"


def test_each_claim_reads_its_rank_index_under_a_large_backlog() -> None:
    seed()
    now = timezone.now()

    def claim(lane: str) -> Callable[[], object]:
        return lambda: claim_batch(worker_id="w", now=now, lease=60, limit=32, lane=lane)

    (default,) = claim_plans(claim("default"))  # with the orphans' condition
    assert_reads_the_index(default, "dde_delivery_claim_rank")
    (slow,) = claim_plans(claim("slow"))
    assert_reads_the_index(slow, "dde_delivery_claim_rank")
    everywhere = claim_plans(
        lambda: claim_batch(worker_id="w", now=now, lease=60, limit=32)  # every lane
    )
    assert_reads_the_index(everywhere[0], "dde_delivery_claim_rank")


def test_a_lane_with_a_limited_receiver_reads_the_receivers_rank_index() -> None:
    seed(rate_limit="10/s", concurrency_limit=50)  # two tokens: the rest claims too
    now = timezone.now()
    limited, rest = claim_plans(
        lambda: claim_batch(worker_id="w", now=now, lease=60, limit=32, lane="default")
    )
    # The receiver's own rows in rank order, or (when its rows are common) every owed
    # row in rank order, filtered: the planner's choice, neither sorts nor reads the table.
    assert_reads_the_index(limited, "dde_delivery_key_rank", "dde_delivery_claim_rank")
    assert_reads_the_index(rest, "dde_delivery_claim_rank")


def test_the_rest_of_a_lane_reads_each_receivers_index_past_a_limited_backlog() -> None:
    # Not the lane's rank order, which would step over every waiting row of the limited
    # receiver ahead of the others' (a quarter of the 50,000 here): each other receiver's
    # own rows in rank order, merged.
    seed(one_lane="bulk", rate_limit="10/s")
    now = timezone.now()
    limited, rest = claim_plans(
        lambda: claim_batch(worker_id="w", now=now, lease=60, limit=32, lane="bulk")
    )
    assert_reads_the_index(limited, "dde_delivery_key_rank", "dde_delivery_claim_rank")
    table = DeliveryRecord._meta.db_table
    scans = [n for n in nodes(picked(rest)) if n.get("Relation Name") == table]
    assert scans and {(n["Node Type"], n["Index Name"]) for n in scans} == {
        ("Index Scan", "dde_delivery_key_rank")
    }, json.dumps(rest, indent=1)
    seq = [n for n in nodes(rest) if n["Node Type"] == "Seq Scan"]
    assert not [n for n in seq if n.get("Relation Name") == table]
    # The claim above was rolled back: its tokens unspent, the limit's row not written.
    limits._empty_until.clear()
    limits._seen_at.clear()
    with transaction.atomic():
        claims = claim_batch(worker_id="w", now=now, lease=60, limit=32, lane="bulk")
        transaction.set_rollback(True)
    # The limited receiver's two tokens, then the others' oldest rows, in rank order.
    assert [c.receiver_key for c in claims].count("plan.mail") == 2
    ranks = DeliveryRecord.objects.filter(id__in=[c.id for c in claims[2:]])
    assert len(claims) == 32 and "plan.mail" not in {r.receiver_key for r in ranks}
    oldest = (
        DeliveryRecord.objects.filter(status="pending", available_at__lte=now)
        .exclude(receiver_key="plan.mail")
        .order_by("claim_rank", "id")
        .values_list("id", flat=True)[:30]
    )
    assert [c.id for c in claims[2:]] == list(oldest)


# Rows another relay holds, as many as a busy fleet (or a task queue's backlog) does: a
# claim of rows that each run on their own never reads them. It used to, at every claim:
# the step that hands back the unstarted rest of a lapsed in-order batch scanned every
# held row (and every dead index entry of rows settled since the last vacuum) to find
# that no picked row had lapsed.
_HOLD = """
UPDATE {table} SET status = 'claimed', claimed_by = 'elsewhere', claimed_at = %(now)s,
    claim_position = id %% 50, lease_expires_at = %(until)s, available_at = %(until)s
WHERE id IN (SELECT id FROM {table} WHERE status = 'pending' AND available_at <= %(now)s
             ORDER BY id LIMIT %(n)s)
"""


def analysed_claim(claim: Callable[[], object]) -> dict[str, Any]:
    """The plan of the one claim statement ``claim`` sends, as it ran (EXPLAIN ANALYZE,
    rolled back)."""
    (sql, params), *_ = [(s, p) for s, p in sent(claim) if "picked AS" in s]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            found = cursor.fetchone()[0]
        transaction.set_rollback(True)
    return (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]


def test_a_claim_never_reads_the_rows_other_relays_hold() -> None:
    seed()
    now = timezone.now()
    table = connection.ops.quote_name(DeliveryRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            _HOLD.format(table=table),
            {"now": now, "until": now + timedelta(hours=1), "n": 20_000},
        )  # not analysed since: the statistics saw none held, as after a quiet hour
    assert DeliveryRecord.objects.filter(status="claimed").count() == 20_000
    plan = analysed_claim(
        lambda: claim_batch(worker_id="w", now=now, lease=60, limit=32, lane="default")
    )
    unstarted = next(n for n in nodes(plan) if n.get("Subplan Name") == "CTE unstarted")
    reads = [
        n
        for n in nodes(unstarted)
        if n.get("Relation Name") == DeliveryRecord._meta.db_table and n["Actual Loops"]
    ]
    assert not reads, json.dumps(unstarted, indent=1)
    assert plan["Actual Rows"] == 32  # the claim took its batch


def prepared_claims() -> list[str]:
    """The claim statements PostgreSQL holds prepared for this connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%picked AS%"],
        )
        return [row[0] for row in cursor.fetchall()]


def test_the_claim_is_prepared_once_the_database_options_allow_it() -> None:
    receiver(OrderPlaced, key="plan.bulk")(lambda evt: None)
    with transaction.atomic():
        for order_id in range(30):
            fire(OrderPlaced(order_id=order_id))
    connection.ensure_connection()
    driver = connection.connection
    allowed = driver.prepare_threshold
    now = timezone.now()
    taken: list[int] = []

    def claim_three() -> list[int]:
        claims = claim_batch(worker_id="w", now=now, lease=60, limit=3, lane="default")
        assert len(claims) == 3
        return [c.id for c in claims]

    try:
        driver.prepare_threshold = None  # Django's default: nothing is prepared
        taken += claim_three() + claim_three()
        assert prepared_claims() == []
        # OPTIONS {"prepare_threshold": 2}: psycopg prepares a statement at its third run
        driver.prepare_threshold = 2
        taken += claim_three() + claim_three() + claim_three()
        assert len(prepared_claims()) == 1
        taken += claim_three()  # run prepared: the next rows, in order
        # A rolled-back transaction makes psycopg deallocate what it prepared: a claim
        # inside one takes nothing for good, and the claims after it prepare it again.
        with transaction.atomic():
            claim_three()
            transaction.set_rollback(True)
        taken += claim_three() + claim_three()
        assert prepared_claims() == []
        taken += claim_three()
        assert len(prepared_claims()) == 1
        taken += claim_three()
    finally:
        driver.prepare_threshold = allowed
    owed = DeliveryRecord.objects.order_by("id").values_list("id", flat=True)
    assert taken == list(owed)
    assert set(DeliveryRecord.objects.values_list("status", flat=True)) == {"claimed"}


# One owed row per event, as a publisher's outbox is: the planner was free to hash the
# whole event log (and, for a claim by row lock, the whole delivery table) instead of
# reading each row's event by its key, and did on a log of 10,000 events.
_SEED_EVENTS = """
WITH events AS (
    INSERT INTO {event} (name, version, payload, occurred_at, recorded_at, actor_key,
        actor_label, scope, correlation_id, suppressed_reason, delete_when, trace_context)
    SELECT 'testapp.OrderPlaced', 1, jsonb_build_object('order_id', g), %(now)s, %(now)s,
           '', '', '{{}}'::jsonb, md5(g::text), '', '', ''
    FROM generate_series(1, %(n)s) AS g
    RETURNING id
)
INSERT INTO {delivery} (event_id, receiver_key, target, status, attempts, max_attempts,
    available_at, due_at, priority_credit, claim_rank, claimed_by, claim_position,
    last_error)
SELECT id, 'plan.bulk', '', 'pending', 0, 10, %(now)s, %(now)s, 0,
       floor(extract(epoch FROM %(now)s::timestamptz) * 1000000)::bigint, '', 0, ''
FROM events
"""


def test_every_claim_reads_its_rows_events_by_their_key_whatever_the_logs_size() -> None:
    receiver(OrderPlaced, key="plan.bulk")(lambda evt: None)
    now = timezone.now()
    quote = connection.ops.quote_name
    event, delivery = quote(EventRecord._meta.db_table), quote(DeliveryRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            _SEED_EVENTS.format(event=event, delivery=delivery), {"now": now, "n": 10_000}
        )
        cursor.execute(f"ANALYZE {event}")
        cursor.execute(f"ANALYZE {delivery}")
    later = now + timedelta(seconds=1)
    args = ClaimArgs(
        "w", later, later + timedelta(seconds=60), 500, ("plan.bulk",), None, (), None, False
    )
    (usual,) = claim_plans(
        lambda: claim_batch(worker_id="w", now=later, lease=60, limit=500, lane="default")
    )
    (by_lock,) = claim_plans(lambda: lock_postgresql(connection, args))
    # The claim by row lock reads the delivery table only through its rank index (the
    # usual claim's writes may still hash a table this small: measured, not its events).
    seq = [n for n in nodes(by_lock) if n["Node Type"] == "Seq Scan"]
    assert not seq, json.dumps(by_lock, indent=1)
    assert_reads_the_index(by_lock, "dde_delivery_claim_rank", "dde_delivery_key_rank")
    for plan in (usual, by_lock):
        reads = [n for n in nodes(plan) if n.get("Relation Name") == EventRecord._meta.db_table]
        assert [(n["Node Type"], n["Index Name"]) for n in reads] == [
            ("Index Scan", f"{EventRecord._meta.db_table}_pkey")
        ], json.dumps(plan, indent=1)
