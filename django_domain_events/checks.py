"""System checks (``manage.py check``): settings, declarations and rows nobody can deliver.

Each message names what is wrong and its hint says what to do.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings as django_settings
from django.core import checks
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from . import conf
from .declare import registry
from .models import OWED_VALUES, DeliveryRecord


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every problem with ``DJANGO_DOMAIN_EVENTS``, one error each, and a misspelt name."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    found: list[CheckMessage] = [
        Error(problem, hint="See docs/settings.md.", id="django_domain_events.E001")
        for problem in conf.problems(raw)
    ]
    if not hasattr(django_settings, conf.SETTINGS_NAME):
        names = [n for n in dir(django_settings) if n.isupper()]
        for close in difflib.get_close_matches(conf.SETTINGS_NAME, names, n=1, cutoff=0.75):
            found.append(
                Error(
                    f"settings.{close} looks like a misspelling of {conf.SETTINGS_NAME}; "
                    "this package ignores it and runs on its defaults.",
                    hint=f"Rename it to {conf.SETTINGS_NAME}.",
                    id="django_domain_events.E002",
                )
            )
    return found


@register(Tags.compatibility)
def check_brokers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every configured broker that cannot work (bad URL, unknown scheme, options, a
    client library not installed), found without connecting."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    if conf.problems(raw) or not conf.get().BROKERS:
        return []
    from .contrib.brokers.config import brokers, problems  # imports no client library

    found: list[CheckMessage] = [
        Error(problem, hint="See docs/howto-publish.md.", id="django_domain_events.E020")
        for problem in problems()
    ]
    if found:
        return found
    lease = conf.get().LEASE_SECONDS
    for name, config in sorted(brokers().items()):
        # What a relay may wait on the broker for one batch, and the batch claimed ahead
        # meanwhile: the claims by row lock idle that long in their transactions.
        wait = config.connect_timeout + config.confirm_timeout + 5
        if 2 * wait >= lease:
            found.append(
                checks.Warning(
                    f"Broker {name!r} may keep a relay waiting {wait:g}s for one batch "
                    f"(CONNECT_TIMEOUT_SECONDS + CONFIRM_TIMEOUT_SECONDS + 5), twice that "
                    f"for the batch claimed ahead, against LEASE_SECONDS = {lease:g}: on "
                    "PostgreSQL the claims would be cut off mid-wait and the batch sent "
                    "again.",
                    hint="Raise LEASE_SECONDS, or lower the broker's timeouts.",
                    id="django_domain_events.W008",
                )
            )
    return found


@register(Tags.compatibility)
def check_subscriptions(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every subscription naming a broker ``BROKERS`` does not configure: its consumer
    could never start, and ``manage.py check`` says so before a deploy does."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    if conf.problems(raw):
        return []  # E001 names the settings' problem first
    from .contrib.brokers.config import SETTING, raw_setting
    from .inbox import subscriptions

    configured = raw_setting()
    if not isinstance(configured, Mapping):
        return []  # E020 names it
    known = ", ".join(repr(name) for name in sorted(configured, key=str)) or "none"
    some = next(iter(sorted(configured, key=str)), "default")
    return [
        Error(
            f"subscribe() declared the subscription {declared.name!r} on broker "
            f"{declared.broker!r}, which {SETTING} does not configure (configured: {known}).",
            hint=f"In {SETTING}, add {declared.broker!r}: {{'URL': ...}}, or pass "
            f"subscribe(..., broker={some!r}) naming a configured one.",
            id="django_domain_events.E021",
        )
        for declared in subscriptions()
        if declared.broker not in configured
    ]


@register(Tags.compatibility)
def check_wake(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``WAKE="notify"`` needs psycopg 3; under psycopg2 relays poll, and we say so."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    if conf.problems(raw) or conf.get().WAKE != "notify":
        return []
    postgres = [alias for alias in connections if connections[alias].vendor == "postgresql"]
    if not postgres:
        # Without a PostgreSQL database there may be no psycopg at all (it is an extra).
        return []
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if is_psycopg3:
        return []
    return [
        checks.Warning(
            f"Database {alias!r} uses psycopg2, so relays cannot LISTEN and will find new "
            "work only on their poll (POLL_SECONDS).",
            hint="Install psycopg 3: pip install 'django-domain-outbox[postgres]' (or "
            "[postgres-binary] for its prebuilt wheel), or set WAKE='poll' to say polling "
            "is intended.",
            id="django_domain_events.W001",
        )
        for alias in postgres
    ]


@register(Tags.compatibility)
def check_concurrency(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``CONCURRENCY`` above 1 on SQLite: the relay would refuse to start."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    if conf.problems(raw) or conf.get().CONCURRENCY == 1:
        return []
    from .models import database_alias

    alias = database_alias()
    if connections[alias].vendor != "sqlite":
        return []
    return [
        Error(
            f"CONCURRENCY is {conf.get().CONCURRENCY}, but the outbox's database "
            f"({alias!r}) is SQLite, which has a single writer: a relay on it runs one "
            "delivery at a time, and refuses to start with more.",
            hint="Set DJANGO_DOMAIN_EVENTS['CONCURRENCY'] to 1, or move the outbox to "
            "PostgreSQL or MariaDB.",
            id="django_domain_events.E008",
        )
    ]


@register(Tags.compatibility)
def check_declarations(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Receivers of classes that are not events; a codec that cannot rebuild an event."""
    found: list[CheckMessage] = []
    for declared in registry.receivers:
        if not declared.wildcard and registry.event_for_class(declared.event_class) is None:
            found.append(
                Error(
                    f"Receiver {declared.key!r} is declared for "
                    f"{declared.event_class.__qualname__}, which is not a declared event.",
                    hint="Decorate the class with @event, or declare the receiver for an event.",
                    id="django_domain_events.E003",
                )
            )
    if conf.problems(getattr(django_settings, conf.SETTINGS_NAME, {})):
        return found
    from .codec import get_codec

    try:
        codec = get_codec()
    except ImproperlyConfigured as error:
        return [
            *found,
            Error(str(error), hint="Fix the CODEC setting.", id="django_domain_events.E004"),
        ]
    problems = getattr(codec, "problems", None)
    if problems is None:
        return found
    for declared_event in registry.events:
        for problem in problems(declared_event.event_class):
            found.append(
                Error(
                    f"The codec cannot rebuild {declared_event.name}: {problem}",
                    hint="Change the field's type to one the codec supports, or the CODEC.",
                    id="django_domain_events.E005",
                )
            )
    return found


@register(Tags.compatibility)
def check_schedules_without_time_zones(
    app_configs: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Schedules under ``USE_TZ = False`` in a zone whose clocks go back: W006."""
    from .recurrence import schedules

    if django_settings.USE_TZ or not schedules.keys():
        return []
    zone = ZoneInfo(django_settings.TIME_ZONE or "UTC")
    year = datetime.now().year
    winter, summer = datetime(year, 1, 1, tzinfo=zone), datetime(year, 7, 1, tzinfo=zone)
    if winter.utcoffset() == summer.utcoffset():
        return []
    return [
        checks.Warning(
            f"@recurring schedules are declared under USE_TZ = False with TIME_ZONE = "
            f"{django_settings.TIME_ZONE!r}, whose clocks go back once a year. Tick rows "
            "store naive local time, so in the repeated hour a tick of the second pass has "
            "the same time as one of the first and is not fired (a schedule ticking in that "
            "hour, such as every 15 minutes, loses those ticks that night).",
            hint="Set USE_TZ = True (Django's default), or keep the schedules out of that hour.",
            id="django_domain_events.W006",
        )
    ]


@register(Tags.compatibility)
def check_importable_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``AROUND_DELIVERY`` and ``TASK_BACKEND`` load, and task receivers have a backend.

    The relay loads the same settings the same way before it claims a row, and refuses
    to start on any of these: a broken setting must never charge (or kill) a delivery.
    """
    if conf.problems(getattr(django_settings, conf.SETTINGS_NAME, {})):
        return []
    from .delivery.run import around_hook
    from .delivery.tasks import TaskBackendMissing, get_backend

    settings = conf.get()
    found: list[CheckMessage] = []
    if settings.AROUND_DELIVERY is not None:
        try:
            around_hook(settings.AROUND_DELIVERY)
        except ImproperlyConfigured as error:
            found.append(
                Error(str(error), hint="Fix AROUND_DELIVERY.", id="django_domain_events.E006")
            )
    for declared in registry.receivers:
        if declared.durable and declared.site == "task" and declared.ack == "batch":
            found.append(
                checks.Warning(
                    f"Receiver {declared.key!r} declares ack='batch' and site='task': a task "
                    "worker runs one row at a time, so nothing is acknowledged in batches.",
                    hint="Drop ack='batch', or run the receiver in the relay (site='relay').",
                    id="django_domain_events.W005",
                )
            )
    tasks = [r.key for r in registry.receivers if r.durable and r.site == "task"]
    if settings.TASK_BACKEND is None and not tasks:
        return found
    try:
        get_backend()
    except TaskBackendMissing:
        found.append(
            Error(
                f"Receivers {', '.join(tasks)} declare site='task', and no TASK_BACKEND is set.",
                hint="Set DJANGO_DOMAIN_EVENTS['TASK_BACKEND'], or declare them site='relay'.",
                id="django_domain_events.E007",
            )
        )
    except ImproperlyConfigured as error:
        found.append(Error(str(error), hint="Fix TASK_BACKEND.", id="django_domain_events.E007"))
    return found


@register(Tags.database)
def check_rows(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Owed rows nobody can deliver: their receiver or their event is no longer declared,
    or their receiver's key now names a receiver of another event."""
    if not databases:
        return []
    known_keys = {r.key for r in registry.receivers if r.durable}
    known_names = {e.name for e in registry.events}
    owed = DeliveryRecord.objects.filter(status__in=OWED_VALUES)
    try:
        pairs = set(owed.values_list("receiver_key", "event__name").distinct())
    except DatabaseError:
        return []  # not migrated yet: migrate says so
    keys = {key for key, _ in pairs}
    names = {name for _, name in pairs}
    found: list[CheckMessage] = []
    for key in sorted(keys - known_keys):
        found.append(
            checks.Warning(
                f"Owed deliveries name receiver {key!r}, which is not declared as durable.",
                hint=(
                    "Restore the receiver (during a rolling deploy, the other release's "
                    "relays run them), or let the relay record the rows orphaned "
                    "ORPHAN_AFTER_SECONDS after they came due (manage.py "
                    "orphan_undeclared: at once)."
                ),
                id="django_domain_events.W002",
            )
        )
    for key, name in sorted(pairs):
        declared = registry.receiver(key)
        if declared is not None and declared.durable and not declared.accepts(name):
            found.append(
                checks.Warning(
                    f"Owed deliveries of {name} name receiver {key!r}, which now listens to "
                    f"{declared.event_name}: the relay will record them orphaned.",
                    hint=f"Give the {declared.event_name} receiver another key and declare the "
                    f"{name} receiver under {key!r} again; or leave the rows to be orphaned.",
                    id="django_domain_events.W004",
                )
            )
    for name in sorted(names - known_names):
        found.append(
            checks.Warning(
                f"Owed deliveries belong to events named {name!r}, which is not declared.",
                hint="Declare the event again (@event(name=...)); otherwise the rows die.",
                id="django_domain_events.W003",
            )
        )
    return found


@register(Tags.compatibility)
def check_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A ``limit_group=`` no ``LIMIT_GROUPS`` entry declares; a ``LANE_LIMITS`` lane no
    receiver is on; a receiver key that reads as a group's or lane's limit."""
    if conf.problems(getattr(django_settings, conf.SETTINGS_NAME, {})):
        return []  # check_settings reports them
    from .delivery.limits import GROUP_PREFIX, LANE_PREFIX

    settings = conf.get()
    groups, lanes = settings.LIMIT_GROUPS or {}, settings.LANE_LIMITS or {}
    found: list[CheckMessage] = []
    for declared in registry.receivers:
        if declared.limit_group is not None and declared.limit_group not in groups:
            close = difflib.get_close_matches(declared.limit_group, list(groups), n=1)
            found.append(
                Error(
                    f"Receiver {declared.key!r} names limit_group={declared.limit_group!r}, "
                    "which DJANGO_DOMAIN_EVENTS['LIMIT_GROUPS'] does not declare: its rows "
                    "would run unlimited by the group."
                    + (f" Did you mean {close[0]!r}?" if close else ""),
                    hint=f"Add LIMIT_GROUPS[{declared.limit_group!r}] = "
                    "{'rate_limit': '50/s'} (or 'concurrency_limit'), or fix the name.",
                    id="django_domain_events.E022",
                )
            )
        if declared.key.startswith((GROUP_PREFIX, LANE_PREFIX)) and (
            declared.rate_limit is not None or declared.concurrency_limit is not None
        ):
            found.append(
                Error(
                    f"Receiver {declared.key!r} has limits of its own, and its key reads as "
                    "a group's or a lane's limit, whose state it would share.",
                    hint="Give the receiver a key that does not start with 'group:' or 'lane:'.",
                    id="django_domain_events.E023",
                )
            )
    declared_lanes = {r.lane for r in registry.receivers if r.durable}
    for lane in sorted(set(lanes) - declared_lanes):
        found.append(
            checks.Warning(
                f"DJANGO_DOMAIN_EVENTS['LANE_LIMITS'] limits lane {lane!r}, and no durable "
                "receiver is declared on it: the limit holds nothing.",
                hint="Fix the lane's name, or drop the entry.",
                id="django_domain_events.W007",
            )
        )
    return found
