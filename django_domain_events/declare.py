"""Declaring events and receivers: ``@event``, ``@receiver``, ``AnyEvent`` and the registry.

Every rule a declaration can break is checked here, at import time, so that a mistake
fails the deploy rather than the first fire weeks later.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, overload

from django.apps import apps

from .codec import decode_event, get_codec
from .receiver_options import DURABLE, ReceiverOptions
from .receiver_options import INLINE as INLINE
from .receiver_options import ON_COMMIT as ON_COMMIT
from .receiver_options import DeliveryMode as DeliveryMode
from .retry import RetryPolicy

MAX_NAME_LENGTH = 255


class Retention(enum.Enum):
    """When a settled event may be pruned, instead of the ``RETENTION_DAYS`` window."""

    SUCCEEDED = "succeeded"
    SETTLED = "settled"


class AnyEvent:
    """Declare ``@receiver(AnyEvent)`` to be owed every event fired, whatever its class."""


@dataclass(frozen=True)
class RegisteredEvent:
    """An ``@event`` class as the registry knows it."""

    event_class: type
    name: str
    version: int
    retention: timedelta | Retention | None
    upgrade: Callable[[dict[str, Any], int], dict[str, Any]] | None = None


@dataclass(frozen=True)
class RegisteredReceiver:
    """A ``@receiver`` function and everything its declaration said."""

    key: str
    event_class: type
    func: Callable[..., Any]
    mode: DeliveryMode
    takes_context: bool
    max_attempts: int | None
    eager: bool
    site: str
    on_failure: Callable[..., Any] | None
    lease_seconds: float | None
    targets: Callable[..., Iterable[str]] | None
    backoff_base_seconds: float | None
    backoff_cap_seconds: float | None
    lane: str
    give_up_after: timedelta | None
    due: timedelta | Callable[[Any], Any] | None
    ttl: timedelta | None = None
    retry: RetryPolicy | None = None
    is_async: bool = field(default=False, compare=False)
    event_name: str = ""  # the event class's name at declaration; "" for AnyEvent
    ack: str = "each"  # "batch": acknowledged with the rows around it, in one commit
    priority: int = 0  # within a lane, higher first among due rows, with aging (priority.py)
    rate_limit: str | None = None  # "50/s": held across every relay (delivery/limits.py)
    concurrency_limit: int | None = None  # at most this many running, across every relay
    limit_group: str | None = None  # shares the limits of LIMIT_GROUPS[limit_group]
    # The key whose rows run one at a time, in firing order (delivery/ordering.py).
    ordered_by: Callable[[Any], str | int] | None = None
    on_dead: str = "skip"  # "block": a dead row holds its key's later rows

    @property
    def durable(self) -> bool:
        return self.mode is DURABLE

    @property
    def wildcard(self) -> bool:
        return self.event_class is AnyEvent

    def accepts(self, event_name: str) -> bool:
        """Whether a row of the event named ``event_name`` is this receiver's to run.

        A row names its receiver by key only; should the key have come to name a receiver
        of another declared event, running it would hand one event to code written for
        another. A name no longer declared is accepted here: such a row dies undecoded.
        """
        return (
            self.wildcard
            or event_name == self.event_name
            or registry.event_named(event_name) is None
        )


class Registry:
    """Every declared event and receiver, looked up by class, name or key."""

    def __init__(self) -> None:
        self._events_by_class: dict[type, RegisteredEvent] = {}
        self._events_by_name: dict[str, RegisteredEvent] = {}
        self._receivers: dict[str, RegisteredReceiver] = {}
        self._for_class: dict[type, tuple[RegisteredReceiver, ...]] = {}

    # Events -----------------------------------------------------------------

    def add_event(self, registered: RegisteredEvent) -> None:
        existing = self._events_by_name.get(registered.name)
        if existing is not None and not _same_definition(
            existing.event_class, registered.event_class
        ):
            raise ValueError(
                f"Event name {registered.name!r} is already declared by "
                f"{dotted_name(existing.event_class)}; give {dotted_name(registered.event_class)} "
                "another name with @event(name=...)."
            )
        if existing is not None:
            self._events_by_class.pop(existing.event_class, None)
        self._events_by_class[registered.event_class] = registered
        self._events_by_name[registered.name] = registered
        self._for_class.clear()

    def event_for_class(self, cls: type) -> RegisteredEvent | None:
        return self._events_by_class.get(cls)

    def event_named(self, name: str) -> RegisteredEvent | None:
        return self._events_by_name.get(name)

    @property
    def events(self) -> list[RegisteredEvent]:
        return sorted(self._events_by_name.values(), key=lambda e: e.name)

    def decode(self, name: str, payload: dict[str, Any], version: int) -> Any:
        """The event a stored row records, upgraded to the declared version and decoded."""
        registered = self._events_by_name.get(name)
        if registered is None:
            raise LookupError(
                f"event name {name!r} is no longer declared; declare it again "
                "(@event(name=...)) and replay, or leave the row as a record."
            )
        return decode_event(
            get_codec(),
            registered.event_class,
            payload,
            stored_version=version,
            current_version=registered.version,
            upgrade=registered.upgrade,
        )

    # Receivers --------------------------------------------------------------

    def add_receiver(self, registered: RegisteredReceiver) -> None:
        """Take the key; only the same declaration, imported again, may take it twice."""
        existing = self._receivers.get(registered.key)
        if existing is not None and not _same_receiver(existing, registered):
            raise ValueError(
                f"Receiver key {registered.key!r} is already taken by {_declared(existing)}, "
                f"so {_declared(registered)} cannot take it too: the rows written for one "
                "would be run by the other. Give one of them its own key with "
                "@receiver(..., key=...)."
            )
        self._receivers[registered.key] = registered
        self._for_class.clear()

    def forget(self, key: str) -> None:
        """Remove a receiver: for tests that declare receivers at run time."""
        self._receivers.pop(key, None)
        self._for_class.clear()

    def receiver(self, key: str) -> RegisteredReceiver | None:
        return self._receivers.get(key)

    @property
    def receivers(self) -> list[RegisteredReceiver]:
        return sorted(self._receivers.values(), key=lambda r: r.key)

    def receivers_for(self, cls: type) -> tuple[RegisteredReceiver, ...]:
        """The receivers owed an event of ``cls``: its own and the wildcards, by key."""
        found = self._for_class.get(cls)
        if found is None:
            found = tuple(
                r
                for r in self.receivers
                if r.event_class is cls or (r.wildcard and cls is not AnyEvent)
            )
            self._for_class[cls] = found
        return found

    def lanes(self) -> dict[str, tuple[str, ...]]:
        """Durable receiver keys by lane; ``default`` is always present."""
        lanes: dict[str, list[str]] = {"default": []}
        for r in self.receivers:
            if r.durable:
                lanes.setdefault(r.lane, []).append(r.key)
        return {lane: tuple(keys) for lane, keys in sorted(lanes.items())}


registry = Registry()


def dotted_name(obj: object) -> str:
    """``module.qualname`` of a class or callable, without calling or importing anything."""
    if isinstance(obj, functools.partial):
        return dotted_name(obj.func)
    owner = obj if hasattr(obj, "__qualname__") else type(obj)
    module = getattr(owner, "__module__", None) or type(obj).__module__
    qualname = getattr(owner, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{qualname}"


def _same_definition(a: Any, b: Any) -> bool:
    """True when ``b`` is ``a`` declared again (a module imported twice)."""
    return dotted_name(a) == dotted_name(b)


def _source(func: Any) -> tuple[str, int, str] | str:
    """Where ``func`` was written (file, first line, qualified name), which a module
    imported again repeats and a copy-pasted function of the same name does not."""
    target = inspect.unwrap(func)
    while isinstance(target, functools.partial):
        target = target.func
    code = getattr(target, "__code__", None)
    if code is None and not inspect.isroutine(target):  # an instance: its class's __call__
        code = getattr(type(target).__call__, "__code__", None)
    if code is None:
        return dotted_name(target)
    return (code.co_filename, code.co_firstlineno, code.co_qualname)


def _same_receiver(a: RegisteredReceiver, b: RegisteredReceiver) -> bool:
    """True when ``b`` is ``a`` declared again: the same function for the same event.

    Classes are compared by dotted name, since a module imported again makes new ones.
    """
    return (a.func is b.func or _source(a.func) == _source(b.func)) and _same_definition(
        a.event_class, b.event_class
    )


def _declared(r: RegisteredReceiver) -> str:
    """``module.func (file:line) for Event``: tells apart two functions of one name."""
    where = _source(r.func)
    located = f" ({where[0]}:{where[1]})" if isinstance(where, tuple) else ""
    listens = "every event" if r.wildcard else (r.event_name or r.event_class.__qualname__)
    return f"{dotted_name(r.func)}{located} for {listens}"


def default_key(func: Any) -> str:
    """``<app_label>.<function name>``: the key of a receiver or schedule declared without one."""
    return f"{_app_label(func)}.{func.__name__}"


def _app_label(obj: Any) -> str:
    module = getattr(obj, "__module__", "") or ""
    config = apps.get_containing_app_config(module) if apps.apps_ready else None
    if config is not None:
        return config.label
    return module.split(".")[0] or "app"


# @event ---------------------------------------------------------------------

E = TypeVar("E", bound=type)


@overload
def event(cls: E, /) -> E: ...
@overload
def event(
    *,
    name: str | None = None,
    version: int = 1,
    retention: timedelta | Retention | None = None,
) -> Callable[[E], E]: ...


def event(
    cls: Any = None,
    /,
    *,
    name: str | None = None,
    version: int = 1,
    retention: timedelta | Retention | None = None,
) -> Any:
    """Declare a frozen dataclass as an event type that ``fire()`` can record."""

    def declare(cls: E) -> E:
        registry.add_event(_registered_event(cls, name, version, retention))
        return cls

    return declare(cls) if cls is not None else declare


def _registered_event(
    cls: Any, name: str | None, version: int, retention: timedelta | Retention | None
) -> RegisteredEvent:
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise TypeError(
            f"@event needs a frozen dataclass, and {cls!r} is not a dataclass; "
            "decorate it with @dataclass(frozen=True) below @event."
        )
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"@event needs a frozen dataclass, and {dotted_name(cls)} is not frozen: an event is a "
            "fact that must not change after it is fired. Use @dataclass(frozen=True)."
        )
    name = name if name is not None else f"{_app_label(cls)}.{cls.__name__}"
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"@event(name=) must be a non-empty string of at most {MAX_NAME_LENGTH} "
            f"characters, not {name!r}."
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"@event(version=) must be an int >= 1, not {version!r}.")
    _check_retention(retention)
    upgrade = _upgrade_hook(cls)
    return RegisteredEvent(
        event_class=cls, name=name, version=version, retention=retention, upgrade=upgrade
    )


def _check_retention(retention: object) -> None:
    if retention is None or isinstance(retention, Retention):
        return
    if isinstance(retention, timedelta):
        if retention <= timedelta(0) or retention.microseconds:
            raise ValueError(
                f"@event(retention=) must be a positive timedelta of whole seconds, "
                f"not {retention!r}."
            )
        return
    raise TypeError(
        f"@event(retention=) takes None, a timedelta, Retention.SUCCEEDED or "
        f"Retention.SETTLED, not {retention!r}."
    )


def _upgrade_hook(cls: type) -> Callable[[dict[str, Any], int], dict[str, Any]] | None:
    raw = inspect.getattr_static(cls, "upgrade", None)
    if raw is None:
        return None
    if not isinstance(raw, staticmethod | classmethod):
        raise TypeError(
            f"{dotted_name(cls)}.upgrade must be a @staticmethod or @classmethod taking "
            "(payload: dict, from_version: int); a plain method would need an event "
            "instance, which cannot exist before the payload is upgraded."
        )
    hook: Callable[[dict[str, Any], int], dict[str, Any]] = cls.upgrade  # type: ignore[attr-defined]
    return hook


# @receiver ------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def receiver(
    event_cls: type,
    *,
    key: str | None = None,
    mode: DeliveryMode = DURABLE,
    max_attempts: int | None = 5,
    eager: bool = False,
    site: str = "relay",
    lease_seconds: float | None = None,
    takes_context: bool = False,
    on_failure: Callable[..., Any] | None = None,
    targets: Callable[..., Iterable[str]] | None = None,
    backoff_base_seconds: float | None = None,
    backoff_cap_seconds: float | None = None,
    retry: RetryPolicy | None = None,
    lane: str = "default",
    give_up_after: timedelta | None = None,
    due: timedelta | Callable[[Any], Any] | None = None,
    ttl: timedelta | None = None,
    ack: str = "each",
    priority: int = 0,
    rate_limit: str | None = None,
    concurrency_limit: int | None = None,
    limit_group: str | None = None,
    ordered_by: Callable[[Any], str | int] | None = None,
    on_dead: str = "skip",
) -> Callable[[F], F]:
    """Declare ``func`` as a reaction to ``event_cls`` (or to every event, ``AnyEvent``).

    ``ack="batch"`` is for receivers whose only effects are writes to this database: the
    relay runs a run of such rows in one transaction, without savepoints (if one raises,
    the group is rolled back and run again with a savepoint per row, so only the failing
    row is undone), and acknowledges them together in one commit; a crash repeats the
    whole group.

    ``priority``: within a lane, due rows of a higher priority are claimed first; a row
    waiting longer than ``PRIORITY_AGING_SECONDS`` goes before every row that came due
    after it, whatever their priority. ``rate_limit`` (``"50/s"``, ``"600/m"``,
    ``"1000/h"``) and ``concurrency_limit`` hold across every relay and slot: a row the
    limit does not allow now is left owed, unclaimed and uncharged. ``limit_group``
    names a group of the ``LIMIT_GROUPS`` setting whose limits the receiver shares with
    the group's other receivers (its own, if any, hold as well).

    ``ordered_by`` (a function of the event, computed at ``fire()``): rows with one key
    run one at a time, in the order they were recorded, across every relay and slot;
    a receiver of several event classes (``AnyEvent``) keeps one order over all of
    them. ``on_dead="block"`` holds a key's later rows behind a dead one until an
    operator requeues or cancels it; ``"skip"`` (the default) lets them run.
    """
    # Long only by its signature and the options it hands on, one a line: the public
    # signature names every option (API.md), and ReceiverOptions checks them all.
    _check_event_class(event_cls)
    options = ReceiverOptions(
        mode=mode,
        max_attempts=max_attempts,
        eager=eager,
        site=site,
        lease_seconds=lease_seconds,
        takes_context=takes_context,
        on_failure=on_failure,
        targets=targets,
        backoff_base_seconds=backoff_base_seconds,
        backoff_cap_seconds=backoff_cap_seconds,
        retry=retry,
        lane=lane,
        give_up_after=give_up_after,
        due=due,
        ttl=ttl,
        ack=ack,
        priority=priority,
        rate_limit=rate_limit,
        concurrency_limit=concurrency_limit,
        limit_group=limit_group,
        ordered_by=ordered_by,
        on_dead=on_dead,
    )

    def declare(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@receiver decorates a function, not {func!r}.")
        _check_arity(func, takes_context)
        receiver_key = _checked_key(key if key is not None else default_key(func))
        registry.add_receiver(_registered_receiver(receiver_key, event_cls, func, options))
        return func

    return declare


def _checked_key(receiver_key: object) -> str:
    if not isinstance(receiver_key, str) or not receiver_key.strip():
        raise ValueError(f"@receiver(key=) must be a non-empty string, not {receiver_key!r}.")
    if len(receiver_key) > MAX_NAME_LENGTH:
        raise ValueError(
            f"@receiver(key={receiver_key[:40]!r}...) is {len(receiver_key)} characters; "
            f"keys are stored in a column of {MAX_NAME_LENGTH}. Choose a shorter key."
        )
    return receiver_key


def _registered_receiver(
    key: str, event_cls: type, func: Callable[..., Any], options: ReceiverOptions
) -> RegisteredReceiver:
    """The registry's record of a receiver: its options as the delivery code reads them."""
    o = options
    return RegisteredReceiver(
        key=key,
        event_class=event_cls,
        func=func,
        mode=o.mode,
        takes_context=o.takes_context,
        max_attempts=o.max_attempts if o.durable else None,
        eager=o.eager,
        site=o.site,
        on_failure=o.on_failure,
        lease_seconds=float(o.lease_seconds) if o.lease_seconds is not None else None,
        targets=o.targets,
        backoff_base_seconds=o.backoff_base_seconds,
        backoff_cap_seconds=o.backoff_cap_seconds,
        lane=o.lane,
        give_up_after=o.give_up_after,
        due=o.due,
        ttl=o.ttl,
        retry=o.retry_policy,
        is_async=inspect.iscoroutinefunction(func),
        event_name=_event_name(event_cls),
        ack=o.ack,
        priority=o.priority,
        rate_limit=o.rate_limit,
        concurrency_limit=o.concurrency_limit,
        limit_group=o.limit_group,
        ordered_by=o.ordered_by,
        on_dead=o.on_dead,
    )


def _event_name(event_cls: type) -> str:
    registered = registry.event_for_class(event_cls)
    return registered.name if registered is not None else ""


def _check_event_class(event_cls: object) -> None:
    if event_cls is AnyEvent:
        return
    if not isinstance(event_cls, type) or registry.event_for_class(event_cls) is None:
        raise TypeError(
            f"@receiver({event_cls!r}) needs an @event class or AnyEvent; "
            "decorate the class with @event first."
        )


def _check_arity(func: Callable[..., Any], takes_context: bool) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    wanted = 2 if takes_context else 1
    if not (len(required) <= wanted <= len(positional)):
        shape = "fn(evt, ctx)" if takes_context else "fn(evt)"
        fix = (
            "drop takes_context=True or add the ctx parameter"
            if not takes_context or len(positional) < 2
            else "take exactly (evt, ctx)"
        )
        if not takes_context:
            fix = "declare takes_context=True" if len(positional) == 2 else "take exactly (evt)"
        raise TypeError(
            f"{dotted_name(func)} is called as {shape} with takes_context={takes_context}, but "
            f"its signature is {signature}; {fix}."
        )
