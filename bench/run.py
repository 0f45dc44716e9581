"""Benchmark of django-domain-events on PostgreSQL: ``make bench`` (see bench/README.md).

    .venv/bin/python bench/run.py            full run (about two minutes)
    .venv/bin/python bench/run.py --quick    a tenth of the sizes: a smoke run
    .venv/bin/python bench/run.py --profile  also cProfile a 2,000-row drain

Targets are reported (PASS/MISS), not asserted: the exit status is 0 unless something
failed (no database, a drain that did not deliver every row, ...).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

TARGET_RATIO = 0.5  # deliver_pending() deliveries/s over raw psycopg deliveries/s

FULL_SIZES = {
    # 11,000 events in all: at ~3-6 ms a commit on this machine, 20,000 would not fit the
    # three-minute budget next to the two 20,000-row drains.
    "fire_a": 5_000,
    "fire_b": 5_000,
    "fire_c": 1_000,  # 50 rows each: 50,000 rows
    "deliver": 20_000,
    "raw": 20_000,
    "breakdown": 2_000,
    "profile": 2_000,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    parser.add_argument("--profile", action="store_true", help="cProfile a drain as well")
    parser.add_argument(
        "--only",
        choices=["fire", "delivery", "breakdown"],
        help="run one part: fire (1.), delivery (2. and 3.) or breakdown (4.)",
    )
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    sizes = {name: max(1, size // scale) for name, size in FULL_SIZES.items()}
    note = " [quick: a tenth of the sizes]" if args.quick else ""

    began = time.perf_counter()
    ensure_database()
    import django

    django.setup()
    rebuild_schema()

    from bench import measure

    measure.check_seed_matches_fire()
    summary: Summary = []
    verdict = ""
    if args.only in (None, "fire"):
        section_fire(measure, sizes, summary, note)
    if args.only in (None, "delivery"):
        verdict = section_delivery(measure, sizes, summary, note)
    if args.only in (None, "breakdown"):
        section_breakdown(measure, sizes, summary, note)
    if args.profile:
        print(f"== 5. cProfile of deliver_pending() over {sizes['profile']:,} rows")
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
