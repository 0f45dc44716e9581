"""Recurring schedules: ``@recurring``, the schedules declared, and when each one ticks.

A schedule is a cron expression read in a time zone, or a fixed interval, and a
function of the tick that builds the event to fire. The relays fire each tick once
(``tick_firing.py``); this module only declares schedules and answers "which ticks fall in
this stretch of time", which is all the policies need.

Cron expressions are evaluated by ``cronsim`` (the ``cron`` extra) on the zone's wall
clock, then placed on the time line here: a local time that does not exist (spring
forward) is skipped, and one that exists twice (fall back) ticks once, at its first
occurrence. An interval ticks at whole multiples of itself since the Unix epoch (UTC),
so ``every=timedelta(minutes=5)`` ticks at :00, :05, ... on every relay.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.utils import timezone as django_timezone

from . import clock
from .declare import default_key, dotted_name, registry

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "all", "none")
#: How many missed ticks ``catch_up="all"`` fires at most, unless ``catch_up_limit`` says.
DEFAULT_CATCH_UP_LIMIT = 100
#: How late a tick of a ``catch_up="none"`` schedule may fire, unless ``tolerance`` says.
ON_TIME = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Schedule:
    """One declared schedule: when it ticks and what each tick fires.

    Exactly one of ``cron`` (with ``timezone``, an IANA name; ``None`` means Django's
    ``TIME_ZONE``) and ``every`` is set.
    """

    key: str
    func: Callable[[datetime], Any]
    cron: str | None
    timezone: str | None
    every: timedelta | None
    catch_up: str
    catch_up_limit: int
    tolerance: timedelta | None
    event_type: type | None

    @property
    def zone(self) -> ZoneInfo:
        """The zone cron fields are read in, and the zone ticks are handed over in."""
        if self.every is not None:
            return ZoneInfo("UTC")
        return ZoneInfo(self.timezone or settings.TIME_ZONE or "UTC")

    @property
    def spec(self) -> str:
        """The schedule in one line, stored beside its cursor to notice a changed one."""
        if self.cron is not None:
            return f"cron {self.cron} {self.zone.key}"
        return f"every {self.every}"

    @property
    def late_limit(self) -> timedelta | None:
        """How late a tick may still fire; older ones are skipped. ``None``: no limit."""
        if self.tolerance is not None:
            return self.tolerance
        return ON_TIME if self.catch_up == "none" else None

    def build(self, tick: datetime) -> Any:
        """The event of ``tick`` (a UTC instant), built by the declared function, which is
        given the tick in the schedule's zone; an ``every=`` tick follows ``USE_TZ``
        (naive local time under ``False``), so the function can store it."""
        handed = tick.astimezone(self.zone)
        return self.func(clock.normalize(handed) if self.every is not None else handed)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, as an aware UTC datetime."""
        return next(self._forward(moment))

    def latest(self, after: datetime | None, until: datetime, count: int) -> list[datetime]:
        """Up to ``count`` ticks in ``(after, until]``, newest first."""
        found: list[datetime] = []
        if count < 1:
            return found
        for tick in self._backward(until):
            if after is not None and tick <= after:
                break
            found.append(tick)
            if len(found) == count:
                break
        return found

    def _forward(self, moment: datetime) -> Iterator[datetime]:
        moment = moment.astimezone(UTC)
        if self.every is not None:
            step = self.every
            n = (moment - EPOCH) // step + 1
            while True:
                yield EPOCH + n * step
                n += 1
        assert self.cron is not None
        zone = self.zone
        local = moment.astimezone(zone).replace(tzinfo=None)
        for wall in _cronsim(self.cron, local, reverse=False):
            instant = _instant(wall, zone)
            if instant is not None and instant > moment:
                yield instant

    def _backward(self, moment: datetime) -> Iterator[datetime]:
        """Ticks at or before ``moment``, newest first."""
        moment = moment.astimezone(UTC)
        if self.every is not None:
            step = self.every
            n = (moment - EPOCH) // step
            while n >= 0:
                yield EPOCH + n * step
                n -= 1
            return
        assert self.cron is not None
        zone = self.zone
        # cronsim's reverse walk starts strictly before its start: start a minute later,
        # at a whole minute, so a tick at ``moment`` itself is found.
        local = moment.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        for wall in _cronsim(self.cron, local + timedelta(minutes=1), reverse=True):
            instant = _instant(wall, zone)
            if instant is not None and instant <= moment:
                yield instant


def _instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant of a wall-clock time in ``zone``: the first of two in the repeated
    hour, ``None`` in the hour that is skipped."""
    aware = wall.replace(tzinfo=zone, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant


def _cronsim(expression: str, start: datetime, *, reverse: bool) -> Iterator[datetime]:
    from cronsim import CronSim  # the cron extra; checked when the schedule was declared

    return iter(CronSim(expression, start, reverse=reverse))


class Schedules:
    """The schedules declared with ``@recurring``, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Schedule] = {}

    def add(self, schedule: Schedule) -> None:
        """Register ``schedule``; a second one under its key is refused, unless it is the
        same function declared again (a module imported twice)."""
        existing = self._by_key.get(schedule.key)
        if existing is not None and dotted_name(existing.func) != dotted_name(schedule.func):
            raise ValueError(
                f"@recurring key {schedule.key!r} is taken by {dotted_name(existing.func)}; "
                f"give {dotted_name(schedule.func)} another key (key=...)."
            )
        self._by_key[schedule.key] = schedule

    def get(self, key: str) -> Schedule | None:
        """The schedule declared under ``key``, or None."""
        return self._by_key.get(key)

    def all(self) -> list[Schedule]:
        """Every schedule, sorted by key."""
        return [self._by_key[key] for key in sorted(self._by_key)]

    def keys(self) -> list[str]:
        """Every key, sorted."""
        return sorted(self._by_key)

    def remove(self, key: str) -> None:
        """Forget a schedule (for tests)."""
        self._by_key.pop(key, None)


schedules = Schedules()


def recurring(
    *,
    cron: str | None = None,
    timezone: str | None = None,
    every: timedelta | None = None,
    key: str | None = None,
    catch_up: CatchUp = "latest",
    catch_up_limit: int | None = None,
    tolerance: timedelta | None = None,
) -> Callable[[F], F]:
    """Fire the event ``func(tick)`` returns once per tick of a schedule, from the relays.

    ``cron`` is a five-field expression read in ``timezone`` (an IANA name; Django's
    ``TIME_ZONE`` when omitted); ``every`` a fixed interval of at least a second. The
    function is given each tick as an aware datetime (in the zone for cron, UTC for an
    interval) and returns an instance of an ``@event`` class, fired with ``fire()`` as
    of the tick. After ticks were missed (no relay ran), ``catch_up`` says which fire:
    ``"latest"`` the newest only, ``"all"`` each of them oldest first (at most
    ``catch_up_limit``, default 100, the newest), ``"none"`` only a tick reached on time.
    A tick older than ``tolerance`` when reached is skipped (default: no limit, one
    minute for ``"none"``). The key defaults to ``<app_label>.<function name>``.
    """
    _check_when(cron, timezone, every)
    _check_catch_up(catch_up, catch_up_limit)
    if tolerance is not None and (
        not isinstance(tolerance, timedelta) or tolerance <= timedelta(0)
    ):
        raise ValueError(f"@recurring(tolerance=) must be a positive timedelta, not {tolerance!r}.")
    if key is not None and (not isinstance(key, str) or not key or len(key) > 255):
        raise ValueError(
            f"@recurring(key=) must be a non-empty string of <= 255 chars, not {key!r}."
        )

    def declare(func: F) -> F:
        _check_function(func)
        schedule = Schedule(
            key=key if key is not None else default_key(func),
            func=func,
            cron=" ".join(cron.split()) if cron is not None else None,
            timezone=timezone,
            every=every,
            catch_up=catch_up,
            catch_up_limit=catch_up_limit or DEFAULT_CATCH_UP_LIMIT,
            tolerance=tolerance,
            event_type=_returned_event(func),
        )
        if len(schedule.key) > 255:
            raise ValueError(
                f"@recurring key {schedule.key!r} is longer than 255 chars; pass a shorter key=."
            )
        schedules.add(schedule)
        return func

    return declare


def _check_catch_up(catch_up: object, limit: object) -> None:
    if catch_up not in CATCH_UP_POLICIES:
        raise ValueError(
            f"@recurring(catch_up={catch_up!r}) is not a policy; use 'latest' (the newest "
            "missed tick fires), 'all' (each fires, up to catch_up_limit) or 'none'."
        )
    if limit is None:
        return
    if catch_up != "all":
        raise ValueError(
            f"@recurring(catch_up_limit={limit!r}) bounds catch_up='all' only; "
            f"drop it or set catch_up='all' (catch_up is {catch_up!r})."
        )
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"@recurring(catch_up_limit=) must be a whole number >= 1, not {limit!r}.")
    if limit < 1:
        raise ValueError(
            f"@recurring(catch_up_limit=) must be >= 1, not {limit!r}; use "
            "catch_up='latest' or 'none' to fire fewer missed ticks."
        )


def _check_when(cron: object, zone: object, every: object) -> None:
    if (cron is None) == (every is None):
        raise TypeError(
            "@recurring needs exactly one of cron= (a five-field cron expression) and every= "
            "(a timedelta)."
        )
    if every is not None:
        if not isinstance(every, timedelta) or every < timedelta(seconds=1):
            raise ValueError(
                f"@recurring(every=) must be a timedelta of at least one second, not {every!r}."
            )
        if zone is not None:
            raise ValueError(
                "@recurring(timezone=) applies to cron= only: an interval ticks at the same "
                "instants in every zone. For wall-clock times, write a cron expression."
            )
        return
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ValueError(
            f"@recurring(cron={cron!r}) must have five fields: minute hour day-of-month month "
            "day-of-week, e.g. '0 6 * * MON-FRI'."
        )
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as error:
        raise ImportError(
            "@recurring(cron=) evaluates cron expressions with cronsim: "
            "pip install 'django-domain-outbox[cron]'."
        ) from error
    try:
        CronSim(cron, datetime(2000, 1, 1))
    except CronSimError as error:
        raise ValueError(
            f"@recurring(cron={cron!r}) is not a valid cron expression: {error}."
        ) from None
    if zone is not None:
        if not isinstance(zone, str):
            raise TypeError(f"@recurring(timezone=) must be an IANA zone name, not {zone!r}.")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"@recurring(timezone={zone!r}) is not a known time zone; use an IANA name "
                "such as 'Europe/Paris' or 'America/New_York'."
            ) from None


def _check_function(func: object) -> None:
    if not callable(func):
        raise TypeError(f"@recurring decorates a function of the tick, not {func!r}.")
    if inspect.iscoroutinefunction(func):
        raise TypeError(
            f"@recurring function {dotted_name(func)} is async; it runs inside the tick's "
            "transaction, so write it as a plain function returning the event."
        )
    try:
        inspect.signature(func).bind(datetime.now(UTC))
    except TypeError:
        raise TypeError(
            f"@recurring function {dotted_name(func)} must take one argument, the tick "
            "(a datetime), and return the event to fire."
        ) from None
    except ValueError:  # no signature to inspect (a builtin): let the call tell
        pass


def _returned_event(func: Callable[..., Any]) -> type | None:
    """The ``@event`` class the function says it returns, for the catalogue."""
    try:
        returned = typing.get_type_hints(func).get("return")
    except Exception:
        return None
    if isinstance(returned, type) and registry.event_for_class(returned) is not None:
        return returned
    return None


def aware(value: datetime) -> datetime:
    """A stored datetime as an aware UTC one: naive values are local time (``USE_TZ=False``)."""
    if django_timezone.is_naive(value):
        value = django_timezone.make_aware(value)
    return value.astimezone(UTC)
