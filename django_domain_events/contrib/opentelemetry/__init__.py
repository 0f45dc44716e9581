"""OpenTelemetry traces: a delivery is a span in the trace of the request that fired it.

Add ``"django_domain_events.contrib.opentelemetry"`` to ``INSTALLED_APPS`` (and install
the ``opentelemetry`` extra). Then:

- ``fire()`` stores the current W3C trace context (``traceparent``, and ``tracestate``
  when there is one) on the event row;
- every durable attempt, wherever it runs (a relay, an eager attempt after commit, a
  task worker's ``deliver_one``), runs in a ``CONSUMER`` span named
  ``"<receiver key> process"`` whose **parent** is the span ``fire()`` was called in.

Parent, not link: a delivery is the continuation of the request that fired the event,
so one trace shows the request, each delivery a minute later in a relay, and the spans
a receiver opens itself, nested where they belong. (A link would suit a consumer that
handles many messages in one span; here each attempt is its own span.) An event fired
with no span current starts a trace of its own at each attempt.

Attributes follow the messaging semantic conventions: ``messaging.system``
(``django_domain_events``), ``messaging.destination.name`` (the receiver key),
``messaging.message.id`` (the delivery id), ``messaging.operation.type``
(``process``), ``messaging.message.conversation_id`` (the correlation id), and
``messaging.django_domain_events.attempt`` / ``.event_name`` / ``.event_id``. A failure
is recorded on the span (the exception as an event, status ``ERROR``); ``NotYet`` is
not a failure and only adds an event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_domain_events.contrib.opentelemetry needs opentelemetry-api: "
        "pip install 'django-domain-outbox[opentelemetry]'"
    ) from exc

from ... import tracing
from ...delivery.outcomes import DeliveryContext, NotYet

SYSTEM = "django_domain_events"
MAX_STORED = 512  # the column's width: a tracestate that does not fit is left out
# What the event row keeps of the caller's context: where the trace is, never its
# baggage (a user's data, which every attempt would otherwise replay, days later).
STORED_KEYS = ("traceparent", "tracestate")


def install() -> None:
    """Store trace contexts at ``fire()`` and trace every attempt (the app's ``ready()``)."""
    tracing.install(current_trace_context, attempt_span)


def current_trace_context() -> str:
    """The caller's trace context as stored on the event row: JSON of its W3C
    ``traceparent`` and ``tracestate``, or ``""`` when no span is current."""
    injected: dict[str, str] = {}
    propagate.inject(injected)
    if "traceparent" not in injected:
        return ""
    carrier = {key: injected[key] for key in STORED_KEYS if key in injected}
    stored = json.dumps(carrier, separators=(",", ":"), sort_keys=True)
    if len(stored) > MAX_STORED:
        stored = json.dumps({"traceparent": carrier["traceparent"]}, separators=(",", ":"))
    return stored


@contextlib.contextmanager
def attempt_span(ctx: DeliveryContext) -> Iterator[Any]:
    """A consumer span around one attempt, child of the span the event was fired in."""
    parent = propagate.extract(_carrier(ctx.trace_context)) if ctx.trace_context else None
    tracer = trace.get_tracer(SYSTEM)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": ctx.receiver_key,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.conversation_id": ctx.correlation_id,
        f"messaging.{SYSTEM}.attempt": ctx.attempt,
        f"messaging.{SYSTEM}.event_name": ctx.event_name,
        f"messaging.{SYSTEM}.event_id": ctx.event_id,
    }
    if ctx.delivery_id is not None:
        attributes["messaging.message.id"] = str(ctx.delivery_id)
    with tracer.start_as_current_span(
        f"{ctx.receiver_key} process",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except NotYet as not_yet:
            span.add_event("not yet", {"until": not_yet.until.isoformat()})
            raise
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            raise


def _carrier(stored: str) -> dict[str, str]:
    try:
        carrier = json.loads(stored)
    except ValueError:
        return {}
    if not isinstance(carrier, dict):
        return {}
    return {key: str(carrier[key]) for key in STORED_KEYS if key in carrier}
