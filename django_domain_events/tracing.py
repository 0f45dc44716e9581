"""Where a tracing integration plugs in: what ``fire()`` stores, what wraps an attempt.

Nothing here imports a tracing library. ``contrib.opentelemetry`` installs itself when
its app is in ``INSTALLED_APPS``; until something is installed, ``current()`` is ``""``
and ``attempt_span()`` a no-op, so tracing costs nothing unconfigured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

# fire(): the caller's trace context, serialized (a W3C ``traceparent``), or "".
_current: Callable[[], str] | None = None
# An attempt: a context manager around the receiver call, given the DeliveryContext.
_attempt_span: Callable[[Any], contextlib.AbstractContextManager[Any]] | None = None


def install(
    current: Callable[[], str],
    attempt_span: Callable[[Any], contextlib.AbstractContextManager[Any]],
) -> None:
    """Make ``fire()`` store ``current()`` and run every durable attempt in
    ``attempt_span(ctx)``. One integration at a time: a second install replaces it."""
    global _current, _attempt_span
    _current, _attempt_span = current, attempt_span


def uninstall() -> None:
    """Back to no tracing (for tests)."""
    global _current, _attempt_span
    _current = _attempt_span = None


def current() -> str:
    """The trace context to store on an event row being fired, or ``""``."""
    return _current() if _current is not None else ""


def attempt_span(ctx: Any) -> contextlib.AbstractContextManager[Any]:
    """What wraps one durable attempt: a span when an integration is installed."""
    return _attempt_span(ctx) if _attempt_span is not None else contextlib.nullcontext()
