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
from .catalogue_markdown import markdown
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
        return markdown(cat)
    raise ValueError(
        f"render_catalogue(format={format!r}) is not a format it writes; "
        f"use one of {', '.join(repr(f) for f in FORMATS)}."
    )
