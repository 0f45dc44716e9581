"""Handing claimed rows to a task queue (``site="task"``).

The relay claims the row, then enqueues ``(delivery_id, claimed_by, claimed_at)``. The
worker's ``deliver_one`` first takes the row under exactly that claim in a committed
update, so a duplicate, late or stale message finds the claim gone and runs nothing.
The schedule never relies on the queue's own delays: a row is handed over only once due.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .. import conf
from .claim_rows import Claim


@runtime_checkable
class TaskBackend(Protocol):
    """Anything that can queue a delivery for a worker to run with ``deliver_one``."""

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None: ...


class TaskBackendMissing(ImproperlyConfigured, RuntimeError):
    """A receiver declared ``site="task"`` and no ``TASK_BACKEND`` is configured."""


_backend: TaskBackend | None = None


def get_backend() -> TaskBackend:
    """The configured backend, built once: a dotted path, or ``{"BACKEND": path, **options}``."""
    global _backend
    if _backend is not None:
        return _backend
    setting = conf.get().TASK_BACKEND
    if setting is None:
        raise TaskBackendMissing(
            "this receiver declares site='task', and DJANGO_DOMAIN_EVENTS['TASK_BACKEND'] is "
            "not set; configure a task backend, or declare the receiver with site='relay'."
        )
    options: dict[str, Any] = {}
    path = setting
    if isinstance(setting, dict):
        options = {k.lower(): v for k, v in setting.items() if k != "BACKEND"}
        path = setting["BACKEND"]
    try:
        backend = import_string(path)(**options)
    except Exception as exc:
        raise ImproperlyConfigured(
            f"DJANGO_DOMAIN_EVENTS['TASK_BACKEND'] = {setting!r} could not be built: {exc}."
        ) from exc
    if not callable(getattr(backend, "enqueue", None)):
        raise ImproperlyConfigured(
            f"DJANGO_DOMAIN_EVENTS['TASK_BACKEND'] = {path!r} has no enqueue() method."
        )
    _backend = backend
    return backend


def hand_off(claim: Claim) -> None:
    """Queue ``claim`` for a task worker; raises when no backend is configured."""
    get_backend().enqueue(
        claim.id, claimed_by=claim.claimed_by, claimed_at=claim.claimed_at.isoformat()
    )


def _reset(*, setting: str, **kwargs: object) -> None:
    global _backend
    if setting == conf.SETTINGS_NAME:
        _backend = None


setting_changed.connect(_reset)
