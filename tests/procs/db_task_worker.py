"""A child process: django-tasks-db's ``db_worker`` running the site="task" deliveries.

Arguments are passed to ``db_worker`` (e.g. ``--batch --backend events``). The task
receiver is declared exactly as in tests/test_task_backends.py.
"""

from __future__ import annotations

import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from tests.procs.task_receivers import declare_task_recorder  # noqa: E402

declare_task_recorder()
call_command("db_worker", *sys.argv[1:])
