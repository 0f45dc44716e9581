"""The site="task" receiver, declared the same way in the test process and its workers."""

from __future__ import annotations

from django_domain_events import receiver
from tests.app.events import OrderPlaced
from tests.procs.receivers import record

TASK_RECORDER_KEY = "tests.task_record_order"


def declare_task_recorder() -> None:
    receiver(OrderPlaced, key=TASK_RECORDER_KEY, site="task", takes_context=True)(record)
