"""Hand ``site="task"`` deliveries to Celery.

Configure::

    DJANGO_DOMAIN_EVENTS = {
        "TASK_BACKEND": {
            "BACKEND": "django_domain_events.contrib.celery.CeleryBackend",
            "QUEUE": "events",  # optional; other keys are passed to apply_async()
        },
    }

and import this module where your Celery app discovers tasks (the task is declared with
``shared_task``, so it registers with whichever app the worker runs). The worker runs the
task ``django_domain_events.deliver_delivery``, which calls ``deliver_one`` under the
relay's claim: a duplicate or late message finds the claim gone and runs nothing.
"""

from __future__ import annotations

from typing import Any

try:
    from celery import shared_task
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_domain_events.contrib.celery needs Celery: "
        "pip install 'django-domain-outbox[celery]'"
    ) from exc

from ..delivery.passes import deliver_one

TASK_NAME = "django_domain_events.deliver_delivery"


@shared_task(name=TASK_NAME, ignore_result=True)
def deliver_delivery(delivery_id: int, claimed_by: str, claimed_at: str) -> str | None:
    """Run one delivery the relay claimed; ``None`` when the claim no longer holds."""
    status = deliver_one(delivery_id, claimed_by=claimed_by, claimed_at=claimed_at)
    return None if status is None else str(status)


class CeleryBackend:
    """A ``TaskBackend`` publishing ``deliver_delivery`` messages with ``apply_async``.

    ``queue`` is the Celery queue (``None``: the app's default routing); any other
    keyword is passed to ``apply_async`` as is (``priority``, ``exchange``, ...).
    """

    def __init__(self, queue: str | None = None, **options: Any) -> None:
        self.queue = queue
        self.options = options

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        deliver_delivery.apply_async(
            args=(delivery_id, claimed_by, claimed_at), queue=self.queue, **self.options
        )

    def __repr__(self) -> str:
        return f"CeleryBackend(queue={self.queue!r})"
