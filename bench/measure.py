"""The measurements behind ``bench/run.py``. Imported only after ``django.setup()``.

Every timed loop runs against freshly truncated tables, after a ``CHECKPOINT``, with the
code path warmed up, and is checked afterwards (row counts, receiver calls): a figure from
a run that did not do the work is an error, not a number.
"""

from __future__ import annotations

import contextlib
import cProfile
import importlib
import inspect
import io
import os
import pstats
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, router, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg import sql

from bench.events import Tick
from django_domain_events import deliver_pending, fire, receiver
from django_domain_events.codec import get_codec
from django_domain_events.declare import registry
from django_domain_events.models import DeliveryRecord, DeliveryStatus, EventRecord

# The module fire() lives in (found from the function, so a renamed module is followed):
# the seeding builds its rows with fire()'s own row builders when they are there.
fire_module = importlib.import_module(fire.__module__)
fanout_module = importlib.import_module("django_domain_events.fanout")

REPO_ROOT = Path(__file__).resolve().parent.parent
BATCH_SIZE = 50
RAW_WORKER = "raw-psycopg"
RAW_LEASE_SECONDS = 330  # what the library stamps by default: LEASE_SECONDS x 1.1
NOOP_KEY = "bench.noop"
WARMUP_ROWS = 200
APPLICATION_NAME = "dde-bench"  # every connection of ours, so the load sampler skips them


# ---------------------------------------------------------------- helpers


def event_table() -> str:
    return str(EventRecord._meta.db_table)


def delivery_table() -> str:
    return str(DeliveryRecord._meta.db_table)


def reset_tables() -> None:
    """Empty both tables (the schema itself is rebuilt by ``migrate`` once per run)."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"TRUNCATE {quote(delivery_table())}, {quote(event_table())} RESTART IDENTITY CASCADE"
        )


def settle_database() -> None:
    """Fresh statistics and no dirty pages left from the previous phase."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {quote(event_table())}")
        cursor.execute(f"ANALYZE {quote(delivery_table())}")
        cursor.execute("CHECKPOINT")


@contextlib.contextmanager
def declared(
    receivers: dict[str, dict[str, Any]],
    calls: list[int] | None = None,
    marks: list[tuple[str, float]] | None = None,
) -> Iterator[None]:
    """Declare durable receivers of ``Tick`` (key -> ``@receiver`` options), then forget them.

    Each counts its calls in ``calls[0]`` and, given ``marks``, timestamps each call there.
    """
    for key, options in receivers.items():

        def noop(evt: Tick) -> None:
            if calls is not None:
                calls[0] += 1
            if marks is not None:
                marks.append(("receiver", time.perf_counter()))

        noop.__name__ = noop.__qualname__ = key.replace(".", "_")
        receiver(Tick, key=key, **options)(noop)
    try:
        yield
    finally:
        for key in receivers:
            registry.forget(key)


def owed_count() -> int:
    return DeliveryRecord.objects.exclude(status=DeliveryStatus.SUCCEEDED).count()


def cpu_counters() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = values[7] if len(values) > 7 else 0
    return steal, sum(values[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """The share of CPU time the hypervisor took from this VM in between, as text."""
    if before is None or after is None or after[1] == before[1]:
        return "steal n/a"
    return f"CPU steal {(after[0] - before[0]) / (after[1] - before[1]):.0%}"


class BackgroundLoad:
    """Samples, twice a second on its own connection, the other sessions busy on the server.

    Work from elsewhere (a test suite on the same PostgreSQL) shares the disk's fsyncs and
    the two cores, and skews every figure here; the summary says how much there was.
    """

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.load_average = 0.0
        self.steal = ""

    def __enter__(self) -> BackgroundLoad:
        self._cpu = cpu_counters()
        self._conn = raw_connection(autocommit=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._conn.close()
        self.load_average = os.getloadavg()[0]
        self.steal = steal_share(self._cpu, cpu_counters())

    def _run(self) -> None:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND state NOT IN ('idle') AND application_name <> %s"
        )
        while not self._stop.wait(0.5):
            with contextlib.suppress(psycopg.Error):
                row = self._conn.execute(query, [APPLICATION_NAME]).fetchone()
                self.samples.append(int(row[0]) if row else 0)

    def summary(self) -> str:
        busy = sum(1 for n in self.samples if n) / len(self.samples) if self.samples else 0.0
        peak = max(self.samples, default=0)
        return (
            f"other busy PG sessions in {busy:.0%} of samples (max {peak}), "
            f"1-min load {self.load_average:.2f}, {self.steal}"
        )


# ---------------------------------------------------------------- 1. fire rate


@dataclass
class FireResult:
    case: str
    events: int
    rows: int
    seconds: float
    background: str = ""

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds


FIRE_CASES: dict[str, tuple[str, dict[str, dict[str, Any]], int]] = {
    # case -> (description, receivers, delivery rows per event)
    "a": ("1 durable receiver", {"bench.fire_a": {}}, 1),
    "b": ("5 durable receivers", {f"bench.fire_b{i}": {} for i in range(1, 6)}, 5),
    "c": (
        "1 receiver, 50-target fan-out",
        {"bench.fire_c": {"targets": lambda evt, ctx: [str(i) for i in range(50)]}},
        50,
    ),
}


def fire_rate(case: str, events: int) -> FireResult:
    """``events`` fires, each in its own ``transaction.atomic()``."""
    description, receivers, per_event = FIRE_CASES[case]
    with declared(receivers):
        reset_tables()
        for n in range(min(50, events)):  # warm-up: imports, codec compilation, connection
            with transaction.atomic():
                fire(Tick(n=n))
        reset_tables()
        settle_database()
        with BackgroundLoad() as load:
            started = time.perf_counter()
            for n in range(events):
                with transaction.atomic():
                    fire(Tick(n=n))
            elapsed = time.perf_counter() - started
    written = DeliveryRecord.objects.count()
    if EventRecord.objects.count() != events or written != events * per_event:
        raise RuntimeError(
            f"fire case {case}: expected {events} events and {events * per_event} rows, "
            f"found {EventRecord.objects.count()} and {written}"
        )
    return FireResult(f"({case}) {description}", events, written, elapsed, load.summary())


# ---------------------------------------------------------------- seeding owed rows


def _call_builder(name: str, **known: Any) -> Any:
    """Call fire()'s private row builder ``name``, matching its parameters by name.

    None when it is gone or needs a parameter not in ``known``: the library is young and
    its private helpers move; the caller then builds the row by hand.
    """
    build = getattr(fire_module, name, None) or getattr(fanout_module, name, None)
    if build is None:
        return None
    args = []
    for parameter in inspect.signature(build).parameters.values():
        if parameter.name in known:
            args.append(known[parameter.name])
        elif parameter.default is inspect.Parameter.empty:
            return None
    return build(*args)


def _seed_event(n: int, now: datetime, cls: type = Tick) -> EventRecord:
    """The event row ``fire(cls(n=n))`` writes at ``now``, built by fire()'s own code."""
    registered = registry.event_for_class(cls)
    if registered is None:
        raise RuntimeError(f"{cls.__name__} is not registered: is the bench app installed?")
    built = _call_builder(
        "_event_row",
        registered=registered,
        evt=cls(n=n),
        occurred_at=now,
        recorded_at=now,
        dedupe_key=None,
        suppression=None,
        alias=router.db_for_write(EventRecord),
    )
    if built is not None:
        return built
    # fire()'s builder is gone or asks for something unknown here: the same row by hand,
    # checked against a real fire() by check_seed_matches_fire() before anything is timed.
    return EventRecord(
        name=registered.name,
        version=registered.version,
        payload=get_codec().encode(cls(n=n)),
        occurred_at=now,
        recorded_at=now,
        correlation_id=uuid.uuid4().hex,
    )


def _seed_deliveries(record: EventRecord, cls: type = Tick) -> list[DeliveryRecord]:
    """The delivery rows ``fire()`` writes for ``record``, built by fire()'s own code."""
    evt = cls(n=record.payload["n"])
    receivers = [r for r in registry.receivers_for(cls) if r.durable]
    built = _call_builder(
        "delivery_rows",
        record=record,
        evt=evt,
        receivers=receivers,
        alias=router.db_for_write(DeliveryRecord),
    )
    if built is not None:
        # fire() builds plain tuples of values; its ORM path turns them into model rows.
        as_model = getattr(fanout_module, "delivery_record", None)
        return [
            row if isinstance(row, DeliveryRecord) or as_model is None else as_model(record.pk, row)
            for row in built
        ]
    return [
        DeliveryRecord(
            event_id=record.pk,
            receiver_key=r.key,
            target="",
            status=DeliveryStatus.PENDING,
            max_attempts=r.max_attempts,
            available_at=record.recorded_at,
            due_at=record.recorded_at,
            expires_at=None,
        )
        for r in receivers
        if r.durable
    ]


def seed_pending(count: int, cls: type = Tick) -> list[int]:
    """``count`` events of ``cls`` owing one pending row each (to its one declared no-op
    receiver), bulk-inserted: the rows ``fire()`` would write, without ``count``
    transactions. Returns the delivery rows' ids."""
    now = timezone.now()
    with transaction.atomic():
        events = EventRecord.objects.bulk_create(
            [_seed_event(n, now, cls) for n in range(count)], batch_size=2000
        )
        rows = [row for record in events for row in _seed_deliveries(record, cls)]
        if len(rows) != count:
            raise RuntimeError(f"seeding: {len(rows)} delivery rows for {count} events")
        created = DeliveryRecord.objects.bulk_create(rows, batch_size=2000)
    return [row.pk for row in created]


_VOLATILE = {"id", "event_id", "correlation_id"}
_SAME_MOMENT = {"occurred_at", "recorded_at", "available_at", "due_at"}


def _fields(obj: Any) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in type(obj)._meta.concrete_fields
        if not f.generated  # error_type: the database's, not written by fire()
    }


def check_seed_matches_fire() -> None:
    """Fail loudly if the bulk-inserted rows stop looking like what ``fire()`` writes."""
    reset_tables()
    with declared({NOOP_KEY: {}}), transaction.atomic():
        event_id = fire(Tick(n=7))
        real_event = EventRecord.objects.get(pk=event_id)
        real_row = DeliveryRecord.objects.get(event_id=event_id)
        moment = real_event.recorded_at
        seeded_event = _seed_event(7, moment)
        seeded_event.pk = event_id
        pairs = [(real_event, seeded_event), (real_row, _seed_deliveries(seeded_event)[0])]
    mismatches = []
    for real, seeded in pairs:
        want, got = _fields(real), _fields(seeded)
        for name in want:
            if name in _VOLATILE:
                continue
            if name in _SAME_MOMENT:
                if want[name] != moment:
                    mismatches.append(f"{name}: fire() wrote {want[name]}, not recorded_at")
                continue
            if want[name] != got[name]:
                mismatches.append(f"{name}: fire() wrote {want[name]!r}, seed {got[name]!r}")
    reset_tables()
    if mismatches:
        raise RuntimeError("seeded rows differ from fire()'s: " + "; ".join(mismatches))


# ---------------------------------------------------------------- 2. deliver_pending


@dataclass
class DrainResult:
    label: str
    deliveries: int
    seconds: float
    background: str = ""

    @property
    def per_second(self) -> float:
        return self.deliveries / self.seconds

    @property
    def ms_each(self) -> float:
        return self.seconds * 1000 / self.deliveries


def _drain_ours(count: int, calls: list[int]) -> float:
    started = time.perf_counter()
    counts = deliver_pending(batch_size=BATCH_SIZE)
    elapsed = time.perf_counter() - started
    succeeded = counts[DeliveryStatus.SUCCEEDED]
    if succeeded != count or calls[0] != count or owed_count():
        raise RuntimeError(
            f"deliver_pending: {succeeded} succeeded, {calls[0]} receiver calls, "
            f"{owed_count()} rows left; expected {count}, {count}, 0. Counts: {counts}"
        )
    return elapsed


def delivery_rate(count: int) -> DrainResult:
    """Drain ``count`` pending no-op rows with ``deliver_pending(batch_size=50)``."""
    calls = [0]
    with declared({NOOP_KEY: {}}, calls):
        reset_tables()
        seed_pending(min(WARMUP_ROWS, count))
        _drain_ours(min(WARMUP_ROWS, count), calls)
        calls[0] = 0
        reset_tables()
        seed_pending(count)
        settle_database()
        with BackgroundLoad() as load:
            elapsed = _drain_ours(count, calls)
    return DrainResult("deliver_pending()", count, elapsed, load.summary())


# ---------------------------------------------------------------- 3. raw psycopg


def raw_connection(*, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection of its own, not Django's, with psycopg's defaults."""
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
        autocommit=autocommit,
        application_name=APPLICATION_NAME,
    )


def raw_statements() -> tuple[sql.Composed, sql.Composed]:
    table = sql.Identifier(delivery_table())
    claim = sql.SQL(
        "UPDATE {t} SET status = 'claimed', claimed_by = %(worker)s, claimed_at = now(), "
        "lease_expires_at = now() + %(lease)s * interval '1 second', "
        "available_at = now() + %(lease)s * interval '1 second' "
        "WHERE id IN (SELECT id FROM {t} WHERE status IN ('pending', 'failed', 'claimed') "
        "AND available_at <= now() ORDER BY available_at, id LIMIT %(limit)s "
        "FOR UPDATE SKIP LOCKED) RETURNING id, event_id"
    ).format(t=table)
    ack = sql.SQL(
        "UPDATE {t} SET status = 'succeeded', attempts = attempts + 1, completed_at = now(), "
        "succeeded_at = now() WHERE id = %s AND claimed_by = %s"
    ).format(t=table)
    return claim, ack


@dataclass
class Timings:
    """Seconds spent waiting on the database (statements and commits) and their counts,
    and a timestamped trail of every call (``claim+``/``claim-``, ``ack+``/``ack-``,
    ``commit+``/``commit-``, ``receiver``) from which the per-delivery segments are cut."""

    statements: int = 0
    commits: int = 0
    statement_seconds: float = 0.0
    commit_seconds: float = 0.0
    marks: list[tuple[str, float]] = field(default_factory=list)

    def segments(self) -> dict[str, list[float]]:
        """Durations between consecutive marks, by ``"from -> to"``."""
        found: dict[str, list[float]] = {}
        for (a, ta), (b, tb) in zip(self.marks, self.marks[1:], strict=False):
            if a != "round" and b != "round":
                found.setdefault(f"{a} -> {b}", []).append(tb - ta)
        return found


def raw_drain(conn: psycopg.Connection[Any], timings: Timings | None = None) -> int:
    """The reference loop; returns how many rows it acknowledged."""
    claim, ack = raw_statements()
    params = {"worker": RAW_WORKER, "lease": RAW_LEASE_SECONDS, "limit": BATCH_SIZE}
    done = 0
    clock = time.perf_counter
    while True:
        t0 = clock()
        rows = conn.execute(claim, params).fetchall()
        t1 = clock()
        conn.commit()
        t2 = clock()
        if timings is not None:
            _record(timings, "claim", t0, t1, t2)
        if not rows:
            return done
        for delivery_id, _event_id in rows:
            t0 = clock()
            conn.execute(ack, (delivery_id, RAW_WORKER))
            t1 = clock()
            conn.commit()
            t2 = clock()
            if timings is not None:
                _record(timings, "ack", t0, t1, t2)
            done += 1


def _record(timings: Timings, kind: str, t0: float, t1: float, t2: float) -> None:
    timings.statements += 1
    timings.commits += 1
    timings.statement_seconds += t1 - t0
    timings.commit_seconds += t2 - t1
    timings.marks += [(f"{kind}+", t0), (f"{kind}-", t1), ("commit+", t1), ("commit-", t2)]


def raw_rate(count: int) -> DrainResult:
    """The same rows drained by the minimal claim/acknowledge loop in raw psycopg 3."""
    with raw_connection() as conn, declared({NOOP_KEY: {}}):
        reset_tables()
        seed_pending(min(WARMUP_ROWS, count))
        raw_drain(conn)
        reset_tables()
        seed_pending(count)
        settle_database()
        with BackgroundLoad() as load:
            started = time.perf_counter()
            done = raw_drain(conn)
            elapsed = time.perf_counter() - started
    if done != count or owed_count():
        raise RuntimeError(f"raw drain: {done} acknowledged, {owed_count()} left of {count}")
    return DrainResult("raw psycopg 3", count, elapsed, load.summary())


# ---------------------------------------------------------------- diagnostics


@dataclass
class Breakdown:
    label: str
    deliveries: int
    seconds: float
    timings: Timings
    cpu_seconds: float = 0.0  # this process's CPU time: Python, psycopg, system calls

    @property
    def per_second(self) -> float:
        return self.deliveries / self.seconds

    def per_delivery_us(self, seconds: float) -> float:
        return seconds * 1e6 / self.deliveries

    @property
    def database_seconds(self) -> float:
        return self.timings.statement_seconds + self.timings.commit_seconds

    @property
    def outside_seconds(self) -> float:
        """Wall time outside timed statements and commits: Python (the library, Django's
        atomic() and cursor wrappers, psycopg outside execute/commit)."""
        return self.seconds - self.database_seconds


@contextlib.contextmanager
def timed_django_calls(timings: Timings) -> Iterator[None]:
    """Count and time every statement and commit on Django's connection."""
    clock = time.perf_counter

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        text = sql.lstrip()[:6].upper()
        kind = "claim" if text.startswith("WITH") else "ack" if text == "UPDATE" else "other"
        t0 = clock()
        try:
            return execute(sql, params, many, ctx)
        finally:
            t1 = clock()
            timings.statements += 1
            timings.statement_seconds += t1 - t0
            timings.marks += [(f"{kind}+", t0), (f"{kind}-", t1)]

    original_commit = connection.commit

    def commit() -> None:
        t0 = clock()
        try:
            original_commit()
        finally:
            t1 = clock()
            timings.commits += 1
            timings.commit_seconds += t1 - t0
            timings.marks += [("commit+", t0), ("commit-", t1)]

    connection.commit = commit
    try:
        with connection.execute_wrapper(wrapper):
            yield
    finally:
        del connection.commit


def query_shapes(count: int) -> list[str]:
    """The SQL ``deliver_pending`` sends for ``count`` rows, grouped by shape (untimed)."""
    calls = [0]
    with declared({NOOP_KEY: {}}, calls):
        reset_tables()
        seed_pending(count)
        with CaptureQueriesContext(connection) as captured:
            deliver_pending(batch_size=BATCH_SIZE)
    if calls[0] != count or owed_count():
        raise RuntimeError(f"query-shape drain delivered {calls[0]} of {count}")
    shapes: dict[str, int] = {}
    for query in captured.captured_queries:
        text = " ".join(query["sql"].split())
        shape = text[:90] + ("..." if len(text) > 90 else "")
        if text in ("BEGIN", "COMMIT"):
            shape = f"{text} (logged by Django's atomic(), not a statement: see commits)"
        elif text.startswith("WITH picked"):
            shape = "WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED) UPDATE ... (claim)"
        elif text.startswith("UPDATE") and "'succeeded'" in text:
            shape = text.split(" WHERE")[0][:70] + "... (ack)"
        shapes[shape] = shapes.get(shape, 0) + 1
    return [f"{n / count:6.3f}/delivery  {shape}" for shape, n in shapes.items()]


def _round_ours(count: int, into: Breakdown) -> None:
    calls = [0]
    with declared({NOOP_KEY: {}}, calls, into.timings.marks):
        reset_tables()
        seed_pending(count)
        settle_database()
        into.timings.marks.append(("round", time.perf_counter()))
        with timed_django_calls(into.timings):
            started, cpu = time.perf_counter(), time.process_time()
            deliver_pending(batch_size=BATCH_SIZE)
            into.seconds += time.perf_counter() - started
            into.cpu_seconds += time.process_time() - cpu
    if calls[0] != count or owed_count():
        raise RuntimeError(f"paired drain (ours) delivered {calls[0]} of {count}")
    into.deliveries += count


def _round_raw(count: int, into: Breakdown) -> None:
    with raw_connection() as conn, declared({NOOP_KEY: {}}):
        reset_tables()
        seed_pending(count)
        settle_database()
        into.timings.marks.append(("round", time.perf_counter()))
        started, cpu = time.perf_counter(), time.process_time()
        done = raw_drain(conn, into.timings)
        into.seconds += time.perf_counter() - started
        into.cpu_seconds += time.process_time() - cpu
    if done != count or owed_count():
        raise RuntimeError(f"paired drain (raw) acknowledged {done} of {count}")
    into.deliveries += count


SEGMENT_LABELS = {
    "commit- -> receiver": "previous COMMIT -> receiver called (atomic() exit/enter, "
    "run_batch, attempt() up to the call)",
    "receiver -> ack+": "receiver returned -> ack UPDATE sent (_update_claimed, cursor)",
    "ack+ -> ack-": "ack UPDATE (psycopg sends BEGIN first: two round trips)",
    "ack- -> commit+": "ack done -> COMMIT sent (cursor close, atomic() exit)",
    "commit+ -> commit-": "COMMIT (round trip + WAL flush)",
    "claim+ -> claim-": "claim statement (per batch of 50)",
    "claim- -> receiver": "claim returned -> first receiver call (Claim objects, prelude)",
    "claim- -> commit+": "claim returned -> its COMMIT",
    "commit- -> claim+": "last COMMIT of a batch -> next claim",
    "commit- -> ack+": "previous COMMIT -> ack UPDATE sent",
}


def segment_lines(item: Breakdown) -> list[str]:
    """Where each delivery's wall time goes, segment by segment, heaviest first."""
    lines = []
    found = item.timings.segments()
    for key, values in sorted(found.items(), key=lambda kv: -sum(kv[1])):
        per_delivery = item.per_delivery_us(sum(values))
        if per_delivery < 0.5:
            continue
        median = sorted(values)[len(values) // 2] * 1e6
        label = SEGMENT_LABELS.get(key, key)
        lines.append(
            f"{per_delivery:7.0f} us/delivery  (median {median:6.0f} us x {len(values):>5})  "
            f"{label}"
        )
    return lines


def paired_breakdown(count: int, rounds: int = 8) -> tuple[Breakdown, Breakdown]:
    """Both drains in alternating rounds (ours, raw, raw, ours, ...), ``count`` rows each in
    all, every statement and commit timed: database waits versus Python, under the same
    background load for both sides."""
    ours = Breakdown("deliver_pending()", 0, 0.0, Timings())
    raw = Breakdown("raw psycopg 3", 0, 0.0, Timings())
    per_round = max(1, count // rounds)
    for index in range(rounds):
        steps = [(_round_ours, ours), (_round_raw, raw)]
        for step, into in steps if index % 2 == 0 else steps[::-1]:
            step(per_round, into)
    return ours, raw


def profile_ours(count: int, top: int = 30) -> str:
    """cProfile of a ``count``-row drain: the top entries by cumulative time, per delivery."""
    calls = [0]
    with declared({NOOP_KEY: {}}, calls):
        reset_tables()
        seed_pending(count)
        settle_database()
        profiler = cProfile.Profile()
        profiler.enable()
        deliver_pending(batch_size=BATCH_SIZE)
        profiler.disable()
    if calls[0] != count:
        raise RuntimeError(f"profiled drain delivered {calls[0]} of {count}")
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        where = _short_path(filename)
        rows.append((cumtime, tottime, ncalls, f"{where}:{line}({name})"))
    total = max(r[0] for r in rows)
    out = [
        f"profiled drain of {count} rows: {total:.3f}s under cProfile "
        f"({total * 1e6 / count:.0f} us/delivery; profiling inflates Python time)",
        f"{'cum us/dlv':>10} {'own us/dlv':>10} {'calls/dlv':>9}  function",
    ]
    for cumtime, tottime, ncalls, label in sorted(rows, reverse=True)[:top]:
        out.append(
            f"{cumtime * 1e6 / count:10.1f} {tottime * 1e6 / count:10.1f} "
            f"{ncalls / count:9.2f}  {label}"
        )
    out.append("top by own time:")
    for cumtime, tottime, ncalls, label in sorted(rows, key=lambda r: r[1], reverse=True)[:15]:
        out.append(
            f"{cumtime * 1e6 / count:10.1f} {tottime * 1e6 / count:10.1f} "
            f"{ncalls / count:9.2f}  {label}"
        )
    return "\n".join(out)


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", f"{REPO_ROOT}/", "lib/python"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


# ---------------------------------------------------------------- 10. group acknowledgement


def raw_group_drain(conn: psycopg.Connection[Any]) -> int:
    """The group-commit reference: claim 50, acknowledge them in one UPDATE, one COMMIT."""
    claim, _ = raw_statements()
    ack = sql.SQL(
        "UPDATE {t} SET status = 'succeeded', attempts = attempts + 1, completed_at = now(), "
        "succeeded_at = now() WHERE id = ANY(%s) AND claimed_by = %s"
    ).format(t=sql.Identifier(delivery_table()))
    params = {"worker": RAW_WORKER, "lease": RAW_LEASE_SECONDS, "limit": BATCH_SIZE}
    done = 0
    while True:
        rows = conn.execute(claim, params).fetchall()
        conn.commit()
        if not rows:
            return done
        conn.execute(ack, ([delivery_id for delivery_id, _ in rows], RAW_WORKER))
        conn.commit()
        done += len(rows)


def group_rates(count: int, rounds: int) -> tuple[float, float]:
    """Deliveries/s of ``deliver_pending`` over ``ack="batch"`` no-op rows and of the raw
    group-commit loop, ``count`` rows each, in alternating rounds; medians of the rounds."""
    ours: list[float] = []
    raw: list[float] = []
    calls = [0]
    with raw_connection() as conn, declared({NOOP_KEY: {"ack": "batch"}}, calls):
        for index in range(rounds):
            for name in ("ours", "raw") if index % 2 == 0 else ("raw", "ours"):
                reset_tables()
                seed_pending(count)
                settle_database()
                calls[0] = 0
                started = time.perf_counter()
                if name == "ours":
                    _drain_ours(count, calls)
                    ours.append(count / (time.perf_counter() - started))
                else:
                    if raw_group_drain(conn) != count:
                        raise RuntimeError("raw group drain did not acknowledge every row")
                    raw.append(count / (time.perf_counter() - started))
    reset_tables()
    return statistics.median(ours), statistics.median(raw)


# ---------------------------------------------------------------- 11. fire() overhead

FAN_OUT = 50
FIRE_OVERHEAD_CASES: dict[str, dict[str, dict[str, Any]]] = {
    # case -> the receivers of Tick declared for its rounds
    "one": {"bench.over_one": {}},
    "fan": {"bench.over_fan": {"targets": lambda evt, ctx: [str(i) for i in range(FAN_OUT)]}},
}


@dataclass
class OverheadResult:
    """Seconds per call, one figure per round, for the baseline and each fire() case."""

    calls: int
    per_round: dict[str, list[float]] = field(default_factory=dict)
    background: str = ""

    def median(self, case: str) -> float:
        values = sorted(self.per_round[case])
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def over_baseline(self, case: str) -> float:
        """Median seconds per call of ``case`` minus the baseline's."""
        return self.median(case) - self.median("baseline")

    def paired(self, case: str) -> float:
        """Median over rounds of (case - baseline): a cross-check less moved by drift."""
        diffs = sorted(
            a - b for a, b in zip(self.per_round[case], self.per_round["baseline"], strict=True)
        )
        middle = len(diffs) // 2
        return diffs[middle] if len(diffs) % 2 else (diffs[middle - 1] + diffs[middle]) / 2


def _baseline_round(calls: int) -> float:
    """``calls`` transactions each holding one plain ORM insert of an event-like row."""
    started = time.perf_counter()
    for n in range(calls):
        with transaction.atomic():
            now = timezone.now()
            EventRecord.objects.create(
                name="bench.Tick",
                payload={"n": n},
                occurred_at=now,
                recorded_at=now,
                correlation_id=uuid.uuid4().hex,
            )
    elapsed = time.perf_counter() - started
    if EventRecord.objects.count() != calls or DeliveryRecord.objects.exists():
        raise RuntimeError("fire overhead baseline: the round did not write its rows")
    return elapsed / calls


def _fire_round(case: str, calls: int) -> float:
    """``calls`` fires, each in its own transaction, with the case's receivers declared."""
    per_event = FAN_OUT if case == "fan" else 1
    with declared(FIRE_OVERHEAD_CASES[case]):
        with transaction.atomic():  # the first fire after declaring builds the class's cache
            fire(Tick(n=-1))
        reset_tables()
        started = time.perf_counter()
        for n in range(calls):
            with transaction.atomic():
                fire(Tick(n=n))
        elapsed = time.perf_counter() - started
    written = DeliveryRecord.objects.count()
    if EventRecord.objects.count() != calls or written != calls * per_event:
        raise RuntimeError(
            f"fire overhead ({case}): {EventRecord.objects.count()} events and {written} rows "
            f"written; expected {calls} and {calls * per_event}"
        )
    return elapsed / calls


def fire_overhead(rounds: int, calls: int) -> OverheadResult:
    """Baseline and fire() rounds in alternation (base, one, fan, then fan, one, base,
    ...), each from empty tables, so that all three see the same background load."""
    result = OverheadResult(calls, {"baseline": [], "one": [], "fan": []})
    steps: list[tuple[str, Callable[[], float]]] = [
        ("baseline", lambda: _baseline_round(calls)),
        ("one", lambda: _fire_round("one", calls)),
        ("fan", lambda: _fire_round("fan", calls)),
    ]
    for _, step in steps:  # warm-up: imports, codec compilation, connection, caches
        reset_tables()
        step()
    with BackgroundLoad() as load:
        for index in range(rounds):
            for case, step in steps if index % 2 == 0 else steps[::-1]:
                reset_tables()
                settle_database()
                result.per_round[case].append(step())
    reset_tables()
    result.background = load.summary()
    return result


def profile_fire(case: str, calls: int, top: int = 25) -> str:
    """cProfile of ``calls`` fires of ``case``: the top entries by own time, per call."""
    with declared(FIRE_OVERHEAD_CASES[case]):
        reset_tables()
        with transaction.atomic():
            fire(Tick(n=-1))
        profiler = cProfile.Profile()
        profiler.enable()
        for n in range(calls):
            with transaction.atomic():
                fire(Tick(n=n))
        profiler.disable()
    reset_tables()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        rows.append((tottime, cumtime, ncalls, f"{_short_path(filename)}:{line}({name})"))
    out = [f"{'own us/call':>11} {'cum us/call':>11} {'calls/call':>10}  function ({case})"]
    for tottime, cumtime, ncalls, label in sorted(rows, reverse=True)[:top]:
        out.append(
            f"{tottime * 1e6 / calls:11.1f} {cumtime * 1e6 / calls:11.1f} "
            f"{ncalls / calls:10.2f}  {label}"
        )
    return "\n".join(out)
