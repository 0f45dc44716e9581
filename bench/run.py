"""Benchmark of django-domain-events on PostgreSQL: ``make bench`` (see bench/README.md).

    .venv/bin/python bench/run.py            full run (about four minutes)
    .venv/bin/python bench/run.py --quick    a tenth of the sizes: a smoke run
    .venv/bin/python bench/run.py --profile  also cProfile a 2,000-row drain
    .venv/bin/python bench/run.py --only fire|delivery|breakdown|relay|claim|scheduled
    .venv/bin/python bench/run.py --only memory|concurrency|group|fire_overhead [--profile]
    .venv/bin/python bench/run.py --only dashboard|priority|limits

Targets are reported (PASS/MISS), not asserted: the exit status is 0 unless something
failed (no database, a drain that did not deliver every row, ...).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

TARGET_RATIO = 0.5  # deliver_pending() deliveries/s over raw psycopg deliveries/s
TARGET_LATENCY_MS = 100.0  # a LISTENing relay: median fire -> succeeded_at
TARGET_RELAY_RATIO = 0.5  # one deliver_events process over raw psycopg, deliveries/s
TARGET_SCALING = 1.5  # two deliver_events processes over one, deliveries/s
TARGET_CLAIM_RATIO = 1.1  # claim_batch() latency, large table over empty
TARGET_HEALTH_RATIO = 2.0  # outbox_health() latency, large table over empty
TARGET_PEAK_MIB = 300.0  # a --once relay over section 8's large payloads, peak RSS
TARGET_CONCURRENCY_16 = 12.0  # 50 ms receivers: --concurrency 16 over --concurrency 1
TARGET_CONCURRENCY_2X16 = 20.0  # two relays with --concurrency 16 over one with 1
TARGET_GROUP_RATE = 5_000.0  # ack="batch" no-op deliveries/s
TARGET_GROUP_RATIO = 0.25  # ... over the raw group-commit loop
TARGET_FIRE_OVERHEAD_MS = 0.5  # fire() with one receiver, over one plain ORM insert
TARGET_FAN_OUT_ROW_US = 50.0  # a 50-target fire() over the baseline, per delivery row
TARGET_DASHBOARD_MS = 300.0  # the admin dashboard's figures, read and rendered, large table
TARGET_PUBLISH_RATE = 3_000.0  # events/s published by one relay to RabbitMQ and to NATS
TARGET_PUBLISH_RATIO = 0.5  # ... over the raw client loop, every broker
TARGET_UNMETERED_RATIO = 0.9  # an unlimited receiver beside a 50/s one, over it alone
TARGET_RATE_SPREAD = 5.0  # a 50/s limit: every 10 s window within 50 +- this
BROKER_BATCH = 500  # section 14: rows per claimed batch, and messages per raw batch

FULL_SIZES = {
    "priority_seconds": 30,  # section 15: how long the saturating stream runs
    "ordering_rows": 10_000,  # section 16: no-op rows, ordered and unordered, two rounds
    "ordering_slow_rows": 800,  # ... rows of the 50 ms receiver, --concurrency 16
    "ordering_hot_rows": 60,  # ... rows of one hot key (3 s at 50 ms each)
    # 11,000 events in all: at ~3-6 ms a commit on this machine, 20,000 would not fit the
    # three-minute budget next to the two 20,000-row drains.
    "fire_a": 5_000,
    "fire_b": 5_000,
    "fire_c": 1_000,  # 50 rows each: 50,000 rows
    "deliver": 20_000,
    "raw": 20_000,
    "breakdown": 2_000,
    "profile": 2_000,
    "relay_latency": 50,  # events fired one at a time, one per NOTIFY window (~0.6 s each)
    "relay_unpaced": 10,  # then fired back to back, each once the previous is delivered
    "relay_rows": 20_000,  # drained by raw psycopg, one and two deliver_events processes
    "relay_rounds": 4,  # ... in this many alternating rounds (5,000 rows each)
    "claim_settled": 200_000,  # section 6: settled history ...
    "claim_scheduled": 50_000,  # ... and scheduled rows, due in 30 days
    "scheduled": 100_000,  # section 7: scheduled rows only
    "reps": 30,  # timed claim_batch() / outbox_health() calls per table state
    "bulky_events": 40,  # section 8: events of ...
    "bulky_mib": 10,  # ... this many MiB of payload each
    "slow_rows": 100,  # section 9: rows of a 50 ms receiver for --concurrency 1 ...
    "slow_rows_wide": 1_600,  # ... and for the concurrent relays
    "group_rows": 5_000,  # section 10: rows per round, ack="batch" and the raw loop
    "group_rounds": 6,
    "overhead_rounds": 10,  # section 11: alternating rounds of baseline, 1 receiver, fan-out
    "overhead_calls": 200,  # ... of this many transactions each
    "broker_events": 10_000,  # section 14: events published to each broker
    "limits_unmetered": 30_000,  # section 17: rows of the unlimited receiver per round ...
    "limits_metered": 2_000,  # ... and of the 50/s one, fired ahead of them
    "limits_rounds": 3,  # ... in this many rounds of each case, every other one reversed
}
# --quick divides every size by ten, but never below these.
QUICK_FLOOR = {
    "priority_seconds": 10,
    "ordering_slow_rows": 160,
    "ordering_hot_rows": 20,
    "relay_unpaced": 4,
    "relay_rounds": 2,
    "reps": 10,
    "bulky_mib": 10,
    "slow_rows": 40,
    "slow_rows_wide": 320,
    "group_rounds": 2,
    "overhead_rounds": 4,
    "overhead_calls": 50,
    "broker_events": 2_000,
    "limits_unmetered": 1_000,
    "limits_metered": 600,
    "limits_rounds": 1,
}


def _admin_connection() -> Any:
    import psycopg

    from bench import settings

    db: dict[str, Any] = settings.DATABASES["default"]
    conn = psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )
    return conn, db["NAME"]


def ensure_database(*, recreate: bool = False) -> None:
    """Create the benchmark database when it is missing (its tables come from migrate)."""
    from psycopg import sql

    conn, name = _admin_connection()
    with conn:
        if recreate:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def rebuild_schema() -> None:
    """Drop the package's tables and build them again from its migrations.

    When the tables left by an earlier run no longer match the migrations (a migration
    edited in place while the package is young), unapplying fails; the benchmark's own
    database is then dropped and created afresh instead.
    """
    from django.core.management import call_command
    from django.db import DatabaseError, connections

    try:
        call_command("migrate", "django_domain_events", "zero", verbosity=0, interactive=False)
    except DatabaseError as error:
        first_line = str(error).splitlines()[0]
        print(f"(migrate zero failed: {first_line}; recreating the bench database)")
        connections.close_all()
        ensure_database(recreate=True)
    call_command("migrate", verbosity=0, interactive=False)


def figure(name: str, value: float, unit: str, fmt: str = ",.0f") -> None:
    print(f"{name:<52} {value:>12{fmt}} {unit}", flush=True)


Summary = list[tuple[str, str, str, str]]  # figure, value, target, verdict


def section_fire(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    print(f"== 1. fire rate (each fire() in its own transaction.atomic()){note}")
    fired = [measure.fire_rate(case, sizes[f"fire_{case}"]) for case in ("a", "b", "c")]
    for result in fired:
        figure(f"fire {result.case}: events", result.events, "events")
        figure(f"fire {result.case}: events/s", result.events_per_second, "events/s")
        figure(f"fire {result.case}: rows/s", result.rows_per_second, "delivery rows/s")
        figure(f"fire {result.case}: ms/event", result.seconds * 1000 / result.events, "ms", ".3f")
        print(f"  background: {result.background}")
        summary.append((f"fire {result.case}", f"{result.events_per_second:,.0f} ev/s", "", ""))
        summary.append(("  rows written", f"{result.rows_per_second:,.0f} rows/s", "", ""))
    total_events = sum(r.events for r in fired)
    total_seconds = sum(r.seconds for r in fired)
    figure("fire all cases: events/s", total_events / total_seconds, "events/s")


def section_delivery(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> str:
    print(f"== 2. delivery through deliver_pending(batch_size=50), no-op receiver{note}")
    ours = measure.delivery_rate(sizes["deliver"])
    figure("deliver_pending: deliveries", ours.deliveries, "deliveries")
    figure("deliver_pending: deliveries/s", ours.per_second, "deliveries/s")
    figure("deliver_pending: ms/delivery", ours.ms_each, "ms", ".3f")
    print(f"  background: {ours.background}")

    print("== 3. raw psycopg 3 reference (claim 50 SKIP LOCKED, one ack + COMMIT per row)")
    raw = measure.raw_rate(sizes["raw"])
    figure("raw psycopg: deliveries", raw.deliveries, "deliveries")
    figure("raw psycopg: deliveries/s", raw.per_second, "deliveries/s")
    figure("raw psycopg: ms/delivery", raw.ms_each, "ms", ".3f")
    print(f"  background: {raw.background}")
    ratio = ours.per_second / raw.per_second
    verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
    figure("ratio ours/raw (deliveries/s)", ratio, f"target >= {TARGET_RATIO}: {verdict}", ".3f")
    summary += [
        ("deliver_pending()", f"{ours.per_second:,.0f} dlv/s", "", ""),
        ("  per delivery", f"{ours.ms_each:.3f} ms", "", ""),
        ("raw psycopg 3", f"{raw.per_second:,.0f} dlv/s", "", ""),
        ("  per delivery", f"{raw.ms_each:.3f} ms", "", ""),
        ("ratio ours/raw", f"{ratio:.3f}", f">= {TARGET_RATIO}", verdict),
    ]
    return verdict


def section_breakdown(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    print(
        f"== 4. where a delivery's time goes: {sizes['breakdown']:,} rows each, drained in "
        "8 alternating rounds (ours, raw, raw, ours, ...), every statement and commit "
        f"timed{note}"
    )
    before = measure.cpu_counters()
    mine, theirs = measure.paired_breakdown(sizes["breakdown"])
    print(f"  background: {measure.steal_share(before, measure.cpu_counters())}")
    shapes = measure.query_shapes(min(500, sizes["breakdown"]))
    for item in (mine, theirs):
        t = item.timings
        each = item.per_delivery_us
        figure(f"{item.label}: statements/delivery", t.statements / item.deliveries, "", ".3f")
        figure(f"{item.label}: commits/delivery", t.commits / item.deliveries, "", ".3f")
        figure(f"{item.label}: us/delivery total", each(item.seconds), "us")
        figure(f"{item.label}: us/delivery in statements", each(t.statement_seconds), "us")
        figure(f"{item.label}: us/delivery in commits", each(t.commit_seconds), "us")
        figure(f"{item.label}: us/delivery outside them", each(item.outside_seconds), "us")
        figure(f"{item.label}: us/delivery client CPU", each(item.cpu_seconds), "us")
    paired = mine.per_second / theirs.per_second
    figure("paired ratio ours/raw (cross-check of 3.)", paired, "", ".3f")
    extra_outside = mine.per_delivery_us(mine.outside_seconds) - theirs.per_delivery_us(
        theirs.outside_seconds
    )
    extra_cpu = mine.per_delivery_us(mine.cpu_seconds) - theirs.per_delivery_us(theirs.cpu_seconds)
    figure("extra time outside statements/commits, ours - raw", extra_outside, "us")
    figure("extra client CPU per delivery, ours - raw", extra_cpu, "us")
    for item in (mine, theirs):
        print(f"{item.label}: each delivery's wall time, segment by segment:")
        for line in measure.segment_lines(item):
            print(f"  {line}")
    print("deliver_pending() SQL, by shape:")
    for line in shapes:
        print(f"  {line}")
    statements = (
        f"{mine.timings.statements / mine.deliveries:.3f} vs "
        f"{theirs.timings.statements / theirs.deliveries:.3f} raw"
    )
    summary += [
        ("statements/delivery", statements, "", ""),
        ("paired ratio ours/raw (section 4)", f"{paired:.3f}", "", ""),
        ("extra client CPU per delivery vs raw", f"{extra_cpu:,.0f} us", "", ""),
    ]


def verdict_of(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def section_relay(outbox: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    print(f"== 5. the relay as a process: manage.py deliver_events{note}")
    print(
        "5a. wake-up latency: one relay (POLL_SECONDS=10) LISTENing; events fired one at a "
        "time, each in its own transaction; per row succeeded_at - recorded_at (fire()'s "
        "clock, before its INSERT) and succeeded_at - the moment COMMIT returned"
    )
    paced, unpaced = outbox.relay_latency(sizes["relay_latency"], sizes["relay_unpaced"])
    for tag, result in (("paced", paced), ("unpaced", unpaced)):
        print(f"  {result.label}:")
        figure(f"latency {tag}: events", result.events, "events")
        rec, com = result.from_recorded, result.from_commit
        figure(f"latency {tag}: median recorded -> succeeded", outbox.median_ms(rec), "ms", ".1f")
        figure(f"latency {tag}: p95 recorded -> succeeded", outbox.p95_ms(rec), "ms", ".1f")
        figure(f"latency {tag}: max recorded -> succeeded", max(rec) * 1000, "ms", ".1f")
        figure(f"latency {tag}: median commit -> succeeded", outbox.median_ms(com), "ms", ".1f")
        figure(f"latency {tag}: p95 commit -> succeeded", outbox.p95_ms(com), "ms", ".1f")
        print(f"  background: {result.background}")
    median = outbox.median_ms(paced.from_recorded)
    latency_verdict = verdict_of(median < TARGET_LATENCY_MS)
    figure(
        "latency paced: median recorded -> succeeded",
        median,
        f"ms, target < {TARGET_LATENCY_MS:.0f}: {latency_verdict}",
        ".1f",
    )

    count = sizes["relay_rows"]
    print(
        f"5b. throughput: {count:,} owed no-op rows for each of: the raw psycopg loop of "
        "section 3, one deliver_events --once --batch-size 50 process, two started together "
        f"(start-up not timed); in {sizes['relay_rounds']} alternating rounds; "
        "deliveries / (max(succeeded_at) - min(claimed_at)) of each round's rows, summed"
    )
    raw, one, two = outbox.relay_throughput(count, sizes["relay_rounds"])
    for result in (raw, one, two):
        figure(f"{result.label}: deliveries/s", result.per_second, "deliveries/s")
        figure(f"{result.label}: ms/delivery", result.ms_each, "ms", ".3f")
        figure(f"{result.label}: wall time, go -> exit", result.wall, "s", ".2f")
        cpu = result.cpu
        figure(f"{result.label}: client CPU/delivery", cpu.per_delivery_us(result.deliveries), "us")
        figure(
            f"{result.label}: machine CPU busy",
            cpu.machine_busy * 100,
            f"% of {cpu.cores} cores",
            ".0f",
        )
        workers = ", ".join(f"{w} {n:,}" for w, n in sorted(result.by_worker.items()))
        print(f"  rows by worker: {workers}")
        print(f"  background: {result.background}")
    relay_ratio = one.per_second / raw.per_second
    scaling = two.per_second / one.per_second
    relay_verdict = verdict_of(relay_ratio >= TARGET_RELAY_RATIO)
    scaling_verdict = verdict_of(scaling >= TARGET_SCALING)
    figure(
        "ratio one process / raw (deliveries/s)",
        relay_ratio,
        f"target >= {TARGET_RELAY_RATIO}: {relay_verdict}",
        ".3f",
    )
    figure(
        "ratio two processes / one (deliveries/s)",
        scaling,
        f"target >= {TARGET_SCALING}: {scaling_verdict}",
        ".3f",
    )
    summary += [
        (
            "relay latency, median (paced)",
            f"{median:.1f} ms",
            f"< {TARGET_LATENCY_MS:.0f}",
            latency_verdict,
        ),
        ("  p95 (paced)", f"{outbox.p95_ms(paced.from_recorded):.1f} ms", "", ""),
        (
            "  median (unpaced, NOTIFY coalesced)",
            f"{outbox.median_ms(unpaced.from_recorded):.1f} ms",
            "",
            "",
        ),
        ("raw psycopg 3 (relay rows)", f"{raw.per_second:,.0f} dlv/s", "", ""),
        ("deliver_events x 1", f"{one.per_second:,.0f} dlv/s", "", ""),
        (
            "  ratio one process / raw",
            f"{relay_ratio:.3f}",
            f">= {TARGET_RELAY_RATIO}",
            relay_verdict,
        ),
        ("deliver_events x 2", f"{two.per_second:,.0f} dlv/s", "", ""),
        ("  ratio two processes / one", f"{scaling:.3f}", f">= {TARGET_SCALING}", scaling_verdict),
    ]


def print_states(outbox: Any, comparison: Any) -> list[int]:
    """Each table state's medians, query count and plans; returns the query counts."""
    for probe in (comparison.empty, comparison.large):
        claim, health = outbox.median_ms(probe.claim), outbox.median_ms(probe.health)
        figure(f"{probe.label}: claim_batch(limit=50), median", claim, "ms", ".2f")
        figure(f"{probe.label}: outbox_health(), median", health, "ms", ".2f")
        figure(f"{probe.label}: outbox_health() queries", probe.health_queries, "queries")
        claim, health = outbox.median_ms(probe.claim_server), outbox.median_ms(probe.health_server)
        figure(f"{probe.label}: claim, in the server", claim, "ms", ".2f")
        figure(f"{probe.label}: outbox_health(), in the server", health, "ms", ".2f")
        print(f"  claim scans: {probe.claim_plan}")
        for number, plan in enumerate(probe.health_plans, 1):
            print(f"  outbox_health() query {number} scans: {plan}")
    unfolded = outbox.median_ms(comparison.unfolded)
    figure(
        f"{comparison.large.label}: outbox_health() before the tally's fold", unfolded, "ms", ".2f"
    )
    print(f"  background: {comparison.large.background}")
    for what in ("claim", "health"):
        ratio = comparison.ratio(f"{what}_server")
        name = "claim" if what == "claim" else "outbox_health()"
        figure(f"ratio {name} in the server, {comparison.large.label} / empty", ratio, "", ".3f")
    return [comparison.empty.health_queries, comparison.large.health_queries]


def compared(what: str, value: float, target: float, state: str) -> str:
    """Print the ratio ``state`` / empty of ``what`` against its upper bound; PASS/MISS."""
    verdict = verdict_of(value <= target)
    figure(f"ratio {what}, {state} / empty", value, f"target <= {target}: {verdict}", ".3f")
    return verdict


def section_claim(outbox: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    settled, scheduled, reps = sizes["claim_settled"], sizes["claim_scheduled"], sizes["reps"]
    print(
        f"== 6. claim_batch() and outbox_health(): an empty table vs {settled:,} settled + "
        f"{scheduled:,} scheduled rows (due in 30 days); medians of {reps} calls in each "
        f"state, alternating; each claim takes 50 fresh due rows{note}"
    )
    comparison = outbox.compare_states(settled, scheduled, reps, "history")
    figure("history: seeding (generate_series, VACUUM)", comparison.seed_seconds, "s", ".1f")
    counts = print_states(outbox, comparison)
    claim_ratio, health_ratio = comparison.ratio("claim"), comparison.ratio("health")
    claim_verdict = compared("claim", claim_ratio, TARGET_CLAIM_RATIO, "history")
    health_verdict = compared("outbox_health()", health_ratio, TARGET_HEALTH_RATIO, "history")
    count_verdict = verdict_of(counts[0] == counts[1])
    print(f"outbox_health() queries, empty / history: {counts[0]} / {counts[1]}: {count_verdict}")
    empty, large = comparison.empty, comparison.large
    summary += [
        ("claim, empty table", f"{outbox.median_ms(empty.claim):.2f} ms", "", ""),
        ("claim, with history", f"{outbox.median_ms(large.claim):.2f} ms", "", ""),
        (
            "  ratio history / empty",
            f"{claim_ratio:.3f}",
            f"<= {TARGET_CLAIM_RATIO}",
            claim_verdict,
        ),
        ("outbox_health(), empty table", f"{outbox.median_ms(empty.health):.2f} ms", "", ""),
        ("outbox_health(), with history", f"{outbox.median_ms(large.health):.2f} ms", "", ""),
        (
            "  ratio history / empty",
            f"{health_ratio:.3f}",
            f"<= {TARGET_HEALTH_RATIO}",
            health_verdict,
        ),
        ("  queries, empty / history", f"{counts[0]} / {counts[1]}", "equal", count_verdict),
        (
            "  before the relay folds the tally",
            f"{outbox.median_ms(comparison.unfolded):.2f} ms",
            "",
            "",
        ),
    ]
    # The same with the settled history alone: what "never walks history" is about.
    settled_only = outbox.compare_states(settled, 0, reps, "settled")
    settled_ratio = settled_only.ratio("health")
    print(
        f"outbox_health(), {settled:,} settled rows only: "
        f"{outbox.median_ms(settled_only.large.health):.2f} ms vs "
        f"{outbox.median_ms(settled_only.empty.health):.2f} ms empty"
    )
    settled_verdict = compared("outbox_health()", settled_ratio, TARGET_HEALTH_RATIO, "settled")
    summary += [
        (
            "outbox_health(), settled history only",
            f"{outbox.median_ms(settled_only.large.health):.2f} ms",
            "",
            "",
        ),
        (
            "  ratio settled / empty",
            f"{settled_ratio:.3f}",
            f"<= {TARGET_HEALTH_RATIO}",
            settled_verdict,
        ),
    ]


def section_scheduled(outbox: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    scheduled, reps = sizes["scheduled"], sizes["reps"]
    print(
        f"== 7. scheduled reactions: an empty table vs {scheduled:,} rows scheduled 30 days "
        f"out (pending, available_at = due_at); medians of {reps} calls in each state, "
        f"alternating; each claim takes 50 fresh due rows{note}"
    )
    comparison = outbox.compare_states(0, scheduled, reps, "scheduled")
    figure("scheduled: seeding (generate_series, VACUUM)", comparison.seed_seconds, "s", ".1f")
    counts = print_states(outbox, comparison)
    claim_ratio = comparison.ratio("claim")
    claim_verdict = compared("claim", claim_ratio, TARGET_CLAIM_RATIO, "scheduled")
    health_ratio = comparison.ratio("health")
    figure("ratio outbox_health(), scheduled / empty", health_ratio, "(no target)", ".3f")
    count_verdict = verdict_of(counts[0] == counts[1])
    print(f"outbox_health() queries, empty / scheduled: {counts[0]} / {counts[1]}: {count_verdict}")
    large = comparison.large
    summary += [
        ("claim, with scheduled rows", f"{outbox.median_ms(large.claim):.2f} ms", "", ""),
        (
            "  ratio scheduled / empty",
            f"{claim_ratio:.3f}",
            f"<= {TARGET_CLAIM_RATIO}",
            claim_verdict,
        ),
        (
            "outbox_health(), with scheduled rows",
            f"{outbox.median_ms(large.health):.2f} ms",
            "",
            "",
        ),
        ("  ratio scheduled / empty", f"{health_ratio:.3f}", "", ""),
        ("  queries, empty / scheduled", f"{counts[0]} / {counts[1]}", "equal", count_verdict),
    ]


def section_memory(sizes: dict[str, int], summary: Summary, note: str) -> None:
    """A --once relay's peak memory over large payloads: the claim carries payloads only
    up to 64 KB, larger ones are read one at a time as their row runs."""
    import secrets
    import subprocess

    from django.db import transaction

    from bench.events import Bulky
    from bench.measure import reset_tables
    from django_domain_events import fire

    count, mib = sizes["bulky_events"], sizes["bulky_mib"]
    print(
        f"== 8. memory: one deliver_events --once --lane bulky (batch 50) over {count} events "
        f"of {mib} MiB each (random hex, so PostgreSQL cannot compress them away){note}"
    )
    reset_tables()
    for _ in range(count):
        with transaction.atomic():
            fire(Bulky(blob=secrets.token_hex(mib * 512 * 1024)))
    child = Path(__file__).resolve().parent / "relay_child.py"
    done = subprocess.run(
        [sys.executable, str(child), "--once", "--lane", "bulky"],
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(done.stdout.split("relay maxrss-kib ")[1].split()[0]) / 1024
    verdict = verdict_of(peak < TARGET_PEAK_MIB)
    figure("relay peak RSS", peak, f"MiB, target < {TARGET_PEAK_MIB:.0f}: {verdict}", ".0f")
    print(f"  {done.stdout.strip().splitlines()[-2]}")
    reset_tables()
    summary.append((f"relay peak RSS, {count} x {mib} MiB", f"{peak:.0f} MiB", "< 300", verdict))


def _timed_relays(lane: str, rows: int, relays: int, concurrency: int) -> float:
    """Deliveries/s of ``relays`` relay processes ``--once --concurrency N`` over ``rows``
    rows of a 50 ms receiver, start-up excluded; checks every row ran exactly once."""
    import subprocess
    import tempfile

    from django.db import transaction

    from bench.events import Slow
    from bench.measure import reset_tables
    from django_domain_events import DeliveryStatus, fire
    from django_domain_events.models import DeliveryRecord

    reset_tables()
    with transaction.atomic():
        for n in range(rows):
            fire(Slow(n=n))
    child = Path(__file__).resolve().parent / "relay_child.py"
    with tempfile.TemporaryDirectory(prefix="dde-bench-") as tmp:
        log, go = Path(tmp) / "runs", Path(tmp) / "go"
        env = {**os.environ, "DDE_BENCH_RUN_LOG": str(log), "DDE_BENCH_GO_FILE": str(go)}
        args = ["--once", "--lane", lane, "--concurrency", str(concurrency)]
        processes = []
        for index in range(relays):
            ready = Path(tmp) / f"ready-{index}"
            env_one = {**env, "DDE_BENCH_READY_FILE": str(ready)}
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(child), *args],
                    env=env_one,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
            while not ready.exists():
                time.sleep(0.01)
        go.touch()
        outputs = [process.communicate(timeout=600) for process in processes]
        runs = log.read_text().split()
    for process, (out, err) in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"relay failed: {out}{err}")
    wall = max(float(out.split("relay wall ")[1].split()[0]) for out, _ in outputs)
    owed = DeliveryRecord.objects.filter(receiver_key__startswith="bench.slow")
    ids = {str(pk) for pk in owed.filter(receiver_key=f"bench.{lane}").values_list("id", flat=True)}
    if len(runs) != rows or set(runs) != ids:
        raise RuntimeError(f"{lane}: {len(runs)} runs of {rows} rows, {len(set(runs))} distinct")
    if owed.filter(receiver_key=f"bench.{lane}", status=DeliveryStatus.SUCCEEDED).count() != rows:
        raise RuntimeError(f"{lane}: not every row succeeded")
    reset_tables()
    return rows / wall


def section_concurrency(sizes: dict[str, int], summary: Summary, note: str) -> None:
    """A receiver that waits 50 ms: what --concurrency buys one relay, and two."""
    narrow, wide = sizes["slow_rows"], sizes["slow_rows_wide"]
    print(
        f"== 9. concurrency: 50 ms receivers (time.sleep, and an async def awaiting "
        f"asyncio.sleep), deliver_events --once; {narrow} rows at concurrency 1, {wide} at "
        f"16 and 2 x 16; every row checked to have run exactly once (a run log){note}"
    )
    one = _timed_relays("slow", narrow, 1, 1)
    sixteen = _timed_relays("slow", wide, 1, 16)
    two = _timed_relays("slow", wide, 2, 16)
    async_one = _timed_relays("slow_async", narrow, 1, 1)
    async_sixteen = _timed_relays("slow_async", wide, 1, 16)
    for label, value in [
        ("sync, concurrency 1", one),
        ("sync, concurrency 16", sixteen),
        ("sync, 2 relays x concurrency 16", two),
        ("async, concurrency 1", async_one),
        ("async, concurrency 16", async_sixteen),
    ]:
        figure(label, value, "deliveries/s", ",.1f")
    checks = [
        ("sync 16 / 1", sixteen / one, TARGET_CONCURRENCY_16),
        ("sync 2 x 16 / 1", two / one, TARGET_CONCURRENCY_2X16),
        ("async 16 / 1", async_sixteen / async_one, TARGET_CONCURRENCY_16),
    ]
    for label, ratio, target in checks:
        verdict = verdict_of(ratio >= target)
        figure(f"ratio {label}", ratio, f"target >= {target:.0f}: {verdict}", ".1f")
        summary.append((f"concurrency: {label}", f"{ratio:.1f}x", f">= {target:.0f}", verdict))


def section_group(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    """ack="batch": a run of no-op rows acknowledged in one statement and one commit."""
    count, rounds = sizes["group_rows"], sizes["group_rounds"]
    print(
        f"== 10. group acknowledgement: deliver_pending(batch_size=50) over {count:,} no-op "
        f'rows of an ack="batch" receiver, against raw psycopg claiming 50, one UPDATE and '
        f"one COMMIT per batch; medians of {rounds} alternating rounds{note}"
    )
    ours, raw = measure.group_rates(count, rounds)
    figure('ack="batch": deliveries/s', ours, "deliveries/s")
    figure("raw group commit: deliveries/s", raw, "deliveries/s")
    rate_verdict = verdict_of(ours >= TARGET_GROUP_RATE)
    ratio_verdict = verdict_of(ours / raw >= TARGET_GROUP_RATIO)
    figure('ack="batch" rate', ours, f"target >= {TARGET_GROUP_RATE:,.0f}: {rate_verdict}")
    figure("ratio ours / raw group commit", ours / raw, f"target >= 0.25: {ratio_verdict}", ".3f")
    summary += [
        ('ack="batch" deliveries/s', f"{ours:,.0f}", f">= {TARGET_GROUP_RATE:,.0f}", rate_verdict),
        ("  ratio to raw group commit", f"{ours / raw:.3f}", ">= 0.25", ratio_verdict),
    ]


def section_fire_overhead(
    measure: Any, sizes: dict[str, int], summary: Summary, note: str, profile: bool
) -> None:
    rounds, calls = sizes["overhead_rounds"], sizes["overhead_calls"]
    fan = measure.FAN_OUT
    print(
        f"== 11. fire() overhead: {rounds} alternating rounds (baseline, one, fan-out, then "
        f"back) of {calls} transactions each; baseline = transaction.atomic() around one "
        f"EventRecord.objects.create(); one = fire() with 1 durable receiver; fan-out = "
        f"fire() with a {fan}-target receiver; medians of the rounds' per-call times{note}"
    )
    result = measure.fire_overhead(rounds, calls)
    for case, label in (("baseline", "baseline"), ("one", "fire, 1 receiver"), ("fan", "fan")):
        if case == "fan":
            label = f"fire, {fan}-target fan-out"
        figure(f"{label}: ms/call (median)", result.median(case) * 1000, "ms", ".3f")
    one_ms = result.over_baseline("one") * 1000
    fan_us = result.over_baseline("fan") * 1e6 / fan
    one_verdict = verdict_of(one_ms <= TARGET_FIRE_OVERHEAD_MS)
    fan_verdict = verdict_of(fan_us <= TARGET_FAN_OUT_ROW_US)
    figure(
        "fire, 1 receiver, over baseline",
        one_ms,
        f"ms, target <= {TARGET_FIRE_OVERHEAD_MS}: {one_verdict}",
        ".3f",
    )
    figure("  paired (median of per-round differences)", result.paired("one") * 1000, "ms", ".3f")
    figure(
        f"fire, {fan}-target fan-out, over baseline, per row",
        fan_us,
        f"us, target <= {TARGET_FAN_OUT_ROW_US:.0f}: {fan_verdict}",
        ".1f",
    )
    figure("  paired, per row", result.paired("fan") * 1e6 / fan, "us", ".1f")
    print(f"  background: {result.background}")
    if profile:
        for case in ("one", "fan"):
            print(measure.profile_fire(case, calls))
    summary += [
        (
            "fire() 1 receiver over baseline",
            f"{one_ms:.3f} ms",
            f"<= {TARGET_FIRE_OVERHEAD_MS}",
            one_verdict,
        ),
        (
            f"fire() {fan}-target fan-out, per row",
            f"{fan_us:.1f} us",
            f"<= {TARGET_FAN_OUT_ROW_US:.0f}",
            fan_verdict,
        ),
    ]


def section_dashboard(outbox: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    settled, scheduled, reps = sizes["claim_settled"], sizes["claim_scheduled"], sizes["reps"]
    print(
        f"== 13. the admin dashboard: outbox_dashboard() and its figures rendered "
        f"(dashboard_figures.html), an empty table vs {settled:,} settled + {scheduled:,} "
        f"scheduled rows (section 6's state); medians of {reps} calls in each state, "
        f"alternating{note}"
    )
    empty, large, seconds = outbox.compare_dashboard(settled, scheduled, reps)
    figure("history: seeding (generate_series, VACUUM)", seconds, "s", ".1f")
    for probe in (empty, large):
        figure(
            f"{probe.label}: outbox_dashboard(), median", outbox.median_ms(probe.data), "ms", ".2f"
        )
        figure(
            f"{probe.label}: read and rendered, median",
            outbox.median_ms(probe.rendered),
            "ms",
            ".2f",
        )
        figure(f"{probe.label}: read and rendered, p95", outbox.p95_ms(probe.rendered), "ms", ".2f")
        figure(f"{probe.label}: queries", probe.queries, "queries")
        figure(
            f"{probe.label}: its queries, in the server",
            outbox.median_ms(probe.server),
            "ms",
            ".2f",
        )
        for number, plan in enumerate(probe.plans, 1):
            print(f"  query {number} scans: {plan}")
    rendered = outbox.median_ms(large.rendered)
    verdict = verdict_of(rendered < TARGET_DASHBOARD_MS)
    figure(
        "history: read and rendered, median",
        rendered,
        f"ms, target < {TARGET_DASHBOARD_MS:.0f}: {verdict}",
        ".2f",
    )
    count_verdict = verdict_of(empty.queries == large.queries)
    print(f"dashboard queries, empty / history: {empty.queries} / {large.queries}: {count_verdict}")
    summary += [
        ("dashboard, empty table", f"{outbox.median_ms(empty.rendered):.2f} ms", "", ""),
        (
            "dashboard, with history",
            f"{rendered:.2f} ms",
            f"< {TARGET_DASHBOARD_MS:.0f}",
            verdict,
        ),
        (
            "  queries, empty / history",
            f"{empty.queries} / {large.queries}",
            "equal",
            count_verdict,
        ),
    ]


def section_brokers(sizes: dict[str, int], summary: Summary, note: str) -> None:
    """Events/s one relay publishes to each broker, against the raw client loop."""
    from bench import measure_brokers

    events = sizes["broker_events"]
    print(
        f"== 14. publishing: run_relay(once=True, batch_size={BROKER_BATCH}) over {events:,} rows "
        f"of publish(Tick, to=...), against the same client library sending the same "
        f"CloudEvents in batches of {BROKER_BATCH}, each batch's confirms awaited{note}"
    )
    raws: dict[str, float] = {}
    for transport in ("rabbitmq", "nats", "redis"):
        if not measure_brokers.reachable(transport):
            print(f"{transport}: not reachable at {measure_brokers.URLS[transport]}: skipped")
            summary.append((f"{transport} published events/s", "skipped", "", ""))
            continue
        published = measure_brokers.ours(transport, events, BROKER_BATCH)
        ours = published.rate
        raw = raws[transport] = measure_brokers.raw(transport, events, BROKER_BATCH)
        figure(f"{transport}: published events/s, one relay", ours, "events/s")
        if published.wal_per_row is not None:
            figure(
                f"{transport}: PostgreSQL's WAL per published row", published.wal_per_row, "bytes"
            )
        if transport == "redis":
            usual = measure_brokers.ours(transport, events, BROKER_BATCH, by_lock=False)
            figure(f"{transport}: the same with the usual claim", usual.rate, "events/s")
            if usual.wal_per_row is not None:
                figure(f"{transport}: its WAL per published row", usual.wal_per_row, "bytes")
        figure(f"{transport}: raw client loop, messages/s", raw, "messages/s")
        ratio_verdict = verdict_of(ours / raw >= TARGET_PUBLISH_RATIO)
        figure(
            f"{transport}: ratio ours / raw", ours / raw, f"target >= 0.5: {ratio_verdict}", ".3f"
        )
        if transport == "redis":
            summary.append((f"{transport} published events/s", f"{ours:,.0f}", "", ""))
        else:
            rate_verdict = verdict_of(ours >= TARGET_PUBLISH_RATE)
            summary.append(
                (f"{transport} published events/s", f"{ours:,.0f}", ">= 3,000", rate_verdict)
            )
        summary.append(
            ("  ratio to the raw client loop", f"{ours / raw:.3f}", ">= 0.5", ratio_verdict)
        )
    steps = measure_brokers.phases(min(events, 5_000), BROKER_BATCH)
    print(
        f"the relay's own steps per batch of {BROKER_BATCH}, timed apart (fastest batch; the "
        "broker's send runs beside the next claim): "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in steps.items())
        + f"; together {sum(steps.values()):.1f} ms. A raw loop's batch: "
        + ", ".join(f"{name} {BROKER_BATCH * 1000 / rate:.1f} ms" for name, rate in raws.items())
    )


def section_priority(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    """A saturating stream of priority-10 rows and a trickle of priority-0 rows, one relay."""
    from bench import measure_priority as prio

    seconds = sizes["priority_seconds"]
    print(
        f"== 15. priorities: {prio.BACKLOG} priority-10 rows kept owed and a priority-0 row "
        f"every {prio.TRICKLE_SECONDS} s, one relay claiming {prio.BATCH} at a time, for "
        f"{seconds} s, PRIORITY_AGING_SECONDS = {prio.AGING_SECONDS}{note}"
    )
    measure.reset_tables()
    waits = prio.starvation(seconds)
    print(f"priority 10: {len(waits.urgent):,} rows, wait {prio.summary(waits.urgent)}")
    print(f"priority 0: {len(waits.trickle):,} rows, wait {prio.summary(waits.trickle)}")
    bound = prio.AGING_SECONDS + max(waits.urgent, default=0.0)
    worst = max(waits.trickle, default=float("inf"))
    verdict = verdict_of(waits.unrun_age <= bound and worst <= bound)
    print(
        f"priority 0 max wait {worst:.2f} s, bound (aging + the backlog's own wait) "
        f"{bound:.2f} s; the oldest still owed at the end had waited {waits.unrun_age:.2f} s: "
        f"{verdict}"
    )
    summary.append(
        (
            "priority 0 max wait under priority 10 load",
            f"{worst:.2f} s",
            f"<= {bound:.1f} s",
            verdict,
        )
    )
    measure.reset_tables()


def section_ordering(measure: Any, sizes: dict[str, int], summary: Summary, note: str) -> None:
    """Ordered against unordered receivers: one relay, --concurrency 16, one hot key."""
    from bench import measure_ordering as order

    rows, slow = sizes["ordering_rows"], sizes["ordering_slow_rows"]
    print(
        f"== 16. order per key: {rows:,} rows over {order.KEYS:,} keys on one relay, "
        f"{slow:,} rows of a 50 ms receiver with --concurrency 16, and one hot key{note}"
    )
    measure.reset_tables()
    try:
        rates: dict[bool, list[float]] = {True: [], False: []}
        for ordered in (False, True, False, True):
            rates[ordered].append(order.one_relay(rows // 2, ordered).per_second)
        _ordering_line(summary, "one relay", max(rates[True]), max(rates[False]))
        wide = {ordered: order.concurrent(slow, ordered)[0] for ordered in (False, True)}
        _ordering_line(
            summary, "--concurrency 16, 50 ms", wide[True].per_second, wide[False].per_second
        )
        hot, cpu = order.concurrent(sizes["ordering_hot_rows"], True, keys=1)
        print(
            f"one hot key, --concurrency 16, 50 ms: {hot.per_second:.1f} rows/s (at most 20: "
            f"one at a time), relay CPU {cpu:.3f} s per second while the other slots wait"
        )
        summary.append(("ordered, one hot key: relay CPU", f"{cpu:.3f} s/s", "report", ""))
    finally:
        order.forget()
    measure.reset_tables()


def _ordering_line(summary: Summary, case: str, ordered: float, unordered: float) -> None:
    ratio = ordered / unordered
    verdict = verdict_of(ratio >= 0.8)
    print(
        f"{case}: ordered {ordered:,.0f} rows/s, unordered {unordered:,.0f} rows/s, "
        f"ratio {ratio:.2f}: {verdict}"
    )
    summary.append((f"ordered / unordered, {case}", f"{ratio:.2f}", ">= 0.8", verdict))


def section_limits(sizes: dict[str, int], summary: Summary, note: str) -> None:
    """A 50/s receiver and an unlimited one in one lane, four relays x --concurrency 8."""
    from bench import measure_limits as lim
    from bench.events import METERED_RATE

    free, metered, rounds = (
        sizes["limits_unmetered"],
        sizes["limits_metered"],
        sizes["limits_rounds"],
    )
    print(
        f"== 17. limits: {lim.RELAYS} relays x --concurrency {lim.CONCURRENCY}, lane "
        f"'metered'; {free:,} rows of an unlimited receiver alone, then behind {metered:,} "
        f"rows of a {METERED_RATE} receiver fired first; {rounds} rounds, every other one "
        f"in reverse order{note}"
    )
    alone, beside, control, windows = [], [], [], []
    cpu: dict[str, list[float]] = {"alone": [], "beside": [], "control": []}
    cases = {
        "alone": lambda: lim.run_round(free, 0),
        "beside": lambda: lim.run_round(free, metered),
        "control": lambda: lim.run_round(free, 0, paced=50.0),
    }
    for number in range(rounds):
        load = os.getloadavg()[0]
        # Every other round runs its cases in reverse order, so that the host's drift over
        # a round (a vacuum, a neighbour's job) weighs on "alone" and the control alike.
        order = list(cases) if number % 2 == 0 else list(reversed(cases))
        ran = {case: cases[case]() for case in order}
        solo, both, paced = ran["alone"], ran["beside"], ran["control"]
        alone.append(solo.unmetered_rate)
        beside.append(both.unmetered_rate)
        windows += both.windows()
        control.append(paced.unmetered_rate)
        for case, done in (("alone", solo), ("beside", both), ("control", paced)):
            cpu[case].append(done.cpu_per_row)
        print(
            f"  round (load {load:.1f}, {order[0]} first): alone {alone[-1]:,.1f}/s, beside "
            f"the 50/s limit {beside[-1]:,.1f}/s, beside 50/s unlimited {control[-1]:,.1f}/s; "
            f"relay CPU per row {solo.cpu_per_row:.2f} / {both.cpu_per_row:.2f} / "
            f"{paced.cpu_per_row:.2f} ms",
            flush=True,
        )
    ratio = sum(beside) / sum(alone)
    verdict = verdict_of(ratio >= TARGET_UNMETERED_RATIO)
    # The host moves "alone" by 10-30 % between rounds: the pooled ratio is the figure,
    # and the rounds' own spread says how far one run of them can be trusted.
    each = [both / solo for solo, both in zip(alone, beside, strict=True)]
    spread = f", sd {statistics.stdev(each):.3f}" if len(each) > 1 else ""
    print(
        f"  beside the limit / alone, round by round: {', '.join(f'{r:.3f}' for r in each)} "
        f"(mean {statistics.fmean(each):.3f}{spread})"
    )
    figure("unlimited receiver alone", sum(alone) / rounds, "deliveries/s", ",.1f")
    figure("... beside the 50/s limited receiver", sum(beside) / rounds, "deliveries/s", ",.1f")
    figure(
        "... beside 50/s of unlimited rows (control)", sum(control) / rounds, "deliveries/s", ",.1f"
    )
    figure(
        "ratio beside the limit / alone",
        ratio,
        f"target >= {TARGET_UNMETERED_RATIO}: {verdict}",
        ".2f",
    )
    own = sum(beside) / sum(control)
    figure("ratio beside the limit / beside the control", own, "the limit's own cost", ".2f")
    for case, text in (("alone", "alone"), ("beside", "beside the limit"), ("control", "control")):
        figure(f"relay CPU per row run, {text}", sum(cpu[case]) / rounds, "ms", ".2f")
    summary.append(("unlimited beside 50/s, over alone", f"{ratio:.2f}", ">= 0.9", verdict))
    summary.append(("... over beside 50/s unlimited", f"{own:.2f}", "(info)", ""))
    low, high = min(windows, default=0.0), max(windows, default=0.0)
    held = bool(windows) and low >= 50 - TARGET_RATE_SPREAD and high <= 50 + TARGET_RATE_SPREAD
    figure("50/s limit, slowest 10 s window", low, "starts/s", ".1f")
    figure("50/s limit, fastest 10 s window", high, f"starts/s, 50 +- 5: {verdict_of(held)}", ".1f")
    summary.append(
        ("50/s limit, 10 s windows", f"{low:.1f}-{high:.1f}/s", "45-55", verdict_of(held))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    parser.add_argument("--profile", action="store_true", help="cProfile a drain as well")
    parser.add_argument(
        "--limits-rounds",
        type=int,
        metavar="N",
        help="section 17's rounds (default 3, about 3 minutes each): more narrow its spread",
    )
    parser.add_argument(
        "--only",
        choices=[
            "fire",
            "delivery",
            "breakdown",
            "relay",
            "claim",
            "scheduled",
            "memory",
            "concurrency",
            "group",
            "fire_overhead",
            "dashboard",
            "brokers",
            "priority",
            "ordering",
            "limits",
        ],
        help="run one part: fire (1.), delivery (2. and 3.), breakdown (4.), relay (5.), "
        "claim (6.), scheduled (7.), memory (8.), concurrency (9.), group (10.), "
        "fire_overhead (11.), dashboard (13.), brokers (14.), priority (15.), ordering (16.) "
        "or limits (17.)",
    )
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    sizes = {
        name: max(QUICK_FLOOR.get(name, 1) if args.quick else 1, size // scale)
        for name, size in FULL_SIZES.items()
    }
    if args.limits_rounds is not None:
        if args.limits_rounds < 1:
            parser.error(f"--limits-rounds {args.limits_rounds}: give a whole number, 1 or more")
        sizes["limits_rounds"] = args.limits_rounds
    note = " [quick: a tenth of the sizes]" if args.quick else ""

    began = time.perf_counter()
    ensure_database()
    import django

    django.setup()
    rebuild_schema()

    from bench import measure, measure_outbox

    measure.check_seed_matches_fire()
    summary: Summary = []
    verdict = ""
    if args.only in (None, "fire"):
        section_fire(measure, sizes, summary, note)
    if args.only in (None, "delivery"):
        verdict = section_delivery(measure, sizes, summary, note)
    if args.only in (None, "breakdown"):
        section_breakdown(measure, sizes, summary, note)
    if args.only in (None, "relay"):
        section_relay(measure_outbox, sizes, summary, note)
    if args.only in (None, "claim"):
        section_claim(measure_outbox, sizes, summary, note)
    if args.only in (None, "scheduled"):
        section_scheduled(measure_outbox, sizes, summary, note)
    if args.only in (None, "memory"):
        section_memory(sizes, summary, note)
    if args.only in (None, "concurrency"):
        section_concurrency(sizes, summary, note)
    if args.only in (None, "group"):
        section_group(measure, sizes, summary, note)
    if args.only in (None, "fire_overhead"):
        section_fire_overhead(measure, sizes, summary, note, args.profile)
    if args.only in (None, "dashboard"):
        section_dashboard(measure_outbox, sizes, summary, note)
    if args.only in (None, "brokers"):
        section_brokers(sizes, summary, note)
    if args.only in (None, "priority"):
        section_priority(measure, sizes, summary, note)
    if args.only in (None, "ordering"):
        section_ordering(measure, sizes, summary, note)
    if args.only in (None, "limits"):
        section_limits(sizes, summary, note)
    if args.profile and args.only != "fire_overhead":
        print(f"== 12. cProfile of deliver_pending() over {sizes['profile']:,} rows")
        print(measure.profile_ours(sizes["profile"]))
    elif verdict == "MISS":
        print("(ratio below target: run with --profile for the hot spots)")

    measure.reset_tables()
    elapsed = time.perf_counter() - began
    print("== summary")
    print(f"{'figure':<44} {'value':>22} {'target':>8} {'':>4}")
    for name, value, target, mark in summary:
        print(f"{name:<44} {value:>22} {target:>8} {mark:>4}")
    print(f"{'total run time':<44} {elapsed:>21.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
