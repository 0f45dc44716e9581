"""A child process: a real Celery worker running django_domain_events.deliver_delivery.

Environment: DDE_CELERY_BROKER (broker URL), DDE_CELERY_QUEUE (the queue to consume).
The task receiver is declared exactly as in tests/test_task_backends.py.
"""

from __future__ import annotations

import os

import django

django.setup()

from celery import Celery  # noqa: E402

from tests.procs.task_receivers import declare_task_recorder  # noqa: E402

app = Celery("dde-tests", broker=os.environ["DDE_CELERY_BROKER"])
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.set_current()
app.set_default()

import django_domain_events.contrib.celery  # noqa: E402, F401  (registers the task)

declare_task_recorder()

app.worker_main(
    [
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "-Q",
        os.environ["DDE_CELERY_QUEUE"],
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        "--loglevel=WARNING",
    ]
)
