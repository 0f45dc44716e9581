"""Who an event is fired on behalf of, which events are held back, and what caused it.

All three live in context variables, so they follow the code that fires the event
through function calls and ``async`` tasks; ``propagate_scope`` carries them into a thread.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from .codec import check_storable, text_problem


@dataclass(frozen=True)
class Scope:
    """The attribution that ``fire()`` copies onto every event row."""

    actor: Any = None
    actor_key: str = ""
    actor_label: str = ""
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Suppression:
    event_classes: tuple[type, ...]
    reason: str
    record: bool

    def covers(self, cls: type) -> bool:
        return not self.event_classes or issubclass(cls, self.event_classes)


@dataclass(frozen=True)
class Cause:
    """The event being handled: its id becomes ``causation_id``, its chain the correlation.

    An empty ``correlation_id`` means "the causing event's", looked up when firing.
    """

    event_id: int
    correlation_id: str


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("dde_scope", default=None)
_suppressions: contextvars.ContextVar[tuple[_Suppression, ...]] = contextvars.ContextVar(
    "dde_suppressions", default=()
)
_cause: contextvars.ContextVar[Cause | None] = contextvars.ContextVar("dde_cause", default=None)


def _actor_identity(actor: Any) -> tuple[Any, str, str]:
    if actor is None or getattr(actor, "is_anonymous", False):
        return None, "", ""
    pk = getattr(actor, "pk", None)
    if pk is None:
        raise ValueError(f"attributed(actor={actor!r}) needs a saved user (it has no pk).")
    label = actor.get_username() if hasattr(actor, "get_username") else str(actor)
    return actor, str(pk), str(label)[:255]


@contextmanager
def attributed(actor: Any = None, source: str | None = None, **scope: Any) -> Iterator[Scope]:
    """Attribute the events fired inside to ``actor`` (a user) or ``source``, with ``scope``.

    Nested blocks merge: an inner actor or source replaces the outer one, inner scope
    keys are added to the outer ones. ``AnonymousUser`` counts as no actor.
    """
    try:
        json.dumps(scope)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"attributed(**scope) values must be JSON-serialisable ({exc}); "
            "pass ids and strings rather than objects."
        ) from None
    check_storable(scope, "scope")
    if source is not None and text_problem(str(source)):
        raise ValueError(f"attributed(source={source!r}) {text_problem(str(source))}.")
    outer = _scope.get() or Scope()
    user, key, label = _actor_identity(actor)
    if user is None and source is not None:
        key = label = str(source)[:255]
    if user is None and source is None:
        user, key, label = outer.actor, outer.actor_key, outer.actor_label
    merged = Scope(actor=user, actor_key=key, actor_label=label, values={**outer.values, **scope})
    token = _scope.set(merged)
    try:
        yield merged
    finally:
        _scope.reset(token)


def current_scope() -> Scope:
    """The attribution in force here."""
    return _scope.get() or Scope()


@contextmanager
def suppressed(*event_classes: type, reason: str, record: bool = True) -> Iterator[None]:
    """Hold back delivery of the events fired inside (all events when no class is named).

    With ``record=True`` the event rows are still written, marked with ``reason`` and
    given no delivery rows; with ``record=False`` nothing is written.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("suppressed(reason=) must say why, for the event log; it was empty.")
    if text_problem(reason):
        raise ValueError(f"suppressed(reason={reason!r}) {text_problem(reason)}.")
    token = _suppressions.set(
        (*_suppressions.get(), _Suppression(tuple(event_classes), reason[:255], record))
    )
    try:
        yield
    finally:
        _suppressions.reset(token)


def suppression_for(cls: type) -> tuple[str, bool] | None:
    """``(reason, record)`` of the innermost suppression covering ``cls``, or None."""
    for suppression in reversed(_suppressions.get()):
        if suppression.covers(cls):
            return suppression.reason, suppression.record
    return None


@contextmanager
def caused_by(event_id: int, correlation_id: str | None = None) -> Iterator[None]:
    """Mark the events fired inside as caused by ``event_id``, in its correlation chain.

    Without ``correlation_id``, ``fire()`` reads the causing event's own (one query).
    """
    if isinstance(event_id, bool) or not isinstance(event_id, int):
        raise TypeError(f"caused_by() takes an event id (int), not {event_id!r}.")
    token = _cause.set(Cause(event_id, correlation_id or ""))
    try:
        yield
    finally:
        _cause.reset(token)


def causing_event_id() -> int | None:
    """The id of the event whose handling is under way here, if any."""
    cause = _cause.get()
    return cause.event_id if cause else None


def current_cause() -> Cause | None:
    return _cause.get()


P = ParamSpec("P")
R = TypeVar("R")


def propagate_scope(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` bound to the scope, suppressions and cause in force now, for another thread."""
    context = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return run
