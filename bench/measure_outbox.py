"""Sections 5-7 of ``bench/run.py``: the relay as a process, and claims and health against a
large table. Imported only after ``django.setup()``.

5. relay: ``manage.py deliver_events`` started as child processes (``bench/relay_child.py``):
   wake-up latency of a LISTENing relay, and the throughput of one and of two
   ``--once`` relays against the raw psycopg loop on the same rows.
6. claim: ``claim_batch()`` and ``outbox_health()`` with an empty table and with settled
   history and scheduled rows, call by call in alternation (one schema per state).
7. scheduled: the same probe with scheduled rows only.
13. dashboard: the admin dashboard's figures (``outbox_dashboard()``) and their rendering,
   an empty table against section 6's large one.

Every phase is checked afterwards, as in ``measure.py``: rows delivered exactly once,
claims that took exactly the rows meant, health that counted what was seeded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Min
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench import measure
from bench.events import RELAY_NOOP_KEY, Relayed
from django_domain_events import conf, fire, tally
from django_domain_events.delivery.claim import claim_batch
from django_domain_events.introspect import OutboxHealth, outbox_health
from django_domain_events.models import DeliveryRecord, DeliveryStatus, EventRecord, ScheduledTally

CHILD = Path(__file__).resolve().parent / "relay_child.py"
LATENCY_POLL_SECONDS = 10  # the relay's poll: far above the target, so only NOTIFY wakes it
LISTEN_SETTLE_SECONDS = 2.0  # after start-up: its first pass done, LISTENing
CLAIM_LIMIT = 50
CLAIM_LEASE_SECONDS = 60
WARMUP_REPS = 3
EXPLAIN_REPS = 5  # EXPLAIN ANALYZE runs of the claim and of outbox_health() per state
SCHEDULED_AHEAD = timedelta(days=30)


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def p95_ms(values: list[float]) -> float:
    """Nearest-rank 95th percentile, in ms."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000


# ---------------------------------------------------------------- CPU accounting


@dataclass
class CpuUse:
    """CPU time over an interval: the delivering side's (the relay processes, from what
    they print, without their start-up; or this process for the raw loop), and the whole
    machine's busy share (everything: relays, PostgreSQL, other work)."""

    client_seconds: float = 0.0
    machine_busy: float = 0.0  # share of all cores, 0..1
    cores: int = 1

    def per_delivery_us(self, deliveries: int) -> float:
        return self.client_seconds * 1e6 / deliveries


def _machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


@contextlib.contextmanager
def cpu_use() -> Iterator[CpuUse]:
    """The machine's busy share meanwhile; the caller fills in ``client_seconds``."""
    used = CpuUse(cores=os.cpu_count() or 1)
    jiffies = _machine_jiffies()
    try:
        yield used
    finally:
        now = _machine_jiffies()
        if jiffies is not None and now is not None and now[1] > jiffies[1]:
            used.machine_busy = (now[0] - jiffies[0]) / (now[1] - jiffies[1])


_CPU_MARK = re.compile(r"^relay cpu-(start|end) ([\d.]+)$", re.MULTILINE)


def relay_cpu_seconds(output: str) -> float:
    """The CPU a relay child spent in ``call_command`` (it prints process_time around it)."""
    marks = dict(_CPU_MARK.findall(output))
    if set(marks) != {"start", "end"}:
        raise RuntimeError(f"relay output without its CPU marks:\n{output}")
    return float(marks["end"]) - float(marks["start"])


# ---------------------------------------------------------------- relay child processes


@dataclass
class Child:
    label: str
    process: subprocess.Popen[str]
    ready: Path

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.process.poll() is not None:
                _, output = self.finish(timeout=5)
                raise RuntimeError(f"relay {self.label} exited while starting:\n{output}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"relay {self.label} not started after {timeout}s")
            time.sleep(0.01)

    def finish(self, timeout: float) -> tuple[int, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out + err

    def check_finished(self, timeout: float) -> str:
        code, output = self.finish(timeout)
        if code != 0:
            raise RuntimeError(f"relay {self.label} exited with status {code}:\n{output}")
        return output

    def stop(self) -> None:
        """SIGTERM if still running (finishes the delivery in hand), SIGKILL after 10 s."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()


def start_relay(
    label: str,
    args: list[str],
    workdir: Path,
    *,
    settings: dict[str, Any] | None = None,
    go: Path | None = None,
) -> Child:
    """``manage.py deliver_events ARGS`` in a child process on the bench database."""
    ready = workdir / f"ready-{label}"
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(measure.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["DDE_BENCH_READY_FILE"] = str(ready)
    env.pop("DDE_BENCH_GO_FILE", None)
    if go is not None:
        env["DDE_BENCH_GO_FILE"] = str(go)
    if settings:
        env["DDE_BENCH_SETTINGS_JSON"] = json.dumps(settings)
    process = subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=env,
        cwd=measure.REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Child(label, process, ready)


@contextlib.contextmanager
def relays(children: list[Child]) -> Iterator[list[Child]]:
    """Stops (SIGTERM, then SIGKILL) whatever of ``children`` still runs on the way out."""
    try:
        yield children
    finally:
        for child in children:
            child.stop()


# ---------------------------------------------------------------- 5. the relay: latency


@dataclass
class LatencyResult:
    label: str
    spacing: float  # seconds from one fire to the next, at least
    from_recorded: list[float] = field(default_factory=list)  # succeeded_at - recorded_at
    from_commit: list[float] = field(default_factory=list)  # succeeded_at - COMMIT returned
    background: str = ""

    @property
    def events(self) -> int:
        return len(self.from_recorded)


def _wait_succeeded(event_id: int, child: Child, timeout: float) -> None:
    rows = DeliveryRecord.objects.filter(event_id=event_id, status=DeliveryStatus.SUCCEEDED)
    deadline = time.monotonic() + timeout
    while not rows.exists():
        if child.process.poll() is not None:
            _, output = child.finish(timeout=5)
            raise RuntimeError(f"the latency relay exited:\n{output}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"event {event_id} not delivered after {timeout}s")
        time.sleep(0.005)


def _fire_one_by_one(
    count: int, spacing: float, child: Child, committed: dict[int, datetime]
) -> list[int]:
    """``count`` events, each in its own transaction, the next once the previous one was
    delivered and ``spacing`` seconds passed since it was fired; records when each COMMIT
    returned."""
    commits: list[datetime] = []
    fired: list[int] = []
    for n in range(count):
        started = time.monotonic()
        with transaction.atomic():
            # Registered before fire()'s own: runs first, as soon as COMMIT returned.
            transaction.on_commit(lambda: commits.append(timezone.now()))
            event_id = fire(Relayed(n=n))
        if event_id is None:
            raise RuntimeError("fire(Relayed(...)) recorded nothing: is it suppressed?")
        committed[event_id] = commits[-1]
        fired.append(event_id)
        _wait_succeeded(event_id, child, timeout=LATENCY_POLL_SECONDS + 5)
        time.sleep(max(0.0, spacing - (time.monotonic() - started)))
    return fired


def relay_latency(paced: int, unpaced: int) -> tuple[LatencyResult, LatencyResult]:
    """One LISTENing relay (``POLL_SECONDS`` 10). First ``paced`` events, one at a time,
    each fired once the previous one was delivered and the NOTIFY coalescing window has
    passed, so that each commit sends its own NOTIFY; then ``unpaced`` events, each fired
    as soon as the previous one was delivered (inside the window: the wake-up is the
    trailing NOTIFY at its end)."""
    window = conf.get().NOTIFY_COALESCE_SECONDS
    measure.reset_tables()
    measure.settle_database()
    committed: dict[int, datetime] = {}
    results = [
        LatencyResult(
            f"paced: one fire per {window + 0.1:.1f} s, each outside the previous one's "
            f"NOTIFY coalescing window ({window} s)",
            window + 0.1,
        ),
        LatencyResult(
            "unpaced: each fire as soon as the previous event was delivered (inside its window)",
            0.0,
        ),
    ]
    phases: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="dde-bench-") as tmp:
        child = start_relay(
            "bench-latency",
            ["--worker-id", "bench-latency"],
            Path(tmp),
            settings={"POLL_SECONDS": LATENCY_POLL_SECONDS},
        )
        with relays([child]):
            child.wait_ready()
            time.sleep(LISTEN_SETTLE_SECONDS)
            for result, count in zip(results, (paced, unpaced), strict=True):
                with measure.BackgroundLoad() as load:
                    phases.append(_fire_one_by_one(count, result.spacing, child, committed))
                result.background = load.summary()
                time.sleep(window + 0.1)  # the next phase starts outside the window
            child.process.send_signal(signal.SIGTERM)
            child.check_finished(timeout=30)
    rows = {
        r[0]: r
        for r in DeliveryRecord.objects.filter(receiver_key=RELAY_NOOP_KEY).values_list(
            "event_id", "status", "attempts", "claimed_by", "succeeded_at", "event__recorded_at"
        )
    }
    wrong = [r for r in rows.values() if r[1:4] != (DeliveryStatus.SUCCEEDED, 1, "bench-latency")]
    if set(rows) != set(committed) or wrong:
        raise RuntimeError(
            f"latency: {len(rows)} rows for {len(committed)} events; wrong: {wrong[:3]}"
        )
    for result, fired in zip(results, phases, strict=True):
        for event_id in fired:
            succeeded_at, recorded_at = rows[event_id][4:6]
            assert succeeded_at is not None  # checked above: every row succeeded
            result.from_recorded.append((succeeded_at - recorded_at).total_seconds())
            result.from_commit.append((succeeded_at - committed[event_id]).total_seconds())
    return results[0], results[1]


# ---------------------------------------------------------------- 5. the relay: throughput


@dataclass
class SpanResult:
    label: str
    deliveries: int
    seconds: float  # max(succeeded_at) - min(claimed_at) over the rows
    by_worker: dict[str, int]
    wall: float  # from the go signal (or the first claim) to the last process's exit
    background: str = ""
    cpu: CpuUse = field(default_factory=CpuUse)

    @property
    def per_second(self) -> float:
        return self.deliveries / self.seconds

    @property
    def ms_each(self) -> float:
        return self.seconds * 1000 / self.deliveries

    def add(self, other: SpanResult) -> SpanResult:
        """Both rounds together: their deliveries, spans, walls and CPU added up."""
        by_worker = dict(self.by_worker)
        for worker, n in other.by_worker.items():
            by_worker[worker] = by_worker.get(worker, 0) + n
        wall = self.wall + other.wall
        busy = (self.cpu.machine_busy * self.wall + other.cpu.machine_busy * other.wall) / wall
        cpu = CpuUse(self.cpu.client_seconds + other.cpu.client_seconds, busy, self.cpu.cores)
        return SpanResult(
            self.label,
            self.deliveries + other.deliveries,
            self.seconds + other.seconds,
            by_worker,
            wall,
            cpu=cpu,
        )


def _check_span(label: str, count: int) -> tuple[float, dict[str, int]]:
    """Every seeded row succeeded on its first attempt; the span from the first claim to
    the last success, and the rows each worker delivered."""
    rows = DeliveryRecord.objects.filter(receiver_key=RELAY_NOOP_KEY)
    total = rows.count()
    once = rows.filter(status=DeliveryStatus.SUCCEEDED, attempts=1).count()
    if total != count or once != count:
        raise RuntimeError(
            f"{label}: {once} of {total} rows succeeded on their first attempt; "
            f"expected {count} of {count}"
        )
    span = rows.aggregate(first=Min("claimed_at"), last=Max("succeeded_at"))
    by_worker = {
        row["claimed_by"]: row["n"]
        for row in rows.values("claimed_by").annotate(n=Count("pk")).order_by()
    }
    return (span["last"] - span["first"]).total_seconds(), by_worker


def _seed_relay_rows(count: int) -> None:
    measure.reset_tables()
    measure.seed_pending(count, Relayed)
    measure.settle_database()


def relay_drain(count: int, processes: int) -> SpanResult:
    """``count`` owed no-op rows drained by ``processes`` ``deliver_events --once
    --batch-size 50`` processes started together (their start-up is not timed)."""
    _seed_relay_rows(count)
    label = f"deliver_events --once x {processes}"
    with tempfile.TemporaryDirectory(prefix="dde-bench-") as tmp:
        go = Path(tmp) / "go"
        args = ["--once", "--batch-size", str(measure.BATCH_SIZE), "--worker-id"]
        children = [
            start_relay(f"bench-relay-{i}", [*args, f"bench-relay-{i}"], Path(tmp), go=go)
            for i in range(processes)
        ]
        with relays(children):
            for child in children:
                child.wait_ready()
            with cpu_use() as cpu:
                started = time.perf_counter()
                go.touch()
                outputs = [child.check_finished(timeout=900) for child in children]
                wall = time.perf_counter() - started
            cpu.client_seconds = sum(relay_cpu_seconds(output) for output in outputs)
    seconds, by_worker = _check_span(label, count)
    return SpanResult(label, count, seconds, by_worker, wall, cpu=cpu)


def raw_span(count: int) -> SpanResult:
    """The same rows drained by ``measure.raw_drain`` (the section 3 loop), timed the
    same way from the rows: it stamps ``claimed_at`` and ``succeeded_at`` with ``now()``."""
    _seed_relay_rows(count)
    with measure.raw_connection() as conn, cpu_use() as cpu:
        started, own = time.perf_counter(), time.process_time()
        done = measure.raw_drain(conn)
        wall = time.perf_counter() - started
        cpu.client_seconds = time.process_time() - own  # the loop runs in this process
    if done != count:
        raise RuntimeError(f"raw drain acknowledged {done} of {count}")
    seconds, by_worker = _check_span("raw psycopg 3", count)
    return SpanResult("raw psycopg 3", count, seconds, by_worker, wall, cpu=cpu)


def relay_throughput(count: int, rounds: int) -> tuple[SpanResult, SpanResult, SpanResult]:
    """The raw loop, one relay process and two, ``count`` rows each in all, drained in
    ``rounds`` alternating rounds (raw, one, two, then two, one, raw, ...) so that all
    three see the same background load; the figures add the rounds up."""
    runs: dict[str, Any] = {
        "raw": lambda n: raw_span(n),
        "one": lambda n: relay_drain(n, 1),
        "two": lambda n: relay_drain(n, 2),
    }
    totals: dict[str, SpanResult] = {}
    per_round = max(1, count // rounds)
    with measure.BackgroundLoad() as load:
        for index in range(rounds):
            order = list(runs) if index % 2 == 0 else list(reversed(runs))
            for name in order:
                result = runs[name](per_round)
                totals[name] = totals[name].add(result) if name in totals else result
    for result in totals.values():
        result.background = load.summary()
    return totals["raw"], totals["one"], totals["two"]


# ---------------------------------------------------------------- 6./7. claims and health


def vacuum_settle() -> None:
    """``VACUUM (ANALYZE)`` both tables (of the current state), then ``CHECKPOINT``: fresh
    statistics, a visibility map, no autovacuum of the seeded rows waking up
    mid-measurement, no dirty pages."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in STATE_TABLES():
            cursor.execute(f"VACUUM (ANALYZE) {quote(table)}")
        cursor.execute("CHECKPOINT")


def _series_sql(event_set: dict[str, str], delivery_set: dict[str, str]) -> str:
    """One statement inserting ``%(count)s`` events, each owing one row, copied from the
    template rows ``%(event_id)s`` / ``%(delivery_id)s`` (so every column fire() writes is
    there, whatever the schema), with the columns in ``*_set`` computed instead (``g``: the
    series number; ``ev``: the new event)."""
    quote = connection.ops.quote_name

    def columns(model: type[Any], computed: dict[str, str]) -> tuple[str, str]:
        names = [
            f.column for f in model._meta.concrete_fields if not (f.primary_key or f.generated)
        ]
        unknown = set(computed) - set(names)
        if unknown:
            raise RuntimeError(f"seeding: {model.__name__} has no column {sorted(unknown)}")
        into = ", ".join(quote(name) for name in names)
        values = ", ".join(computed.get(name, f"t.{quote(name)}") for name in names)
        return into, values

    event_into, event_values = columns(EventRecord, event_set)
    delivery_into, delivery_values = columns(DeliveryRecord, delivery_set)
    return (
        f"WITH ev AS (INSERT INTO {quote(measure.event_table())} ({event_into}) "
        f"SELECT {event_values} FROM {quote(measure.event_table())} AS t "
        "CROSS JOIN generate_series(1, %(count)s) AS g WHERE t.id = %(event_id)s "
        "RETURNING id, recorded_at) "
        f"INSERT INTO {quote(measure.delivery_table())} ({delivery_into}) "
        f"SELECT {delivery_values} FROM ev CROSS JOIN {quote(measure.delivery_table())} AS t "
        "WHERE t.id = %(delivery_id)s"
    )


# One delta per scheduled row, as that many fire() calls append them (tally.py), before
# a relay folds them.
_TALLY_DELTAS_SQL = """
INSERT INTO {tally} (receiver_key, due_hour, rows)
SELECT receiver_key, date_trunc('hour', due_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 1
FROM {delivery} WHERE status = 'pending' ORDER BY id
"""


def _tables() -> dict[str, str]:
    quote = connection.ops.quote_name
    return {
        "tally": quote(str(ScheduledTally._meta.db_table)),
        "delivery": quote(measure.delivery_table()),
    }


def seed_large(settled: int, scheduled: int) -> float:
    """``settled`` succeeded rows (recorded over the last days, one second apart) and
    ``scheduled`` pending rows due ``SCHEDULED_AHEAD`` after they were recorded, each with
    its event, by ``generate_series``; returns the seconds it took."""
    started = time.perf_counter()
    now = timezone.now()
    (template,) = measure.seed_pending(1, Relayed)
    event_id = DeliveryRecord.objects.get(pk=template).event_id
    params: dict[str, Any] = {"event_id": event_id, "delivery_id": template, "now": now}
    recorded = "%(now)s - interval '1 hour' - g * interval '1 second'"
    settled_sql = _series_sql(
        {"occurred_at": recorded, "recorded_at": recorded, "correlation_id": "md5(g::text)"},
        {
            "event_id": "ev.id",
            "status": f"'{DeliveryStatus.SUCCEEDED.value}'",
            "attempts": "1",
            "available_at": "ev.recorded_at",
            "due_at": "ev.recorded_at",
            "claimed_by": "'bench-history'",
            "claimed_at": "ev.recorded_at",
            "completed_at": "ev.recorded_at + interval '10 milliseconds'",
            "succeeded_at": "ev.recorded_at + interval '10 milliseconds'",
        },
    )
    recorded = "%(now)s - g * interval '1 millisecond'"
    ahead = f"ev.recorded_at + interval '{int(SCHEDULED_AHEAD.total_seconds())} seconds'"
    scheduled_sql = _series_sql(
        {"occurred_at": recorded, "recorded_at": recorded, "correlation_id": "md5(g::text)"},
        {
            "event_id": "ev.id",
            "status": f"'{DeliveryStatus.PENDING.value}'",
            "available_at": ahead,
            "due_at": ahead,
        },
    )
    with transaction.atomic(), connection.cursor() as cursor:
        if settled:
            cursor.execute(settled_sql, {**params, "count": settled})
        if scheduled:
            cursor.execute(scheduled_sql, {**params, "count": scheduled})
        DeliveryRecord.objects.filter(pk=template).delete()
        EventRecord.objects.filter(pk=event_id).delete()
        cursor.execute(_TALLY_DELTAS_SQL.format(**_tables()))
    found = {
        row["status"]: row["n"]
        for row in DeliveryRecord.objects.values("status").annotate(n=Count("pk")).order_by()
    }
    want = {k: v for k, v in {"succeeded": settled, "pending": scheduled}.items() if v}
    if found != want:
        raise RuntimeError(f"seeding the large table: found {found}, expected {want}")
    if ScheduledTally.objects.count() != scheduled:
        raise RuntimeError(
            f"seeding the large table: {ScheduledTally.objects.count()} tally deltas for "
            f"{scheduled} scheduled rows"
        )
    vacuum_settle()
    return time.perf_counter() - started


def time_unfolded(label: str, scheduled: int, reps: int) -> list[float]:
    """``outbox_health()`` latencies while the tally still holds one delta per scheduled
    row (the minute after they were fired, before a relay folds them); then fold them, as
    the relay does, and settle the tables again."""
    probe = Probe(label)
    for index in range(WARMUP_REPS + reps):
        _time_health(probe, scheduled, index >= WARMUP_REPS)
    if scheduled:
        tally.compact()
        vacuum_settle()
    return probe.health


@dataclass
class Probe:
    """One table state: ``claim_batch()`` and ``outbox_health()`` latencies, in seconds."""

    label: str
    claim: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    health_queries: int = 0
    health_seen: OutboxHealth | None = None
    background: str = ""
    # EXPLAIN ANALYZE, EXPLAIN_REPS times: server execution (outbox_health(): its queries
    # summed), seconds, and the scans of the last run
    claim_server: list[float] = field(default_factory=list)
    health_server: list[float] = field(default_factory=list)
    claim_plan: str = ""
    health_plans: list[str] = field(default_factory=list)  # one per outbox_health() query


_SCAN = re.compile(
    r"^(?:->\s*)?(?P<node>[A-Za-z ]*Scan[^(]*?)\s+\(cost"
    r".*?rows=(?P<rows>\d+) loops=(?P<loops>\d+)\)"
)
_REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck): (?P<n>\d+)")
_EXECUTION = re.compile(r"Execution Time: (?P<ms>[\d.]+) ms")


def explain(sql: str) -> tuple[float, str]:
    """``EXPLAIN ANALYZE`` of ``sql`` in a transaction rolled back afterwards: the server's
    execution time in seconds, and each table or index scan with the rows it returned (and
    the rows its filter threw away)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        lines = [str(row[0]).strip() for row in cursor.fetchall()]
        transaction.set_rollback(True)
    scans: list[list[Any]] = []  # [node, rows, rows filtered out, loops]
    executed = 0.0
    for line in lines:
        if found := _SCAN.match(line):
            node = found["node"].replace("django_domain_events_", "")
            if " using " in node:
                node = re.sub(r" on \w+$", "", node)
            if not node.startswith("CTE Scan"):
                loops = int(found["loops"])
                scans.append([node, int(found["rows"]) * loops, 0, loops])
        elif (removed := _REMOVED.search(line)) and scans:
            scans[-1][2] = int(removed["n"]) * scans[-1][3]
        elif found := _EXECUTION.search(line):
            executed = float(found["ms"]) / 1000
    described = [
        f"{node} ({rows:,} rows" + (f", {dropped:,} filtered out)" if dropped else ")")
        for node, rows, dropped, _ in scans
    ]
    return executed, "; ".join(described)


def _explain_claim() -> tuple[float, str]:
    """``explain()`` of one claim of ``CLAIM_LIMIT`` fresh due rows (rolled back, then the
    rows settled)."""
    ids = measure.seed_pending(CLAIM_LIMIT, Relayed)
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        claim_batch(
            worker_id="bench-claim", now=timezone.now(), lease=CLAIM_LEASE_SECONDS, limit=50
        )
        transaction.set_rollback(True)
    (sql,) = [q["sql"] for q in captured.captured_queries if "SKIP LOCKED" in q["sql"]]
    plan = explain(sql)
    _settle_claimed(ids)
    return plan


def _settle_claimed(ids: list[int]) -> None:
    """What the relay would write after the receivers ran: the claimed rows succeeded."""
    DeliveryRecord.objects.filter(pk__in=ids).update(
        status=DeliveryStatus.SUCCEEDED,
        attempts=1,
        completed_at=timezone.now(),
        succeeded_at=timezone.now(),
        lease_expires_at=None,
    )


def _time_health(into: Probe, scheduled: int, timed: bool) -> None:
    started = time.perf_counter()
    health = outbox_health()
    elapsed = time.perf_counter() - started
    if (health.owed, health.scheduled, health.claimed) != (0, scheduled, 0):
        raise RuntimeError(
            f"{into.label}: outbox_health() saw {health.owed} owed, {health.scheduled} "
            f"scheduled, {health.claimed} claimed; expected 0, {scheduled}, 0"
        )
    if timed:
        into.health.append(elapsed)


def _time_claim(into: Probe, timed: bool) -> None:
    ids = measure.seed_pending(CLAIM_LIMIT, Relayed)
    started = time.perf_counter()
    claims = claim_batch(
        worker_id="bench-claim", now=timezone.now(), lease=CLAIM_LEASE_SECONDS, limit=CLAIM_LIMIT
    )
    elapsed = time.perf_counter() - started
    if sorted(c.id for c in claims) != sorted(ids):
        raise RuntimeError(f"{into.label}: claimed {len(claims)} rows, not the {len(ids)} due")
    _settle_claimed(ids)
    if timed:
        into.claim.append(elapsed)


# Each table state lives in a schema of its own, holding copies of the two tables
# (CREATE TABLE ... (LIKE ... INCLUDING ALL): columns, defaults, identity, constraints,
# every index); switching state is SET search_path. The library names its tables
# unqualified, so it runs unchanged against whichever state is current, and the two
# states are measured call by call in alternation, under the same background load.
STATE_SCHEMA_PREFIX = "dde_bench_state_"


def STATE_TABLES() -> tuple[str, ...]:  # noqa: N802 - read like the constant it stands for
    """The tables each state has its own copy of: events, deliveries, the scheduled tally."""
    return (measure.event_table(), measure.delivery_table(), str(ScheduledTally._meta.db_table))


def _use_state(name: str | None) -> None:
    """Resolve the tables in ``name``'s schema (lane pauses, marks: in public), or, with
    None, in public again."""
    path = "public" if name is None else f"{STATE_SCHEMA_PREFIX}{name}, public"
    with connection.cursor() as cursor:
        cursor.execute(f"SET search_path TO {path}")


def _name_indexes_as_in_public(cursor: Any, schema: str, table: str) -> None:
    """``LIKE`` names the copied indexes after their columns: give each the name of the
    index it copies (matched by definition), so that the plans printed name the library's
    indexes."""
    query = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s"

    def definitions(where: str) -> dict[str, str]:
        cursor.execute(query, [where, table])
        return {
            re.sub(r"INDEX \S+ ON \S+", "INDEX ON", definition): index
            for index, definition in cursor.fetchall()
        }

    original = definitions("public")
    quote = connection.ops.quote_name
    for definition, index in definitions(schema).items():
        wanted = original.get(definition)
        if wanted is not None and wanted != index:
            cursor.execute(f"ALTER INDEX {quote(schema)}.{quote(index)} RENAME TO {quote(wanted)}")


@contextlib.contextmanager
def table_states(names: list[str]) -> Iterator[None]:
    quote = connection.ops.quote_name
    tables = STATE_TABLES()
    with connection.cursor() as cursor:
        for name in names:
            schema = quote(f"{STATE_SCHEMA_PREFIX}{name}")
            cursor.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            cursor.execute(f"CREATE SCHEMA {schema}")
            for table in tables:
                cursor.execute(
                    f"CREATE TABLE {schema}.{quote(table)} "
                    f"(LIKE public.{quote(table)} INCLUDING ALL)"
                )
                _name_indexes_as_in_public(cursor, f"{STATE_SCHEMA_PREFIX}{name}", table)
    try:
        yield
    finally:
        _use_state(None)
        with connection.cursor() as cursor:
            for name in names:
                schema = quote(f"{STATE_SCHEMA_PREFIX}{name}")
                cursor.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        connection.close()  # a fresh session: the default search_path, nothing cached


@dataclass
class Comparison:
    """The empty table and the large one, measured call by call in alternation."""

    empty: Probe
    large: Probe
    seed_seconds: float
    unfolded: list[float]  # the large state's health before the relay folded the tally

    def ratio(self, what: str) -> float:
        return float(
            statistics.median(getattr(self.large, what))
            / statistics.median(getattr(self.empty, what))
        )


def compare_states(settled: int, scheduled: int, reps: int, label: str) -> Comparison:
    """``outbox_health()`` and ``claim_batch()`` with an empty table and with ``settled``
    succeeded + ``scheduled`` pending rows due in 30 days: ``reps`` timed calls of each in
    each state (after warm-up), alternating empty, large, large, empty, ...; then the query
    count and the plans in each state. Each claim takes 50 fresh due rows (seeded just
    before it, settled after it, untimed)."""
    empty, large = Probe("empty"), Probe(label)
    expected = {"empty": 0, label: scheduled}
    with table_states(["empty", label]):
        _use_state("empty")
        vacuum_settle()
        _use_state(label)
        seconds = seed_large(settled, scheduled)
        unfolded = time_unfolded(label, expected[label], reps)
        with measure.BackgroundLoad() as load:
            for index in range(WARMUP_REPS + reps):
                for probe in (empty, large) if index % 2 == 0 else (large, empty):
                    _use_state(probe.label)
                    _time_health(probe, expected[probe.label], index >= WARMUP_REPS)
            for index in range(WARMUP_REPS + reps):
                for probe in (empty, large) if index % 2 == 0 else (large, empty):
                    _use_state(probe.label)
                    _time_claim(probe, index >= WARMUP_REPS)
            health_sql: dict[str, list[str]] = {}
            for probe in (empty, large):
                _use_state(probe.label)
                with CaptureQueriesContext(connection) as captured:
                    probe.health_seen = outbox_health()
                probe.health_queries = len(captured.captured_queries)
                health_sql[probe.label] = [q["sql"] for q in captured.captured_queries]
            for index in range(EXPLAIN_REPS):
                for probe in (empty, large) if index % 2 == 0 else (large, empty):
                    _use_state(probe.label)
                    seconds_each, probe.claim_plan = _explain_claim()
                    probe.claim_server.append(seconds_each)
                    explained = [explain(sql) for sql in health_sql[probe.label]]
                    probe.health_server.append(sum(e[0] for e in explained))
                    probe.health_plans = [e[1] for e in explained]
        large.background = empty.background = load.summary()
    return Comparison(empty, large, seconds, unfolded)


# ---------------------------------------------------------------- 13. the admin dashboard

DASHBOARD_FRAGMENT = "django_domain_events/admin/dashboard_figures.html"


@dataclass
class DashboardProbe:
    """One table state: ``outbox_dashboard()`` alone, and with its figures rendered."""

    label: str
    data: list[float] = field(default_factory=list)
    rendered: list[float] = field(default_factory=list)
    queries: int = 0
    server: list[float] = field(default_factory=list)  # EXPLAIN ANALYZE, its queries summed
    plans: list[str] = field(default_factory=list)


def _time_dashboard(into: DashboardProbe, scheduled: int, timed: bool) -> None:
    from django.template.loader import render_to_string

    from django_domain_events.admin import dashboard_context
    from django_domain_events.dashboard import outbox_dashboard

    started = time.perf_counter()
    data = outbox_dashboard()
    fetched = time.perf_counter()
    html = render_to_string(DASHBOARD_FRAGMENT, dashboard_context(data, "admin"))
    done = time.perf_counter()
    bars = html.count('class="dde-bar"')
    if data.health.scheduled != scheduled or bars != 60 + 5 + 7:
        raise RuntimeError(
            f"{into.label}: the dashboard saw {data.health.scheduled} scheduled (expected "
            f"{scheduled}) and drew {bars} bars (expected 72)"
        )
    if timed:
        into.data.append(fetched - started)
        into.rendered.append(done - started)


def compare_dashboard(
    settled: int, scheduled: int, reps: int
) -> tuple[DashboardProbe, DashboardProbe, float]:
    """``outbox_dashboard()`` and its rendering with an empty table and with ``settled``
    succeeded + ``scheduled`` pending rows (section 6's large state, the tally folded):
    ``reps`` timed calls in each state, alternating; then the queries and their plans."""
    empty, large = DashboardProbe("empty"), DashboardProbe("history")
    expected = {"empty": 0, "history": scheduled}
    with table_states(["empty", "history"]):
        _use_state("empty")
        vacuum_settle()
        _use_state("history")
        seconds = seed_large(settled, scheduled)
        tally.compact()
        vacuum_settle()
        with measure.BackgroundLoad():
            for index in range(WARMUP_REPS + reps):
                for probe in (empty, large) if index % 2 == 0 else (large, empty):
                    _use_state(probe.label)
                    _time_dashboard(probe, expected[probe.label], index >= WARMUP_REPS)
            from django_domain_events.dashboard import outbox_dashboard

            for probe in (empty, large):
                _use_state(probe.label)
                with CaptureQueriesContext(connection) as captured:
                    outbox_dashboard()
                probe.queries = len(captured.captured_queries)
                statements = [q["sql"] for q in captured.captured_queries]
                for _ in range(EXPLAIN_REPS):
                    explained = [explain(sql) for sql in statements]
                    probe.server.append(sum(e[0] for e in explained))
                    probe.plans = [e[1] for e in explained]
    return empty, large, seconds
