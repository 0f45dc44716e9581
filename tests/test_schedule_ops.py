"""Operating schedules: schedule_status(), manage.py schedules, and tick rows pruned."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from django_domain_events import (
    ScheduleStatus,
    clock,
    fire_due_ticks,
    pause_schedule,
    prune_events,
    recurring,
    resume_schedule,
    schedule_status,
)
from django_domain_events.models import EventRecord, ScheduleRecord, TickRecord, TickStatus
from django_domain_events.recurrence import aware, schedules
from tests.app.events import ReportDue
from tests.conftest import ROOT, child_env
from tests.support import command

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)  # 30 s past a whole minute


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 6, 1, 12, minute, second, tzinfo=UTC)


def minutely(key: str = "ops.minutely", **options: object) -> str:
    @recurring(every=timedelta(minutes=1), key=key, **options)  # type: ignore[arg-type]
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    return key


def failing_at(*ticks: datetime, key: str = "ops.flaky") -> str:
    """An every-minute schedule whose function raises for these ticks."""

    @recurring(every=timedelta(minutes=1), key=key)
    def build(tick: datetime) -> ReportDue:
        if aware(tick) in ticks:  # naive local time under USE_TZ = False
            raise RuntimeError(f"the report server is down at {tick.minute}")
        return ReportDue(tick=tick.isoformat())

    return key


def status_of(key: str, now: datetime) -> ScheduleStatus:
    (found,) = [s for s in schedule_status(now=now) if s.key == key]
    return found


# schedule_status() ---------------------------------------------------------------


def test_status_shows_the_last_fired_and_skipped_ticks_and_the_next_three() -> None:
    key = minutely()
    fire_due_ticks(now=T0)
    fire_due_ticks(now=at(1, 10))  # fires 12:01
    fire_due_ticks(now=at(5, 10))  # fires 12:05, skips 12:02 to 12:04
    status = status_of(key, at(5, 20))
    assert status == ScheduleStatus(
        key=key,
        spec="every 0:01:00",
        timezone="UTC",
        catch_up="latest",
        declared=True,
        paused=False,
        paused_at=None,
        next_tick_at=at(6),
        last_fired=at(5),
        last_event_id=EventRecord.objects.get(payload__tick=clock.normalize(at(5)).isoformat()).pk,
        last_skipped=at(4),
        skipped_from=at(2),
        skip_reason=status.skip_reason,
        last_failed=None,
        failure="",
        failing=False,
        next_ticks=(at(6), at(7), at(8)),
        late=False,
    )
    assert "catch_up='latest'" in status.skip_reason
    assert all(t.tzinfo is not None for t in status.next_ticks)


def test_a_failed_tick_shows_until_a_later_one_fires() -> None:
    key = failing_at(at(2))
    fire_due_ticks(now=T0)
    fire_due_ticks(now=at(1, 5))
    fire_due_ticks(now=at(2, 5))  # 12:02 raises
    status = status_of(key, at(2, 10))
    assert (status.last_fired, status.last_failed) == (at(1), at(2))
    assert "RuntimeError: the report server is down at 2" in status.failure
    assert status.failing
    fire_due_ticks(now=at(3, 5))
    status = status_of(key, at(3, 10))
    assert (status.last_fired, status.last_failed) == (at(3), at(2))
    assert not status.failing  # the schedule fired since


def test_a_paused_schedule_has_no_next_ticks_and_is_never_late() -> None:
    key = minutely()
    fire_due_ticks(now=T0)
    pause_schedule(key, now=at(0, 40))
    status = status_of(key, at(30))
    assert status.paused and aware(status.paused_at) == at(0, 40)  # type: ignore[arg-type]
    assert status.next_ticks == () and status.next_tick_at is None
    assert not status.late
    resume_schedule(key, now=at(30, 10))
    status = status_of(key, at(30, 20))
    assert not status.paused and status.paused_at is None
    assert status.next_ticks == (at(31), at(32), at(33))
    assert (status.skipped_from, status.last_skipped) == (at(1), at(30))
    assert "paused" in status.skip_reason


def test_a_schedule_whose_next_tick_is_past_the_grace_is_late() -> None:
    key = minutely()
    fire_due_ticks(now=T0)  # next tick 12:01; then no relay runs
    assert not status_of(key, at(1, 59)).late  # 59 s: a relay may be on its way
    assert status_of(key, at(2, 1)).late  # 61 s: more than a minute, no relay fires it
    assert status_of(key, at(30)).late
    fire_due_ticks(now=at(30))
    assert not status_of(key, at(30, 1)).late


def test_a_cursor_row_no_schedule_declares_is_listed_not_declared() -> None:
    minutely(key="ops.gone")

    @recurring(cron="0 6 * * *", timezone="America/New_York", key="ops.gone_cron")
    def morning(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=T0)
    fire_due_ticks(now=at(1, 5))
    schedules.remove("ops.gone")  # removed from the code; its rows stay
    schedules.remove("ops.gone_cron")
    assert status_of("ops.gone_cron", at(10)).timezone == "America/New_York"
    status = status_of("ops.gone", at(10))
    assert not status.declared
    assert status.spec == "every 0:01:00" and status.catch_up is None
    assert status.timezone == "UTC"
    assert status.last_fired == at(1)
    assert status.next_ticks == ()
    assert not status.late  # nothing will fire it: not a relay's fault


def test_a_declared_schedule_no_relay_has_seen_yet_is_listed() -> None:
    key = minutely()
    status = status_of(key, at(0, 30))
    assert status.declared and status.next_tick_at is None
    assert status.next_ticks == (at(1), at(2), at(3))
    assert (status.last_fired, status.last_skipped, status.last_failed) == (None, None, None)
    assert not status.late
    assert not ScheduleRecord.objects.exists()  # reading writes nothing


def test_status_is_sorted_by_key_and_reads_in_two_queries_whatever_the_tick_rows() -> None:
    keys = [minutely(key=f"ops.s{n}") for n in (3, 1, 2)]
    failing_at(at(2), key="ops.s0")
    fire_due_ticks(now=T0)
    for minute in range(1, 4):
        fire_due_ticks(now=at(minute, 5))
    with CaptureQueriesContext(connection) as few:
        before = schedule_status(now=at(4))
    assert [s.key for s in before] == ["ops.s0", *sorted(keys)]
    TickRecord.objects.bulk_create(
        TickRecord(
            schedule_key=f"ops.s{n % 4}",
            tick=clock.normalize(T0 - timedelta(minutes=m)),
            status=[TickStatus.FIRED, TickStatus.SKIPPED, TickStatus.FAILED][m % 3],
            recorded_at=clock.normalize(T0),
        )
        for n in range(4)
        for m in range(1, 600)
    )
    with CaptureQueriesContext(connection) as many:
        after = schedule_status(now=at(4))
    assert len(few) == len(many) == 2
    assert [s.last_fired for s in after] == [s.last_fired for s in before]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_status_reads_each_newest_tick_from_an_index_on_postgresql() -> None:
    key = minutely()
    fire_due_ticks(now=T0)
    TickRecord.objects.bulk_create(
        (
            TickRecord(
                schedule_key=key,
                tick=clock.normalize(T0 - timedelta(minutes=m)),
                status=TickStatus.FIRED,
                recorded_at=clock.normalize(T0),
            )
            for m in range(1, 100_000)
        ),
        batch_size=5000,
    )
    table = TickRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    with CaptureQueriesContext(connection) as queries:
        schedule_status(now=T0)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {queries[0]['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # No failed or skipped tick at all: each probe still descends the index once,
    # never reading the schedule's 100,000 fired ticks to find none.
    assert f"Seq Scan on {table}" not in plan, plan
    assert f"Bitmap Heap Scan on {table}" not in plan, plan
    assert "dde_tick_newest" in plan, plan


def test_nothing_declared_and_no_rows_costs_one_query() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert schedule_status() == ()
    assert len(queries) == 1


# manage.py schedules -------------------------------------------------------------


def recent() -> datetime:
    """A whole minute an hour ago, so the ticks the tests fire are in the past."""
    return aware(clock.now()).replace(second=0, microsecond=0) - timedelta(hours=1)


def test_schedules_lists_each_schedule_with_its_ticks() -> None:
    key = minutely()
    base = recent()
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + timedelta(minutes=5, seconds=5))
    pause_schedule(key)
    minutely(key="ops.gone")
    fire_due_ticks(now=base + timedelta(minutes=6, seconds=5))
    schedules.remove("ops.gone")
    out = command("schedules")
    block = out.split("\n\n")
    (mine,) = [b for b in block if b.startswith(f"{key}\n")]
    assert "  spec: every 0:01:00" in mine
    assert "  catch-up: latest" in mine
    assert "  paused: since " in mine
    assert f"  last fired: {(base + timedelta(minutes=5)).isoformat()}" in mine
    first, last = base + timedelta(minutes=1), base + timedelta(minutes=4)
    assert f"  last skipped: {first.isoformat()} to {last.isoformat()}" in mine
    assert "  last failed: -" in mine
    assert "  next: - (paused)" in mine
    (gone,) = [b for b in block if b.startswith("ops.gone")]
    assert gone.startswith("ops.gone (not declared")
    assert "  last fired: -" in gone  # the first tick after it was seen is 6 min 0 s


def test_schedules_prints_cron_ticks_in_the_schedules_zone() -> None:
    @recurring(cron="0 6 * * *", timezone="America/New_York", key="ops.morning")
    def morning(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    schedule = schedules.get("ops.morning")
    assert schedule is not None
    now = aware(clock.now())
    first = schedule.next_after(now)
    expected = [first, schedule.next_after(first)]
    expected.append(schedule.next_after(expected[-1]))
    zone = ZoneInfo("America/New_York")
    out = command("schedules")
    shown = ", ".join(t.astimezone(zone).isoformat() for t in expected)
    assert f"  next: {shown}" in out
    assert "T06:00:00-0" in shown  # -04:00 or -05:00, whatever the season
    data = json.loads(command("schedules", "--format", "json"))
    (row,) = data
    assert row["key"] == "ops.morning"
    assert row["timezone"] == "America/New_York"
    assert row["next_ticks"] == [t.astimezone(zone).isoformat() for t in expected]


def test_schedules_json_has_every_field() -> None:
    base = recent()
    key = failing_at(base + timedelta(minutes=2))
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + timedelta(minutes=2, seconds=5))  # 12:02 raises, 12:01 skipped
    data = json.loads(command("schedules", "--format", "json"))
    (row,) = data
    assert row["key"] == key and row["declared"] is True and row["paused"] is False
    assert row["last_failed"] == (base + timedelta(minutes=2)).isoformat()
    assert "the report server is down" in row["failure"]
    assert row["last_skipped"] == row["skipped_from"] == (base + timedelta(minutes=1)).isoformat()
    assert row["late"] is True  # no relay has fired it for an hour
    assert len(row["next_ticks"]) == 3
    assert row["catch_up"] == "latest" and row["timezone"] == "UTC"


def test_schedules_pause_and_resume_say_what_happened() -> None:
    key = minutely()
    fire_due_ticks()
    assert command("schedules", "--pause", key).strip() == f"Paused {key}."
    assert ScheduleRecord.objects.get(key=key).paused_at is not None
    assert command("schedules", "--pause", key).strip() == f"{key} was already paused."
    out = command("schedules", "--resume", key).strip()
    assert out.startswith(f"Resumed {key}; its next tick is ")
    assert ScheduleRecord.objects.get(key=key).paused_at is None
    assert command("schedules", "--resume", key).strip() == f"{key} was not paused."


def test_schedules_refuses_an_unknown_key_naming_the_known_ones() -> None:
    key = minutely()
    with pytest.raises(CommandError, match=rf"'ops.nope'.*{key}"):
        command("schedules", "--pause", "ops.nope")
    with pytest.raises(CommandError, match=rf"'ops.nope'.*{key}"):
        command("schedules", "--resume", "ops.nope")
    assert not ScheduleRecord.objects.filter(paused_at__isnull=False).exists()


def test_schedules_with_an_unknown_key_exits_non_zero() -> None:
    child = subprocess.run(
        [sys.executable, "-m", "django", "schedules", "--pause", "ops.nope"],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode != 0
    assert "'ops.nope'" in child.stderr and "Traceback" not in child.stderr


def test_schedules_without_any_says_so() -> None:
    assert "No schedule is declared" in command("schedules")


def test_schedules_refuses_a_format_it_does_not_write() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'xml'"):
        command("schedules", "--format", "xml")
    with pytest.raises(CommandError, match="'xml' is not a format; use one of text, json"):
        call_command("schedules", format="xml")


# Tick rows pruned --------------------------------------------------------------


def test_prune_deletes_tick_rows_with_their_events_and_old_unfired_ones() -> None:
    base = recent()
    minute = timedelta(minutes=1)
    key = minutely()
    flaky = failing_at(base + 3 * minute)
    fire_due_ticks(now=base + timedelta(seconds=30))
    fire_due_ticks(now=base + 3 * minute + timedelta(seconds=30))  # skips 1-2, fires 3
    fire_due_ticks(now=base + 50 * minute + timedelta(seconds=30))  # skips 4-49, fires 50
    rows = {
        (k, s): n
        for k, s, n in TickRecord.objects.values_list("schedule_key", "status")
        .order_by()
        .annotate(n=Count("pk"))
    }
    assert rows == {
        (key, "fired"): 2,
        (key, "skipped"): 2,
        (flaky, "failed"): 1,
        (flaky, "fired"): 1,
        (flaky, "skipped"): 2,
    }
    cursors = list(ScheduleRecord.objects.order_by("key").values_list())

    # Events were recorded just now: a 30-minute window keeps them and their tick rows,
    # and deletes the unfired rows recorded more than 30 minutes ago.
    assert prune_events(timedelta(minutes=30), now=clock.now(), batch_size=1) == 0
    left = set(TickRecord.objects.values_list("schedule_key", "status", "tick"))
    assert {(k, s) for k, s, _ in left} == {
        (key, "fired"),
        (key, "skipped"),
        (flaky, "fired"),
        (flaky, "skipped"),
    }
    assert {aware(t) for _, s, t in left if s == "skipped"} == {base + 49 * minute}
    assert TickRecord.objects.filter(status="fired").count() == 3

    # A window of 0: every event goes, and its tick row with it.
    assert prune_events(timedelta(0), now=clock.now() + timedelta(seconds=1), batch_size=2) == 3
    assert not EventRecord.objects.exists()
    assert not TickRecord.objects.exists()
    assert list(ScheduleRecord.objects.order_by("key").values_list()) == cursors
    assert {aware(r) for r in ScheduleRecord.objects.values_list("last_tick_at", flat=True)} == {
        base + 50 * minute
    }

    # The cursors never move back: nothing fires again.
    assert fire_due_ticks(now=base + 50 * minute + timedelta(seconds=30)) == 0
    assert not TickRecord.objects.exists()
    assert fire_due_ticks(now=base + 51 * minute + timedelta(seconds=5)) == 2


def test_forget_deletes_the_cursor_of_a_schedule_no_longer_declared_only() -> None:
    key = minutely(key="ops.forgotten")
    fire_due_ticks(now=T0)
    fire_due_ticks(now=at(1, 5))
    with pytest.raises(CommandError, match="still declared with @recurring"):
        command("schedules", "--forget", key)
    assert ScheduleRecord.objects.filter(key=key).exists()
    schedules.remove(key)  # the declaration removed from the code and deployed
    assert command("schedules", "--forget", key).startswith(f"Forgot {key}")
    assert not ScheduleRecord.objects.filter(key=key).exists()
    assert TickRecord.objects.filter(schedule_key=key).count() == 1  # history stays
    assert "nothing to forget" in command("schedules", "--forget", key)
    assert key not in [s.key for s in schedule_status(now=at(2))]
    minutely(key="ops.forgotten")  # declared again: a new schedule, from now
    assert fire_due_ticks(now=at(30, 5)) == 0
    assert fire_due_ticks(now=at(31, 5)) == 1
