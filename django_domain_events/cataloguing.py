"""The catalogue: every declared event, its fields and who reacts to it, as data or a document.

A reader of a codebase that fires events wants one page that says what happens when an
event is fired, and a reviewer wants that page to change in the same pull request as the
declaration. The catalogue is therefore built from the declarations alone, never by
running user code (no ``targets=`` or ``due=`` callable, no ``upgrade()`` hook, no default
factory is called), and rendered deterministically, so a committed copy diffs cleanly.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from . import conf
from .declare import (
    DURABLE,
    RegisteredEvent,
    RegisteredReceiver,
    Registry,
    Retention,
    dotted_name,
)
from .declare import registry as default_registry
from .recurrence import Schedule, Schedules
from .recurrence import schedules as default_schedules
from .retry import describe

__all__ = [
    "FORMATS",
    "WILDCARD_EVENT_NAME",
    "Catalogue",
    "CatalogueEvent",
    "CatalogueField",
    "CatalogueReceiver",
    "CatalogueSchedule",
    "catalogue",
    "render_catalogue",
]

FORMATS = ("markdown", "json")

# ``CatalogueReceiver.event_name`` of a receiver declared for ``AnyEvent``.
WILDCARD_EVENT_NAME = "*"


@dataclass(frozen=True)
class CatalogueField:
    """One payload field of an event: its name, its type as written, and its default.

    ``default`` is the default's ``repr`` (``"list()"`` for a ``default_factory=list``,
    which is named, not called), or ``None`` when the field is required.
    """

    name: str
    type: str
    default: str | None


@dataclass(frozen=True)
class CatalogueReceiver:
    """A receiver as its declaration describes it, with the settings it falls back on.

    Row-only values (``site``, ``lane``, ``max_attempts``, ``eager``, ``lease_seconds``,
    ``retry``, the schedule and lifetime) are ``None`` for ``INLINE`` and ``ON_COMMIT``
    receivers, which write no row. For a ``DURABLE`` one, ``max_attempts=None`` means
    unbounded. Durations are seconds, an ``int`` when whole. Callables are dotted paths.
    """

    key: str
    event_name: str
    mode: str
    site: str | None
    lane: str | None
    max_attempts: int | None
    eager: bool | None
    takes_context: bool
    lease_seconds: float | None
    retry: dict[str, Any] | None
    give_up_after_seconds: float | None
    due_seconds: float | None
    due_callable: str | None
    ttl_seconds: float | None
    targets: str | None
    on_failure: str | None
    function: str


@dataclass(frozen=True)
class CatalogueEvent:
    """An event type: its name, version, class, retention, fields and own receivers.

    ``retention`` is ``None`` (the ``RETENTION_DAYS`` window), ``"succeeded"``,
    ``"settled"``, or the declared ``timedelta`` in whole seconds.
    """

    name: str
    version: int
    class_path: str
    retention: str | int | None
    fields: tuple[CatalogueField, ...]
    receivers: tuple[CatalogueReceiver, ...]


@dataclass(frozen=True)
class CatalogueSchedule:
    """A ``@recurring`` schedule: when it ticks, its catch-up, and the event it fires.

    ``cron`` and ``timezone`` (the zone it is read in, Django's ``TIME_ZONE`` when none
    was declared) for a cron schedule, ``every_seconds`` for an interval; ``spec`` is
    both in one line. ``catch_up_limit`` is set for ``catch_up="all"`` only.
    ``tolerance_seconds`` is how late a tick may still fire (``None``: no limit; one
    minute for ``"none"`` unless declared). ``event_name`` is the event the function's
    return annotation names, ``None`` without one. ``function`` is its dotted path.
    """

    key: str
    spec: str
    cron: str | None
    timezone: str | None
    every_seconds: float | None
    catch_up: str
    catch_up_limit: int | None
    tolerance_seconds: float | None
    event_name: str | None
    function: str


@dataclass(frozen=True)
class Catalogue:
    """Every event sorted by name, the ``AnyEvent`` receivers once, sorted by key, and
    the ``@recurring`` schedules, sorted by key."""

    events: tuple[CatalogueEvent, ...]
    wildcard_receivers: tuple[CatalogueReceiver, ...]
    schedules: tuple[CatalogueSchedule, ...] = ()


# ---------------------------------------------------------------- building


def catalogue(registry: Registry | None = None, *, schedules: Schedules | None = None) -> Catalogue:
    """The catalogue of ``registry`` and ``schedules`` (the package's by default).

    Reads declarations, type hints and settings only; nothing declared is called.
    """
    registry = registry if registry is not None else default_registry
    schedules = schedules if schedules is not None else default_schedules
    settings = conf.get()
    events = registry.events
    by_class = {e.event_class: e for e in events}
    # A module imported twice re-declares its classes: find their events by path too.
    by_path = {dotted_name(e.event_class): e for e in events}
    own: dict[str, list[CatalogueReceiver]] = {e.name: [] for e in events}
    wildcards: list[CatalogueReceiver] = []
    for declared in registry.receivers:
        if declared.wildcard:
            wildcards.append(_receiver(declared, WILDCARD_EVENT_NAME, settings))
            continue
        registered = by_class.get(declared.event_class) or by_path.get(
            dotted_name(declared.event_class)
        )
        if registered is not None:
            own[registered.name].append(_receiver(declared, registered.name, settings))
    return Catalogue(
        events=tuple(
            CatalogueEvent(
                name=e.name,
                version=e.version,
                class_path=dotted_name(e.event_class),
                retention=_retention(e),
                fields=_fields(e.event_class),
                receivers=tuple(sorted(own[e.name], key=lambda r: r.key)),
            )
            for e in sorted(events, key=lambda e: e.name)
        ),
        wildcard_receivers=tuple(sorted(wildcards, key=lambda r: r.key)),
        schedules=tuple(_schedule(s, registry) for s in schedules.all()),
    )


def _schedule(schedule: Schedule, registry: Registry) -> CatalogueSchedule:
    returned = schedule.event_type
    registered = None
    if returned is not None:
        registered = registry.event_for_class(returned) or default_registry.event_for_class(
            returned
        )
    limit = schedule.late_limit
    return CatalogueSchedule(
        key=schedule.key,
        spec=schedule.spec,
        cron=schedule.cron,
        timezone=schedule.zone.key if schedule.cron is not None else None,
        every_seconds=_seconds(schedule.every.total_seconds()) if schedule.every else None,
        catch_up=schedule.catch_up,
        catch_up_limit=schedule.catch_up_limit if schedule.catch_up == "all" else None,
        tolerance_seconds=_seconds(limit.total_seconds()) if limit is not None else None,
        event_name=registered.name if registered is not None else None,
        function=dotted_name(schedule.func),
    )


def _retention(registered: RegisteredEvent) -> str | int | None:
    retention = registered.retention
    if isinstance(retention, Retention):
        return retention.value
    if isinstance(retention, timedelta):
        return int(retention.total_seconds())
    return None


def _receiver(
    declared: RegisteredReceiver, event_name: str, settings: conf.Settings
) -> CatalogueReceiver:
    common: dict[str, Any] = {
        "key": declared.key,
        "event_name": event_name,
        "mode": declared.mode.value,
        "takes_context": declared.takes_context,
        "on_failure": dotted_name(declared.on_failure) if declared.on_failure is not None else None,
        "function": dotted_name(declared.func),
    }
    if declared.mode is not DURABLE:
        return CatalogueReceiver(
            site=None,
            lane=None,
            max_attempts=None,
            eager=None,
            lease_seconds=None,
            retry=None,
            give_up_after_seconds=None,
            due_seconds=None,
            due_callable=None,
            ttl_seconds=None,
            targets=None,
            **common,
        )
    # Imported here: the delivery package imports the models, which need the app registry.
    from .delivery.outcomes import lifetime, retry_policy

    due = declared.due
    life, _ = lifetime(declared)
    ttl = life.total_seconds() if life is not None else None
    return CatalogueReceiver(
        site=declared.site,
        lane=declared.lane,
        max_attempts=declared.max_attempts,
        eager=declared.eager,
        lease_seconds=_seconds(
            declared.lease_seconds if declared.lease_seconds is not None else settings.LEASE_SECONDS
        ),
        retry=_retry(retry_policy(declared)),
        give_up_after_seconds=(
            _seconds(declared.give_up_after.total_seconds())
            if declared.give_up_after is not None
            else None
        ),
        due_seconds=_seconds(due.total_seconds()) if isinstance(due, timedelta) else None,
        due_callable=dotted_name(due)
        if due is not None and not isinstance(due, timedelta)
        else None,
        ttl_seconds=_seconds(ttl) if ttl is not None else None,
        targets=dotted_name(declared.targets) if declared.targets is not None else None,
        **common,
    )


def _retry(policy: object) -> dict[str, Any]:
    """``retry.describe()``, with every duration a float so equal policies print alike."""
    return {
        key: float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        for key, value in describe(policy).items()
    }


def _seconds(value: float) -> float:
    """Whole seconds as an int (``172800``, not ``172800.0``), others unchanged."""
    number = float(value)
    return int(number) if number.is_integer() else number


# ---------------------------------------------------------------- fields


def _fields(event_class: type) -> tuple[CatalogueField, ...]:
    """The payload fields (``init`` fields), in declaration order."""
    try:
        hints = get_type_hints(event_class)
    except Exception:  # an unresolvable annotation: show it as written
        hints = {}
    return tuple(
        CatalogueField(
            name=f.name,
            type=_type_name(hints.get(f.name, f.type)),
            default=_default(f),
        )
        for f in dataclasses.fields(event_class)
        if f.init
    )


def _default(f: dataclasses.Field[Any]) -> str | None:
    if f.default is not dataclasses.MISSING:
        return _value_repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        name = dotted_name(f.default_factory)
        return f"{name.removeprefix('builtins.')}()"
    return None


def _value_repr(value: object) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    text = repr(value)
    if _ADDRESS.search(text):  # object.__repr__ differs from run to run: no stable diff
        return f"<{type(value).__qualname__} instance>"
    return text


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")

# typing.Tuple[()] is a value to compare with here, not an annotation to modernise.
_EMPTY_TUPLES: tuple[object, ...] = (tuple[()], typing.Tuple[()])  # noqa: UP006


def _type_name(annotation: object) -> str:
    """An annotation as a reader would write it: ``list[str]``, ``datetime | None``."""
    if isinstance(annotation, str):
        return annotation
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    if annotation is Ellipsis:
        return "..."
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    if isinstance(annotation, typing.TypeVar | typing.NewType):
        return str(getattr(annotation, "__name__", annotation))
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return f"Literal[{', '.join(_value_repr(a) for a in args)}]"
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = _type_name(origin)
        if annotation in _EMPTY_TUPLES:  # get_args() cannot tell it from a bare tuple
            return f"{name}[()]"
        if not args:
            return name
        return f"{name}[{', '.join(_type_list(args))}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _type_list(args: Iterable[object]) -> list[str]:
    """Arguments of a generic; ``Callable[[int], str]`` keeps its inner list."""
    return [f"[{', '.join(_type_list(a))}]" if isinstance(a, list) else _type_name(a) for a in args]


# ---------------------------------------------------------------- rendering


def render_catalogue(cat: Catalogue, format: str = "markdown") -> str:
    """``cat`` as ``"markdown"`` or ``"json"``, ending in exactly one newline."""
    if format == "json":
        return json.dumps(dataclasses.asdict(cat), sort_keys=True, indent=2) + "\n"
    if format == "markdown":
        return _markdown(cat)
    raise ValueError(
        f"render_catalogue(format={format!r}) is not a format it writes; "
        f"use one of {', '.join(repr(f) for f in FORMATS)}."
    )


_TITLE = "# Event catalogue"
_PREAMBLE = (
    "Every declared event, its payload fields and the receivers that react to it. "
    "Generated by `manage.py export_catalogue`; regenerate it rather than editing it."
)
_RECEIVER_HEADER = ("key", "mode", "site", "lane", "max attempts", "retry", "targets")


def _markdown(cat: Catalogue) -> str:
    blocks: list[str] = [_TITLE, _PREAMBLE]
    if not cat.events:
        blocks.append("No events are declared.")
    fired_by: dict[str, list[str]] = {}
    for schedule in cat.schedules:
        if schedule.event_name is not None:
            fired_by.setdefault(schedule.event_name, []).append(schedule.key)
    for evt in cat.events:
        blocks.extend(
            _event_blocks(
                evt, wildcards=len(cat.wildcard_receivers), fired_by=fired_by.get(evt.name, [])
            )
        )
    if cat.wildcard_receivers:
        blocks.append("## Every event (AnyEvent)")
        blocks.append(
            "These receivers are declared for `AnyEvent`: each of them is owed every event "
            "fired, whatever its name, including events declared later."
        )
        blocks.extend(_receiver_blocks(cat.wildcard_receivers))
    if cat.schedules:
        blocks.append("## Schedules")
        blocks.append(
            "The relays call each of these functions once per tick (`@recurring`), and "
            "fire the event it returns as of the tick."
        )
        blocks.append(_table(_SCHEDULE_HEADER, [_schedule_row(s) for s in cat.schedules]))
    return "\n\n".join(blocks) + "\n"


_SCHEDULE_HEADER = ("key", "when", "catch-up", "tolerance", "event", "function")


def _schedule_row(s: CatalogueSchedule) -> tuple[str, ...]:
    if s.cron is not None:
        when = f"cron {_code(s.cron)} in {s.timezone}"
    else:
        when = f"every {_duration(s.every_seconds or 0)}"
    catch_up = s.catch_up
    if s.catch_up_limit is not None:
        catch_up += f" (at most {s.catch_up_limit})"
    return (
        _code(s.key),
        when,
        catch_up,
        _duration(s.tolerance_seconds) if s.tolerance_seconds is not None else "no limit",
        _code(s.event_name) if s.event_name is not None else _NONE,
        _code(s.function),
    )


def _event_blocks(evt: CatalogueEvent, *, wildcards: int, fired_by: list[str]) -> list[str]:
    facts = [
        f"- Version: {evt.version}",
        f"- Class: {_code(evt.class_path)}",
        f"- Retention: {_retention_text(evt.retention)}",
    ]
    if fired_by:
        keys = ", ".join(_code(key) for key in fired_by)
        facts.append(f"- Fired on a schedule by: {keys} (see Schedules)")
    blocks = [f"## {evt.name}", "\n".join(facts), "### Fields"]
    if evt.fields:
        blocks.append(
            _table(
                ("name", "type", "default"),
                [
                    (
                        _code(f.name),
                        _code(f.type),
                        _code(f.default) if f.default is not None else "required",
                    )
                    for f in evt.fields
                ],
            )
        )
    else:
        blocks.append("No fields.")
    blocks.append("### Receivers")
    if evt.receivers:
        blocks.extend(_receiver_blocks(evt.receivers))
    if wildcards:
        who = "receiver" if wildcards == 1 else "receivers"
        verb = "reacts" if wildcards == 1 else "react"
        if evt.receivers:
            blocks.append(
                f"The {who} of every event (AnyEvent), listed at the end, also {verb} to it."
            )
        else:
            blocks.append(
                f"No receiver of its own: only the {who} of every event (AnyEvent), "
                f"listed at the end, {verb} to it."
            )
    elif not evt.receivers:
        blocks.append("Nothing listens to this event.")
    return blocks


def _receiver_blocks(receivers: Iterable[CatalogueReceiver]) -> list[str]:
    receivers = list(receivers)
    blocks = [_table(_RECEIVER_HEADER, [_receiver_row(r) for r in receivers])]
    notes = [note for r in receivers for note in _receiver_notes(r)]
    if notes:
        blocks.append("\n".join(notes))
    return blocks


_NONE = "-"


def _receiver_row(r: CatalogueReceiver) -> tuple[str, ...]:
    durable = r.mode == DURABLE.value
    if not durable:
        max_attempts = _NONE
    elif r.max_attempts is None:
        max_attempts = "unbounded"
    else:
        max_attempts = str(r.max_attempts)
    return (
        _code(r.key),
        r.mode,
        r.site or _NONE,
        r.lane or _NONE,
        max_attempts,
        _retry_text(r.retry) if r.retry is not None else _NONE,
        _code(r.targets) if r.targets is not None else _NONE,
    )


def _receiver_notes(r: CatalogueReceiver) -> list[str]:
    """The lines under a receivers table: when a reaction runs, expires or gives up."""
    key = _code(r.key)
    notes = []
    if r.due_seconds is not None:
        notes.append(
            f"- {key} runs {_duration(r.due_seconds)} after the event "
            f"(due={_number(r.due_seconds)}s)"
        )
    if r.due_callable is not None:
        notes.append(f"- {key} runs at the time {_code(r.due_callable)} returns (due callable)")
    if r.ttl_seconds is not None:
        notes.append(
            f"- {key} expires {_duration(r.ttl_seconds)} after it is due "
            f"(ttl={_number(r.ttl_seconds)}s)"
        )
    if r.give_up_after_seconds is not None:
        notes.append(
            f"- {key} gives up after {_duration(r.give_up_after_seconds)} of deferrals "
            f"(give_up_after={_number(r.give_up_after_seconds)}s)"
        )
    return notes


def _retention_text(retention: str | int | None) -> str:
    if retention is None:
        return "the `RETENTION_DAYS` window"
    if retention == Retention.SUCCEEDED.value:
        return "deleted once every delivery succeeded or was cancelled (`Retention.SUCCEEDED`)"
    if retention == Retention.SETTLED.value:
        return "deleted once every delivery is settled (`Retention.SETTLED`)"
    if isinstance(retention, int):
        return f"kept {_duration(retention)} after it is recorded ({retention}s)"
    return str(retention)


def _retry_text(retry: dict[str, Any]) -> str:
    kind = retry.get("kind")
    if kind == "exponential":
        return f"exponential, base {_number(retry['base'])}s, cap {_number(retry['cap'])}s"
    if kind == "constant":
        return f"constant {_number(retry['seconds'])}s"
    if kind == "linear":
        cap = retry.get("cap")
        capped = f", cap {_number(cap)}s" if cap is not None else ""
        return f"linear, step {_number(retry['step'])}s{capped}"
    if kind == "custom":
        return f"custom {_code(str(retry.get('path')))}"
    return _code(json.dumps(retry, sort_keys=True))


def _number(value: float) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def _duration(seconds: float) -> str:
    """``172800`` as ``2d``, ``5400`` as ``1h 30m``: the largest whole units first."""
    remaining = float(seconds)
    parts = []
    for unit, size in _UNITS:
        count = int(remaining // size)
        if count:
            parts.append(f"{count}{unit}")
            remaining -= count * size
    if remaining or not parts:
        parts.append(f"{_number(round(remaining, 6))}s")
    return " ".join(parts)


def _code(text: str) -> str:
    """``text`` as inline code, with a fence longer than any backtick run inside it."""
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"


def _cell(text: str) -> str:
    """A table cell: GitHub tables split on ``|`` even inside code, so it is escaped."""
    return " ".join(text.split("\n")).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    lines = [
        f"| {' | '.join(header)} |",
        f"|{'|'.join('---' for _ in header)}|",
        *(f"| {' | '.join(_cell(c) for c in row)} |" for row in rows),
    ]
    return "\n".join(lines)
