"""The root exports the public contract names, and none is shadowed by a submodule."""

from __future__ import annotations

import importlib
import pkgutil
import types

import django_domain_events

CONTRACT = [
    "event",
    "receiver",
    "AnyEvent",
    "registry",
    "Registry",
    "RegisteredEvent",
    "RegisteredReceiver",
    "DeliveryMode",
    "DURABLE",
    "INLINE",
    "ON_COMMIT",
    "Retention",
    "fire",
    "attributed",
    "current_scope",
    "suppressed",
    "caused_by",
    "causing_event_id",
    "propagate_scope",
    "Scope",
    "run_relay",
    "deliver_one",
    "deliver_pending",
    "claim_batch",
    "backoff",
    "notify_relay",
    "DeliveryContext",
    "DeliveryFailure",
    "DeliveryStatus",
    "PermanentFailure",
    "RetryAfter",
    "NotYet",
    "TaskBackend",
    "Exponential",
    "Constant",
    "Linear",
    "cancel_deliveries",
    "replay_events",
    "requeue_dead",
    "prune_events",
    "dead_letters",
    "purge_dead",
    "outbox_health",
    "OutboxHealth",
    "ReceiverBacklog",
    "LaneBacklog",
    "LanePause",
    "quiet_receivers",
    "QuietReceiver",
    "schedule_status",
    "ScheduleStatus",
    "catalogue",
    "render_catalogue",
    "Catalogue",
    "CatalogueEvent",
    "CatalogueField",
    "CatalogueReceiver",
    "CatalogueSchedule",
    "what_listens_to",
    "listens_for",
    "PayloadCodec",
    "DataclassCodec",
    "UnsupportedPayloadType",
    "PayloadUpgradeFailed",
    "drain_outbox",
    "assert_fired",
    "__version__",
]


def test_every_contract_name_is_exported_and_documented() -> None:
    for module in pkgutil.walk_packages(django_domain_events.__path__, "django_domain_events."):
        if ".management.commands." not in module.name and ".migrations" not in module.name:
            importlib.import_module(module.name)
    for name in CONTRACT:
        value = getattr(django_domain_events, name)
        assert not isinstance(value, types.ModuleType), f"{name} is shadowed by a submodule"
        if name != "__version__" and callable(value) and not isinstance(value, str):
            assert getattr(value, "__doc__", None), f"{name} has no docstring"
    assert set(CONTRACT) <= set(django_domain_events.__all__)


def test_the_integrations_import_no_private_name_of_the_core() -> None:
    """contrib/ builds on the core's public seams (``run.acknowledge_all``, ...): a name
    with a leading underscore imported from outside contrib/ is a seam to make public."""
    import ast
    from pathlib import Path

    root = Path(django_domain_events.__file__).parent
    found = []
    for path in sorted((root / "contrib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            target = (path.parent / ("../" * (node.level - 1))).resolve()
            inside_contrib = (root / "contrib") in [target, *target.parents]
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private and not inside_contrib:
                found.append(f"{path.relative_to(root)}: {node.module} {private}")
    assert found == []
