"""Recurring schedules with real relay processes (issue 15): each tick fires once.

The relays are tests/procs/relay.py children; their clock (tests.procs.recurring) runs a
simulated time line shared by every child, restarted or not, so a day of one-minute
ticks passes in well under a minute. Exactly once is read from the rows: the tick rows
(unique per schedule and tick), the events, the deliveries and the receiver's own rows
(unique per delivery).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from django_domain_events import DeliveryStatus, clock, fire_due_ticks, run_relay
from django_domain_events.models import (
    DeliveryRecord,
    EventRecord,
    ScheduleRecord,
    TickRecord,
    TickStatus,
)
from django_domain_events.recurrence import aware
from tests.app.models import Delivered
from tests.conftest import needs_several_relays, start_child, start_together, wait_for
from tests.procs.recurring import (
    MINUTELY_KEY,
    REPORT_KEY,
    clock_env,
    declare_minutely,
    declare_report_receiver,
    simulated_now,
)

pytestmark = pytest.mark.django_db(transaction=True)

needs_server = pytest.mark.skipif(
    os.environ.get("DDE_TEST_DB", "sqlite") == "sqlite",
    reason="needs concurrent writers: runs on PostgreSQL and MariaDB",
)

DAY = datetime(2026, 6, 1, tzinfo=UTC)
SYNC = DAY - timedelta(seconds=30)  # the schedule's cursor starts here: DAY is its first tick
TICKS = 1440  # a day of one-minute ticks: DAY, DAY + 1 min, ... DAY + 23:59
LAST = DAY + timedelta(minutes=TICKS - 1)
END = LAST + timedelta(seconds=30)  # the children's clock stops here


def finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def fired_ticks() -> list[datetime]:
    return [
        aware(t)
        for t in TickRecord.objects.filter(schedule_key=MINUTELY_KEY)
        .order_by("tick")
        .values_list("tick", flat=True)
    ]


def minutes(count: int) -> list[datetime]:
    return [DAY + timedelta(minutes=m) for m in range(count)]


def assert_fired_once(ticks: list[datetime]) -> None:
    """Each tick has one fired row, one event as of the tick, one delivery that ran once."""
    rows = TickRecord.objects.filter(schedule_key=MINUTELY_KEY)
    assert [aware(t) for t in rows.order_by("tick").values_list("tick", flat=True)] == ticks
    assert set(rows.values_list("status", flat=True)) == {TickStatus.FIRED}
    events = EventRecord.objects.filter(pk__in=rows.values("event_id"))
    assert events.count() == EventRecord.objects.count() == len(ticks)
    # The payload's tick is as the function was given it (naive local under USE_TZ=False).
    assert sorted(
        (aware(at), aware(datetime.fromisoformat(p["tick"])))
        for at, p in events.values_list("occurred_at", "payload")
    ) == [(t, t) for t in ticks]
    deliveries = DeliveryRecord.objects.filter(receiver_key=REPORT_KEY)
    assert deliveries.count() == len(ticks)
    assert set(deliveries.values_list("status", flat=True)) == {DeliveryStatus.SUCCEEDED}
    ran = Delivered.objects.filter(receiver_key=REPORT_KEY)
    assert sorted(ran.values_list("delivery_id", flat=True)) == sorted(
        deliveries.values_list("pk", flat=True)
    )


# 1. Four relays, a simulated day, kills and restarts ------------------------------

SPEED = 2400.0  # simulated seconds per real second: the day in 36 real seconds
DAY_REAL = (END - SYNC).total_seconds() / SPEED
BOOT = 5.0  # real seconds the children get to boot before the clock starts
LEASE_REAL = 4.0  # a dead relay's rows are taken over this many real seconds later
DOWN_REAL = 4.0  # every relay is down this long: 160 simulated minutes


class Fleet:
    """Relay children in a fixed number of slots, started, killed and restarted."""

    def __init__(self, env: dict[str, str], size: int) -> None:
        self.env = env
        self.dir = Path(tempfile.mkdtemp(prefix="dde-fleet-"))
        self.slots: list[subprocess.Popen[str] | None] = [None] * size
        self.ready: dict[int, Path] = {}  # pid -> its ready file
        self.gone: list[tuple[subprocess.Popen[str], int]] = []  # killed, and by which signal
        self.started = 0

    def start(self, slot: int) -> None:
        ready = self.dir / f"ready-{self.started}"
        self.started += 1
        process = start_child("relay", env={**self.env, "DDE_READY_FILE": str(ready)})
        self.slots[slot] = process
        self.ready[process.pid] = ready

    def settled(self, slot: int) -> bool:
        """Running its relay (signals handled) for 1.5 s at least."""
        process = self.slots[slot]
        if process is None or process.poll() is not None:
            return False
        ready = self.ready[process.pid]
        return ready.exists() and ready.stat().st_mtime < time.time() - 1.5

    def kill(self, slot: int, signum: int) -> None:
        process = self.slots[slot]
        assert process is not None
        process.send_signal(signum)
        self.gone.append((process, signum))
        self.slots[slot] = None

    def running(self) -> list[subprocess.Popen[str]]:
        return [p for p in self.slots if p is not None]


def chaos(fleet: Fleet, rng: random.Random, until: float, restarts: dict[int, float]) -> None:
    """Kill a settled relay every 1.5-3 real seconds, SIGKILL or SIGTERM at random, and
    restart each 0.2-1.5 s later, until the real instant ``until`` (time.time())."""
    next_kill = time.time() + rng.uniform(1.5, 3.0)
    while time.time() < until:
        for slot, at in list(restarts.items()):
            if time.time() >= at:
                fleet.start(slot)
                del restarts[slot]
        if time.time() >= next_kill:
            victims = [s for s in range(len(fleet.slots)) if fleet.settled(s)]
            if victims:
                slot = rng.choice(victims)
                fleet.kill(slot, rng.choice([signal.SIGKILL, signal.SIGTERM]))
                restarts[slot] = time.time() + rng.uniform(0.2, 1.5)
            next_kill = time.time() + rng.uniform(1.5, 3.0)
        time.sleep(0.02)


@needs_several_relays
def test_four_relays_fire_each_tick_of_a_day_once_through_kills_and_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1440 one-minute ticks in ~36 real seconds, four relays killed (SIGKILL or SIGTERM)
    and restarted at random moments, all four down together for 160 simulated minutes."""
    declare_minutely()
    declare_report_receiver()
    assert fire_due_ticks(now=SYNC) == 0  # the cursor starts just before DAY
    seed = int(os.environ.get("DDE_SOAK_SEED") or time.time())
    rng = random.Random(seed)
    tick_log = tmp_path / "ticks"
    epoch = time.time() + BOOT
    env = {
        "DDE_SCHEDULE": "minutely",
        "DDE_RECEIVERS": "report",
        "DDE_TICK_LOG": str(tick_log),
        "DDE_SETTINGS_JSON": json.dumps({"LEASE_SECONDS": LEASE_REAL * SPEED}),
        **clock_env(SYNC, speed=SPEED, epoch=epoch, end=END),
    }
    fleet = Fleet(env, 4)
    restarts: dict[int, float] = {}
    try:
        for slot in range(4):
            fleet.start(slot)
        chaos(fleet, rng, epoch + 0.35 * DAY_REAL, restarts)
        # Every relay down at once: SIGKILL for two, SIGTERM for the others.
        restarts.clear()
        for n, slot in enumerate(rng.sample(range(4), 4)):
            if fleet.slots[slot] is not None:
                settled = fleet.settled(slot)
                fleet.kill(slot, signal.SIGTERM if settled and n >= 2 else signal.SIGKILL)
        wait_for(lambda: all(p.poll() is not None for p, _ in fleet.gone), 30, "all down")
        down_from = simulated_now(SYNC, epoch, SPEED, END)
        time.sleep(DOWN_REAL)
        down_until = simulated_now(SYNC, epoch, SPEED, END)
        for slot in range(4):
            fleet.start(slot)
        # The last kill leaves its rows time to lapse before the clock stops at END.
        chaos(fleet, rng, epoch + DAY_REAL - 1.5 * LEASE_REAL, restarts)
        for slot in list(restarts):
            fleet.start(slot)
        try:
            wait_for(lambda: len(fired_ticks()) >= TICKS, epoch + DAY_REAL + 60 - time.time(), "")
        except AssertionError:
            lost = sorted(set(minutes(TICKS)) - set(fired_ticks()))
            message = f"seed {seed}: {len(lost)} ticks never fired: {lost[:3]}..."
            raise AssertionError(message) from None
        delivered = DeliveryRecord.objects.filter(
            receiver_key=REPORT_KEY, status=DeliveryStatus.SUCCEEDED
        )
        wait_for(lambda: delivered.count() >= TICKS, 60, "every delivery")
        took = time.time() - epoch
    finally:
        for process in fleet.running():
            process.send_signal(signal.SIGTERM)
    ended = [(finish(p), signal.SIGTERM) for p in fleet.running()]
    ended += [(finish(p), signum) for p, signum in fleet.gone]
    for (code, _out, err), signum in ended:
        assert code == (-signal.SIGKILL if signum == signal.SIGKILL else 0), (seed, code, err)
        assert "Traceback" not in err and "skipped" not in err, (seed, err)

    # One last relay pass with the clock at the end: nothing is left to fire or deliver.
    monkeypatch.setattr(clock, "now", lambda: clock.normalize(END))
    counts = run_relay(once=True, prune=None)
    assert sum(counts.values()) == 0, counts

    assert_fired_once(minutes(TICKS))
    cursor = ScheduleRecord.objects.get(key=MINUTELY_KEY)
    assert (aware(cursor.last_tick_at), aware(cursor.next_tick_at)) == (
        LAST,
        LAST + timedelta(minutes=1),
    )
    # The ticks that came due while every relay was down fired after the restart.
    recorded = dict(TickRecord.objects.values_list("tick", "recorded_at"))
    late = {aware(t): aware(at) - aware(t) for t, at in recorded.items()}
    missed = [t for t in late if down_from < t <= down_until]
    assert len(missed) >= 0.9 * DOWN_REAL * SPEED / 60, (seed, down_from, len(missed))
    assert all(t + late[t] >= down_until for t in missed), (seed, down_from, down_until)
    # Several relays fired ticks: the pid of each committed tick, from an on_commit hook.
    lines = [line.split() for line in tick_log.read_text().splitlines()]
    assert len({tick for _, tick in lines}) == len(lines)  # no tick committed twice
    by_pid = Counter(pid for pid, _ in lines)
    kills = Counter(signal.Signals(signum).name for _, signum in fleet.gone)
    print(
        f"\nseed {seed}: {TICKS} ticks in {took:.1f} real s; {fleet.started} relays started, "
        f"killed {dict(kills)}; ticks committed by {len(by_pid)} relays "
        f"({sorted(by_pid.values(), reverse=True)}); all down from {down_from:%H:%M} to "
        f"{down_until:%H:%M}: its {len(missed)} ticks fired on the restart, the latest by "
        f"{max(late.values())}; median lateness {sorted(late.values())[TICKS // 2]}"
    )
    assert len(by_pid) >= 3, (seed, by_pid)
    assert sum(kills.values()) >= 8, (seed, kills)


# 2. Racing for the same ticks -------------------------------------------------------

RACERS = 5


@needs_server
def test_relays_racing_for_the_same_ticks_at_the_same_moment_fire_each_once() -> None:
    """Five processes call fire_due_ticks(now=T) at one moment, ten ticks due; then each
    walks the clock on through an hour in 15 s steps, racing for every tick."""
    declare_minutely()
    assert fire_due_ticks(now=SYNC) == 0
    first = DAY + timedelta(minutes=9, seconds=10)  # DAY ... DAY + 9 min are due: 10 ticks
    children = start_together("fire_ticks", [(first.isoformat(), "15", "240")] * RACERS)
    outputs = [finish(child, timeout=120) for child in children]
    assert [code for code, _, _ in outputs] == [0] * RACERS, outputs
    counts = [json.loads(out) for _, out, _ in outputs]
    assert sorted(c[0] for c in counts) == [0] * (RACERS - 1) + [10]  # one winner, all ten
    assert sum(map(sum, counts)) == 70  # and the hour's 60 after them, each by one caller
    ticks = fired_ticks()
    assert ticks == minutes(70)
    assert set(TickRecord.objects.values_list("status", flat=True)) == {TickStatus.FIRED}
    payloads = EventRecord.objects.values_list("payload", flat=True)
    assert sorted(p["tick"] for p in payloads) == [t.isoformat() for t in ticks]
    winners = sum(1 for c in counts if sum(c[1:]))
    print(f"\n{connection.vendor}: {RACERS} racers, the walk's ticks fired by {winners} of them")


# 5. A crash between firing and commit ----------------------------------------------


def test_a_relay_killed_inside_a_ticks_transaction_leaves_nothing_and_its_successor_fires_it(
    tmp_path: Path,
) -> None:
    """The builder holds the tick's transaction open; SIGKILL; nothing of the tick is left;
    a new relay fires it once (and its event is delivered once)."""
    declare_minutely()
    declare_report_receiver()
    assert fire_due_ticks(now=SYNC) == 0
    hold = tmp_path / "hold"
    hold.touch()
    env = {
        "DDE_SCHEDULE": "minutely",
        "DDE_RECEIVERS": "report",
        "DDE_TICK_HOLD": str(hold),
        **clock_env(DAY + timedelta(seconds=10)),  # standing still: the tick of DAY is due
    }
    relay = start_child("relay", env=env)
    held = Path(f"{hold}.held")
    try:
        wait_for(held.exists, 120, "the relay to build the tick")
    finally:  # a relay left running would hold the SQLite file for every later test
        relay.send_signal(signal.SIGKILL)
    # The tick as the function is given it: naive local time under USE_TZ = False.
    assert aware(datetime.fromisoformat(held.read_text())) == DAY
    code, _, err = finish(relay)
    assert code == -signal.SIGKILL, err
    assert not TickRecord.objects.exists()
    assert not EventRecord.objects.exists()
    cursor = ScheduleRecord.objects.get(key=MINUTELY_KEY)
    assert (aware(cursor.last_tick_at), aware(cursor.next_tick_at)) == (SYNC, DAY)

    hold.unlink()
    relay = start_child("relay", env=env)
    try:
        wait_for(lambda: Delivered.objects.exists(), 120, "the successor to fire and deliver")
    finally:
        relay.send_signal(signal.SIGTERM)
    code, _, err = finish(relay)
    assert code == 0, err
    assert_fired_once(minutes(1))
    cursor.refresh_from_db()
    assert (aware(cursor.last_tick_at), aware(cursor.next_tick_at)) == (
        DAY,
        DAY + timedelta(minutes=1),
    )
