"""Write docs/api.md, the API reference, from the docstrings: ``make api-docs``.

The page is plain Markdown (a signature and the docstring per public name), so it reads
the same on GitHub, in an editor and on the built site; tests/test_api_reference.py
fails when it no longer matches the code. Run it after changing a public signature or
docstring, or the list below.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"

HEADER = """# API reference

Everything public is importable from the package root, `from django_domain_events
import fire, receiver, ...`; the headings below name the module that defines each
object. Generated from the docstrings by `scripts/api_reference.py` (`make api-docs`);
the pages beside it ([Declaring](declaring.md), [Firing](firing.md),
[Delivery](delivery.md), ...) explain how the pieces fit. The contrib back ends are at
the end.
"""

SECTIONS: list[tuple[str, str, list[str]]] = [
    (
        "Declaring",
        "",
        [
            "django_domain_events.declare.event",
            "django_domain_events.declare.receiver",
            "django_domain_events.declare.AnyEvent",
            "django_domain_events.declare.registry",
            "django_domain_events.declare.Registry",
            "django_domain_events.declare.RegisteredEvent",
            "django_domain_events.declare.RegisteredReceiver",
            "django_domain_events.declare.DeliveryMode",
            "django_domain_events.declare.DURABLE",
            "django_domain_events.declare.INLINE",
            "django_domain_events.declare.ON_COMMIT",
            "django_domain_events.declare.Retention",
        ],
    ),
    (
        "Firing",
        "",
        [
            "django_domain_events.firing.fire",
            "django_domain_events.scope.attributed",
            "django_domain_events.scope.current_scope",
            "django_domain_events.scope.suppressed",
            "django_domain_events.scope.caused_by",
            "django_domain_events.scope.causing_event_id",
            "django_domain_events.scope.propagate_scope",
            "django_domain_events.scope.Scope",
        ],
    ),
    (
        "Delivery",
        "",
        [
            "django_domain_events.delivery.relay.run_relay",
            "django_domain_events.delivery.passes.deliver_one",
            "django_domain_events.delivery.passes.deliver_pending",
            "django_domain_events.delivery.claim.claim_batch",
            "django_domain_events.retry.backoff",
            "django_domain_events.delivery.wake.notify_relay",
            "django_domain_events.delivery.outcomes.DeliveryContext",
            "django_domain_events.delivery.outcomes.DeliveryFailure",
            "django_domain_events.models.DeliveryStatus",
            "django_domain_events.delivery.outcomes.PermanentFailure",
            "django_domain_events.delivery.outcomes.RetryAfter",
            "django_domain_events.delivery.outcomes.NotYet",
            "django_domain_events.delivery.tasks.TaskBackend",
        ],
    ),
    (
        "Recurring schedules",
        "See [Recurring schedules](recurring.md) for the semantics: ticks, time zones, "
        "catch-up, pausing.",
        [
            "django_domain_events.recurrence.recurring",
            "django_domain_events.recurrence.Schedule",
            "django_domain_events.tick_firing.fire_due_ticks",
            "django_domain_events.operations.pause_schedule",
            "django_domain_events.operations.resume_schedule",
            "django_domain_events.operations.forget_schedule",
        ],
    ),
    (
        "Retry policies",
        "",
        [
            "django_domain_events.retry.Exponential",
            "django_domain_events.retry.Constant",
            "django_domain_events.retry.Linear",
        ],
    ),
    (
        "Payloads",
        "",
        [
            "django_domain_events.codec.PayloadCodec",
            "django_domain_events.codec.DataclassCodec",
            "django_domain_events.codec.UnsupportedPayloadType",
            "django_domain_events.codec.PayloadUpgradeFailed",
        ],
    ),
    (
        "Operations",
        "",
        [
            "django_domain_events.operations.cancel_deliveries",
            "django_domain_events.operations.replay_events",
            "django_domain_events.operations.requeue_dead",
            "django_domain_events.retention.prune_events",
            "django_domain_events.operations.dead_letters",
            "django_domain_events.operations.purge_dead",
        ],
    ),
    (
        "Introspection",
        "",
        [
            "django_domain_events.introspect.outbox_health",
            "django_domain_events.introspect.OutboxHealth",
            "django_domain_events.introspect.ReceiverBacklog",
            "django_domain_events.introspect.LaneBacklog",
            "django_domain_events.introspect.LanePause",
            "django_domain_events.introspect.quiet_receivers",
            "django_domain_events.introspect.QuietReceiver",
            "django_domain_events.introspect.schedule_status",
            "django_domain_events.introspect.ScheduleStatus",
            "django_domain_events.cataloguing.catalogue",
            "django_domain_events.cataloguing.render_catalogue",
            "django_domain_events.cataloguing.Catalogue",
            "django_domain_events.cataloguing.CatalogueEvent",
            "django_domain_events.cataloguing.CatalogueField",
            "django_domain_events.cataloguing.CatalogueReceiver",
            "django_domain_events.cataloguing.CatalogueSchedule",
            "django_domain_events.introspect.what_listens_to",
            "django_domain_events.introspect.listens_for",
        ],
    ),
    (
        "Testing",
        "",
        [
            "django_domain_events.testing.drain_outbox",
            "django_domain_events.testing.assert_fired",
        ],
    ),
    (
        "Contrib",
        "",
        [
            "django_domain_events.contrib.django_tasks.DjangoTasksBackend",
            "django_domain_events.contrib.celery.CeleryBackend",
            "django_domain_events.contrib.prometheus.OutboxCollector",
            "django_domain_events.contrib.prometheus.metrics_view",
            "django_domain_events.contrib.prometheus.register",
        ],
    ),
]


def load(path: str) -> Any:
    """The object at a dotted path."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class _Shown:
    """A value shown as its text: annotations unquoted, enum defaults by name."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _shown(value: Any, names: dict[str, Any] | None = None) -> Any:
    if isinstance(value, str):
        return _Shown(value)
    if isinstance(value, enum.Enum):
        return _Shown(f"{type(value).__name__}.{value.name}")
    if " at 0x" in repr(value):  # a function or an object: by the name the module uses
        found = [k for k, v in (names or {}).items() if v is value]
        return _Shown(found[0] if found else getattr(value, "__name__", type(value).__name__))
    return value


def formatted(
    name: str, sig: inspect.Signature, prefix: str, names: dict[str, Any] | None = None
) -> str:
    """``prefix name(params) -> returns``, one parameter a line when it is long; ``names``
    are the defining module's globals, to show a default object by its name."""
    params = []
    for param in sig.parameters.values():  # shown as written
        changes: dict[str, Any] = {}
        if param.annotation is not param.empty:
            changes["annotation"] = _shown(param.annotation)
        if param.default is not param.empty and not isinstance(param.default, str):
            changes["default"] = _shown(param.default, names)
        params.append(param.replace(**changes))
    returns = sig.return_annotation
    sig = sig.replace(
        parameters=params,
        return_annotation=_shown(returns) if returns is not sig.empty else sig.empty,
    )
    line = f"{prefix} {name}{sig}"
    if len(line) <= 88 or not params:
        return line
    tail = str(sig).rpartition(")")[2]
    shown: list[str] = []
    previous = None
    for param in sig.parameters.values():
        kind = param.kind
        if previous is inspect.Parameter.POSITIONAL_ONLY and kind is not previous:
            shown.append("/")
        starred = previous is inspect.Parameter.VAR_POSITIONAL
        if kind is inspect.Parameter.KEYWORD_ONLY and previous is not kind and not starred:
            shown.append("*")
        shown.append(str(param))
        previous = kind
    if previous is inspect.Parameter.POSITIONAL_ONLY:
        shown.append("/")
    body = "".join(f"    {part},\n" for part in shown)
    return f"{prefix} {name}(\n{body}){tail}"


def signature(name: str, obj: Any) -> str:
    """How the object is called or what it is, as a line of Python."""
    if isinstance(obj, enum.Enum):
        return f"{name} = {type(obj).__name__}.{obj.name}"
    if inspect.isclass(obj):
        if issubclass(obj, enum.Enum):
            members = ", ".join(m.name for m in obj)
            return f"class {name}({obj.__bases__[0].__name__}): {members}"
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return f"class {name}"
        return formatted(name, sig.replace(return_annotation=inspect.Signature.empty), "class")
    if inspect.isroutine(obj):
        prefix = "async def" if inspect.iscoroutinefunction(obj) else "def"
        return formatted(name, inspect.signature(obj), prefix, getattr(obj, "__globals__", None))
    return f"{name}: {type(obj).__name__}"


def methods(obj: Any) -> list[str]:
    """A class's public methods and properties defined in the package, one line each."""
    lines = []
    for attr, value in vars(obj).items():
        if attr.startswith("_"):
            continue
        member = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        if isinstance(member, property):
            doc = (inspect.getdoc(member) or "").split("\n\n")[0].replace("\n", " ")
            lines.append(f"- `{attr}` (property): {doc}".rstrip(": "))
        elif inspect.isfunction(member):
            doc = (inspect.getdoc(member) or "").split("\n\n")[0].replace("\n", " ")
            sig = formatted(attr, inspect.signature(member), "").strip().replace("\n", " ")
            lines.append(f"- `{' '.join(sig.split())}`: {doc}".rstrip(": "))
    return lines


def entry(path: str) -> str:
    """One name's section: heading, signature, docstring, members."""
    name = path.rpartition(".")[2]
    obj = load(path)
    parts = [f"### `{name}`", "", f"`{path}`", "", "```python", signature(name, obj), "```"]
    own = inspect.getdoc(obj) if not isinstance(obj, enum.Enum) else None
    if inspect.isclass(obj) or inspect.isroutine(obj) or own != inspect.getdoc(type(obj)):
        if own:
            parts += ["", own]
    elif own:
        parts += ["", f"An instance of `{type(obj).__name__}`."]
    if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
        listed = methods(obj)
        if listed:
            parts += ["", *listed]
    return "\n".join(parts)


def render() -> str:
    """The whole page."""
    blocks = [HEADER]
    for title, intro, paths in SECTIONS:
        blocks.append(f"## {title}")
        if intro:
            blocks.append(intro)
        blocks += [entry(path) for path in paths]
    return "\n\n".join(blocks) + "\n"


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    PAGE.write_text(render())


if __name__ == "__main__":
    main()
