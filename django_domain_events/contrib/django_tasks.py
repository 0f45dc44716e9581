"""Hand ``site="task"`` deliveries to Django's tasks framework.

Uses ``django.tasks`` on Django 6, and the ``django-tasks`` backport on Django 5.2
(``pip install 'django-domain-outbox[tasks]'``). Configure::

    DJANGO_DOMAIN_EVENTS = {
        "TASK_BACKEND": {
            "BACKEND": "django_domain_events.contrib.django_tasks.DjangoTasksBackend",
            "BACKEND_ALIAS": "default",  # optional: an alias in TASKS (see below)
            "QUEUE_NAME": "events",  # optional: must be in that backend's QUEUES
        },
    }

Option keys are lower-cased into keyword arguments, so the alias is given as ``backend``
or (to avoid reading like the dotted path) ``backend_alias``. The task
``django_domain_events.contrib.django_tasks.deliver_delivery`` calls ``deliver_one``
under the relay's claim: a duplicate or late message finds the claim gone and runs
nothing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..delivery.passes import deliver_one


def _tasks_module() -> ModuleType:
    """``django.tasks`` where Django ships it, else the ``django_tasks`` backport."""
    for name in ("django.tasks", "django_tasks"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists, and something it imports does not
                raise
    raise ImportError(
        "django_domain_events.contrib.django_tasks needs django.tasks (Django 6) or the "
        "django-tasks backport: pip install 'django-domain-outbox[tasks]'"
    )


tasks = _tasks_module()


@tasks.task
def deliver_delivery(delivery_id: int, claimed_by: str, claimed_at: str) -> str | None:
    """Run one delivery the relay claimed; ``None`` when the claim no longer holds."""
    status = deliver_one(delivery_id, claimed_by=claimed_by, claimed_at=claimed_at)
    return None if status is None else str(status)


class DjangoTasksBackend:
    """A ``TaskBackend`` enqueueing ``deliver_delivery`` on a ``TASKS`` backend.

    ``backend`` (or ``backend_alias``) is the alias in the ``TASKS`` setting;
    ``queue_name`` the queue (``None``: the task's default, ``"default"``).
    """

    def __init__(
        self,
        backend: str = "default",
        queue_name: str | None = None,
        *,
        backend_alias: str | None = None,
    ) -> None:
        self.backend = backend_alias or backend
        self.queue_name = queue_name

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        deliver_delivery.using(backend=self.backend, queue_name=self.queue_name).enqueue(
            delivery_id, claimed_by, claimed_at
        )

    def __repr__(self) -> str:
        return f"DjangoTasksBackend(backend={self.backend!r}, queue_name={self.queue_name!r})"
