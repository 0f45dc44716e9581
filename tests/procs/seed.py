"""A child process: migrate the database it is pointed at and fire N orders into it.

Usage: seed.py N
"""

from __future__ import annotations

import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from django_domain_events import fire  # noqa: E402
from tests.app.events import OrderPlaced  # noqa: E402
from tests.procs.receivers import declare_all  # noqa: E402

declare_all()
call_command("migrate", verbosity=0)
with transaction.atomic():
    for n in range(int(sys.argv[1])):
        fire(OrderPlaced(order_id=n))
