"""@recurring: declaration, ticks fired once through fire(), catch-up, DST, pause/resume."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_domain_events import (
    clock,
    fire_due_ticks,
    pause_schedule,
    recurring,
    resume_schedule,
)
from django_domain_events.models import (
    DeliveryRecord,
    EventRecord,
    ScheduleRecord,
    TickRecord,
    TickStatus,
)
from django_domain_events.recurrence import aware, schedules
from tests.app.events import ReportDue

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)  # 30 s past a whole minute


def every_minute(**options: object) -> str:
    key = options.pop("key", "tests.every_minute")

    @recurring(every=timedelta(minutes=1), key=key, **options)  # type: ignore[arg-type]
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    return str(key)


def fired_ticks(key: str) -> list[datetime]:
    return [
        aware(t)
        for t in TickRecord.objects.filter(schedule_key=key, status=TickStatus.FIRED)
        .order_by("tick")
        .values_list("tick", flat=True)
    ]


def event_ticks() -> list[str]:
    return sorted(p["tick"] for p in EventRecord.objects.values_list("payload", flat=True))


# Declaration -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({}, TypeError, "exactly one of cron="),
        ({"cron": "0 6 * * *", "every": timedelta(minutes=1)}, TypeError, "exactly one"),
        ({"cron": "0 6 * *"}, ValueError, "five fields"),
        ({"cron": "61 6 * * *"}, ValueError, "not a valid cron expression"),
        ({"cron": "0 6 * * *", "timezone": "Europe/Pariss"}, ValueError, "IANA name"),
        ({"every": timedelta(0)}, ValueError, "at least one second"),
        ({"every": 60}, ValueError, "timedelta of at least one second"),
        ({"every": timedelta(minutes=1), "timezone": "UTC"}, ValueError, "cron= only"),
        ({"every": timedelta(minutes=1), "catch_up": "some"}, ValueError, "not a policy"),
        ({"every": timedelta(minutes=1), "catch_up_limit": 5}, ValueError, "catch_up='all'"),
        (
            {"every": timedelta(minutes=1), "catch_up": "all", "catch_up_limit": 0},
            ValueError,
            ">= 1",
        ),
        ({"every": timedelta(minutes=1), "tolerance": timedelta(0)}, ValueError, "positive"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_fix(
    options: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        recurring(**options)  # type: ignore[arg-type]


def test_a_key_taken_twice_is_refused() -> None:
    every_minute(key="tests.twice")
    with pytest.raises(ValueError, match="is taken by"):

        @recurring(every=timedelta(hours=1), key="tests.twice")
        def other(tick: datetime) -> ReportDue:
            return ReportDue(tick="")


def test_an_async_function_or_one_without_the_tick_is_refused() -> None:
    with pytest.raises(TypeError, match="plain function"):

        @recurring(every=timedelta(hours=1))
        async def build(tick: datetime) -> ReportDue:
            return ReportDue(tick="")

    with pytest.raises(TypeError, match="one argument, the tick"):

        @recurring(every=timedelta(hours=1))
        def no_tick() -> ReportDue:
            return ReportDue(tick="")


def test_the_key_defaults_to_app_label_and_function_name() -> None:
    @recurring(every=timedelta(hours=1))
    def nightly(tick: datetime) -> ReportDue:
        return ReportDue(tick="")

    assert schedules.get("tests.nightly") is not None


# Firing ------------------------------------------------------------------------


def test_a_tick_fires_its_event_once_through_fire_with_every_receiver() -> None:
    from django_domain_events import receiver

    @receiver(ReportDue, key="tests.report_mailer")
    def mail(evt: ReportDue) -> None: ...

    key = every_minute()
    assert fire_due_ticks(now=T0) == 0  # declared now: nothing before it fires
    assert fire_due_ticks(now=T0 + timedelta(seconds=29)) == 0
    assert fire_due_ticks(now=T0 + timedelta(seconds=31)) == 1
    assert fire_due_ticks(now=T0 + timedelta(seconds=45)) == 0  # the same tick: once
    tick = datetime(2026, 6, 1, 12, 1, tzinfo=UTC)
    assert fired_ticks(key) == [tick]
    record = EventRecord.objects.get()
    assert record.payload == {"tick": clock.normalize(tick).isoformat()}  # as USE_TZ says
    assert aware(record.occurred_at) == tick
    assert DeliveryRecord.objects.filter(receiver_key="tests.report_mailer").count() == 1
    row = ScheduleRecord.objects.get(key=key)
    assert aware(row.last_tick_at) == tick
    assert aware(row.next_tick_at) == tick + timedelta(minutes=1)


def test_a_function_that_raises_records_the_tick_failed_and_the_schedule_goes_on() -> None:
    calls = []

    @recurring(every=timedelta(minutes=1), key="tests.flaky")
    def flaky(tick: datetime) -> ReportDue:
        calls.append(tick)
        if len(calls) == 1:
            raise RuntimeError("the report server is down")
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=T0)
    assert fire_due_ticks(now=T0 + timedelta(minutes=1)) == 0
    failed = TickRecord.objects.get(schedule_key="tests.flaky")
    assert failed.status == TickStatus.FAILED
    assert "RuntimeError: the report server is down" in failed.reason
    assert not EventRecord.objects.exists()
    assert fire_due_ticks(now=T0 + timedelta(minutes=1)) == 0  # not retried
    assert fire_due_ticks(now=T0 + timedelta(minutes=2)) == 1
    assert len(calls) == 2


def test_a_function_returning_no_event_records_the_tick_failed() -> None:
    @recurring(every=timedelta(minutes=1), key="tests.none")
    def nothing(tick: datetime) -> None:
        return None

    fire_due_ticks(now=T0)
    fire_due_ticks(now=T0 + timedelta(minutes=1))
    failed = TickRecord.objects.get(schedule_key="tests.none")
    assert failed.status == TickStatus.FAILED
    assert "not an instance of an @event class" in failed.reason


def test_a_plain_function_returning_an_awaitable_records_the_tick_failed() -> None:
    async def later() -> ReportDue:
        return ReportDue(tick="")

    @recurring(every=timedelta(minutes=1), key="tests.awaitable")
    def sneaky(tick: datetime) -> ReportDue:
        return later()  # type: ignore[return-value]

    fire_due_ticks(now=T0)
    fire_due_ticks(now=T0 + timedelta(minutes=1))
    failed = TickRecord.objects.get(schedule_key="tests.awaitable")
    assert failed.status == TickStatus.FAILED
    assert "returned an awaitable" in failed.reason


def test_a_tick_fired_inside_a_transaction_that_rolls_back_is_not_lost() -> None:
    key = every_minute()
    fire_due_ticks(now=T0)
    with pytest.raises(RuntimeError), transaction.atomic():
        fire_due_ticks(now=T0 + timedelta(minutes=1))
        raise RuntimeError("crash after firing, before commit")
    assert fired_ticks(key) == []
    assert not EventRecord.objects.exists()
    assert fire_due_ticks(now=T0 + timedelta(minutes=1)) == 1
    assert fired_ticks(key) == [datetime(2026, 6, 1, 12, 1, tzinfo=UTC)]


# Catch-up after an outage ------------------------------------------------------

HOURLY_T0 = datetime(2026, 6, 1, 10, 30, tzinfo=UTC)
BACK = datetime(2026, 6, 1, 14, 30, tzinfo=UTC)  # 11:00, 12:00, 13:00 and 14:00 missed


def hourly(**options: object) -> str:
    @recurring(every=timedelta(hours=1), key="tests.hourly", **options)  # type: ignore[arg-type]
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=HOURLY_T0)
    return "tests.hourly"


def hours(*values: int) -> list[datetime]:
    return [datetime(2026, 6, 1, h, tzinfo=UTC) for h in values]


def skipped_runs(key: str) -> list[tuple[datetime, datetime, str]]:
    return [
        (aware(first), aware(last), reason)
        for first, last, reason in TickRecord.objects.filter(
            schedule_key=key, status=TickStatus.SKIPPED
        ).values_list("skipped_from", "tick", "reason")
    ]


def test_catch_up_latest_fires_the_newest_missed_tick_and_records_the_rest_skipped() -> None:
    key = hourly()
    assert fire_due_ticks(now=BACK) == 1
    assert fired_ticks(key) == hours(14)
    [(first, last, reason)] = skipped_runs(key)
    assert (first, last) == (hours(11)[0], hours(13)[0])
    assert "catch_up='latest'" in reason
    assert fire_due_ticks(now=BACK + timedelta(hours=1)) == 1  # 15:00, on time
    assert fired_ticks(key) == hours(14, 15)


def test_catch_up_all_fires_each_missed_tick_oldest_first() -> None:
    key = hourly(catch_up="all")
    assert fire_due_ticks(now=BACK) == 4
    assert fired_ticks(key) == hours(11, 12, 13, 14)
    assert event_ticks() == [clock.normalize(t).isoformat() for t in hours(11, 12, 13, 14)]
    ids = list(EventRecord.objects.order_by("pk").values_list("payload", flat=True))
    assert [p["tick"] for p in ids] == [
        clock.normalize(t).isoformat() for t in hours(11, 12, 13, 14)
    ]
    assert skipped_runs(key) == []


def test_catch_up_all_fires_at_most_its_limit_the_newest() -> None:
    key = hourly(catch_up="all", catch_up_limit=2)
    assert fire_due_ticks(now=BACK) == 2
    assert fired_ticks(key) == hours(13, 14)
    [(first, last, reason)] = skipped_runs(key)
    assert (first, last) == (hours(11)[0], hours(12)[0])
    assert "catch_up_limit=2" in reason


def test_catch_up_none_fires_no_missed_tick_then_the_next_on_time() -> None:
    key = hourly(catch_up="none")
    assert fire_due_ticks(now=BACK) == 0
    assert fired_ticks(key) == []
    [(first, last, reason)] = skipped_runs(key)
    assert (first, last) == (hours(11)[0], hours(14)[0])
    assert "tolerance" in reason
    assert fire_due_ticks(now=datetime(2026, 6, 1, 15, 0, 20, tzinfo=UTC)) == 1
    assert fired_ticks(key) == hours(15)


def test_a_tick_older_than_the_tolerance_is_skipped_under_any_policy() -> None:
    key = hourly(catch_up="all", tolerance=timedelta(minutes=90))
    assert fire_due_ticks(now=BACK) == 2  # 13:00 and 14:00 are within 90 minutes
    assert fired_ticks(key) == hours(13, 14)
    [(first, last, _)] = skipped_runs(key)
    assert (first, last) == (hours(11)[0], hours(12)[0])


def test_a_changed_schedule_fires_no_tick_of_its_new_definition_from_before_the_change() -> None:
    """Hourly until 11:30, then every minute with catch_up='all': the new definition's
    ticks before 11:30 never came due, so neither fires nor is recorded skipped."""
    key = hourly(catch_up="all")
    assert fire_due_ticks(now=datetime(2026, 6, 1, 11, 0, 5, tzinfo=UTC)) == 1
    schedules.remove(key)
    every_minute(key=key, catch_up="all")
    assert fire_due_ticks(now=datetime(2026, 6, 1, 11, 30, tzinfo=UTC)) == 0  # re-timed
    assert fire_due_ticks(now=datetime(2026, 6, 1, 11, 31, 5, tzinfo=UTC)) == 1
    assert fired_ticks(key) == hours(11) + [datetime(2026, 6, 1, 11, 31, tzinfo=UTC)]
    assert skipped_runs(key) == []


def test_a_schedule_changed_while_paused_records_only_its_new_ticks_skipped() -> None:
    key = hourly()
    pause_schedule(key, now=datetime(2026, 6, 1, 10, 40, tzinfo=UTC))
    schedules.remove(key)
    every_minute(key=key)
    fire_due_ticks(now=datetime(2026, 6, 1, 11, 30, tzinfo=UTC))  # changed, still paused
    assert fire_due_ticks(now=datetime(2026, 6, 1, 11, 40, tzinfo=UTC)) == 0
    assert resume_schedule(key, now=datetime(2026, 6, 1, 11, 40, 30, tzinfo=UTC))
    [(first, last, reason)] = skipped_runs(key)
    assert (first, last) == (
        datetime(2026, 6, 1, 11, 31, tzinfo=UTC),
        datetime(2026, 6, 1, 11, 40, tzinfo=UTC),
    )
    assert "paused" in reason


# Cron and daylight saving time ------------------------------------------------


def cron_ticks(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    @recurring(cron=expression, timezone=zone, key="tests.cron", catch_up="all")
    def build(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    fire_due_ticks(now=start)
    moment = start
    while moment < end:
        moment += timedelta(minutes=15)
        fire_due_ticks(now=moment)
    return [t.astimezone(ZoneInfo(zone)) for t in fired_ticks("tests.cron")]


@pytest.mark.parametrize(
    ("zone", "day"),
    [("Europe/Paris", datetime(2026, 3, 29)), ("America/New_York", datetime(2026, 3, 8))],
)
def test_spring_forward_a_local_time_that_does_not_exist_is_skipped(
    zone: str, day: datetime
) -> None:
    tz = ZoneInfo(zone)
    start = (day - timedelta(days=1)).replace(hour=12, tzinfo=tz)
    end = (day + timedelta(days=1)).replace(hour=12, tzinfo=tz)
    ticks = cron_ticks("30 2 * * *", zone, start, end)
    # 02:30 does not exist on the day the clocks go forward: no tick that day.
    assert [t.date() for t in ticks] == [(day + timedelta(days=1)).date()]
    assert [(t.hour, t.minute) for t in ticks] == [(2, 30)]
    hourly = cron_ticks_hourly(zone, start, end)
    wall = [t.strftime("%d %H:%M") for t in hourly if t.date() == day.date()]
    assert "02:00" not in " ".join(w.split()[1] for w in wall)
    assert len(wall) == 23  # 24 wall hours, one of which never happens


def cron_ticks_hourly(zone: str, start: datetime, end: datetime) -> list[datetime]:
    schedules.remove("tests.cron")
    TickRecord.objects.all().delete()
    ScheduleRecord.objects.all().delete()
    return cron_ticks("0 * * * *", zone, start, end)


@pytest.mark.parametrize(
    ("zone", "day", "repeated"),
    [
        ("Europe/Paris", datetime(2026, 10, 25), 2),
        ("America/New_York", datetime(2026, 11, 1), 1),
    ],
)
def test_fall_back_a_local_time_that_happens_twice_fires_once(
    zone: str, day: datetime, repeated: int
) -> None:
    tz = ZoneInfo(zone)
    start = (day - timedelta(days=1)).replace(hour=12, tzinfo=tz)
    end = (day + timedelta(days=1)).replace(hour=12, tzinfo=tz)
    expression = f"30 {repeated} * * *"
    ticks = cron_ticks(expression, zone, start, end)
    on_the_day = [t for t in ticks if t.date() == day.date()]
    assert [(t.hour, t.minute, t.fold) for t in on_the_day] == [(repeated, 30, 0)]
    assert len(ticks) == 2  # the day itself and the next
    hourly = cron_ticks_hourly(zone, start, end)
    wall = [t.strftime("%H:%M") for t in hourly if t.date() == day.date()]
    assert len(wall) == 24 and len(set(wall)) == 24  # 25 hours long, each wall hour once


def test_cron_ticks_are_handed_over_in_the_schedules_zone() -> None:
    seen: list[datetime] = []

    @recurring(cron="0 6 * * MON-FRI", timezone="Europe/Paris", key="tests.weekday")
    def weekday(tick: datetime) -> ReportDue:
        seen.append(tick)
        return ReportDue(tick=tick.isoformat())

    friday_noon = datetime(2026, 6, 5, 12, tzinfo=UTC)
    fire_due_ticks(now=friday_noon)
    fire_due_ticks(now=friday_noon + timedelta(days=3))  # Monday noon: Monday 06:00 fires
    assert [t.isoformat() for t in seen] == ["2026-06-08T06:00:00+02:00"]


# Pause and resume --------------------------------------------------------------


def test_a_paused_schedule_fires_nothing_and_resumes_from_its_next_tick() -> None:
    key = every_minute()
    fire_due_ticks(now=T0)
    assert pause_schedule(key, now=T0) is True
    assert pause_schedule(key, now=T0) is False
    assert fire_due_ticks(now=T0 + timedelta(minutes=10)) == 0
    assert resume_schedule(key, now=T0 + timedelta(minutes=10)) is True
    assert resume_schedule(key, now=T0 + timedelta(minutes=10)) is False
    [(first, last, reason)] = skipped_runs(key)
    assert (first, last) == (
        datetime(2026, 6, 1, 12, 1, tzinfo=UTC),
        datetime(2026, 6, 1, 12, 10, tzinfo=UTC),
    )
    assert "paused" in reason
    assert fire_due_ticks(now=T0 + timedelta(minutes=10, seconds=40)) == 1
    assert fired_ticks(key) == [datetime(2026, 6, 1, 12, 11, tzinfo=UTC)]


def test_pausing_an_unknown_schedule_names_the_known_ones() -> None:
    every_minute()
    with pytest.raises(ValueError, match="tests.every_minute"):
        pause_schedule("tests.nope")


# The relay's look --------------------------------------------------------------


def test_looking_for_due_ticks_is_one_query_whatever_the_schedules_and_past_ticks() -> None:
    from django_domain_events.delivery.ticks import Ticker

    for n in range(30):

        @recurring(every=timedelta(days=1), key=f"tests.many_{n}")
        def build(tick: datetime) -> ReportDue:
            return ReportDue(tick=tick.isoformat())

    ticker = Ticker()
    ticker.look()  # the first look gives rows to the schedules declared
    TickRecord.objects.bulk_create(
        TickRecord(
            schedule_key="tests.many_0",
            tick=clock.normalize(T0 - timedelta(minutes=m)),
            status=TickStatus.FIRED,
            recorded_at=clock.normalize(T0),
        )
        for m in range(1, 500)
    )
    ticker._next_look = 0.0
    with CaptureQueriesContext(connection) as queries:
        assert ticker.look() == 0
    assert len(queries) == 1
    assert "ticktime" not in queries[0]["sql"].lower()
    assert "tickrecord" not in queries[0]["sql"].lower()


def test_a_changed_definition_ticks_from_the_change_not_before_it() -> None:
    hourly(catch_up="all")  # cursor at 10:30, hourly
    schedules.remove("tests.hourly")

    @recurring(every=timedelta(minutes=15), key="tests.hourly", catch_up="all")
    def quarterly(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    changed = datetime(2026, 6, 1, 10, 50, tzinfo=UTC)
    fire_due_ticks(now=changed)  # a relay with the new code starts at 10:50
    assert fire_due_ticks(now=datetime(2026, 6, 1, 11, 5, tzinfo=UTC)) == 1
    assert fired_ticks("tests.hourly") == [datetime(2026, 6, 1, 11, 0, tzinfo=UTC)]
    assert skipped_runs("tests.hourly") == []


def test_an_idle_relay_sleeps_until_the_next_tick_not_a_second_at_a_time() -> None:
    from django_domain_events.delivery.ticks import Ticker

    @recurring(every=timedelta(days=1), key="tests.daily")
    def daily(tick: datetime) -> ReportDue:
        return ReportDue(tick=tick.isoformat())

    ticker = Ticker()
    assert ticker.seconds_to_next() is None  # nothing known before the first look
    ticker.look()
    left = ticker.seconds_to_next()
    assert left is not None and left > 1.0  # the next tick is later today, not in a second


def test_check_warns_about_schedules_under_use_tz_false_in_a_zone_whose_clocks_go_back() -> None:
    from django.core.checks import run_checks
    from django.test import override_settings

    every_minute()
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        [warning] = [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W006"]
    assert "Set USE_TZ = True" in (warning.hint or "")
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Tokyo"):
        assert not [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W006"]
    with override_settings(USE_TZ=True, TIME_ZONE="Europe/Paris"):
        assert not [e for e in run_checks(databases=[]) if e.id == "django_domain_events.W006"]


# Races, forced: another relay or an operator acts between the read and the move ------


def test_a_relay_that_loses_the_cursor_to_another_between_read_and_move_fires_nothing() -> None:
    from tests.support import just_before

    key = every_minute()
    fire_due_ticks(now=T0)
    later = T0 + timedelta(minutes=1)
    other: list[int] = []
    with just_before("UPDATE", ScheduleRecord, lambda: other.append(fire_due_ticks(now=later))):
        assert fire_due_ticks(now=later) == 0  # the other relay moved the cursor first
    assert other == [1]
    assert fired_ticks(key) == [datetime(2026, 6, 1, 12, 1, tzinfo=UTC)]
    assert EventRecord.objects.count() == 1


def test_a_pause_between_a_relays_read_and_its_move_wins() -> None:
    from tests.support import just_before

    key = every_minute()
    fire_due_ticks(now=T0)
    later = T0 + timedelta(minutes=1)
    with just_before("UPDATE", ScheduleRecord, lambda: pause_schedule(key, now=later)):
        assert fire_due_ticks(now=later) == 0
    assert fired_ticks(key) == []
    assert ScheduleRecord.objects.get(key=key).paused_at is not None
    assert fire_due_ticks(now=later + timedelta(minutes=5)) == 0  # still paused


def test_cron_without_the_cron_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if not installed
    with pytest.raises(ImportError, match=r"django-domain-outbox\[cron\]"):
        recurring(cron="0 6 * * *")
    assert schedules.get("tests.build") is None
