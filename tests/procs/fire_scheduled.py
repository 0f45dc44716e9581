"""A child process: fire N orders, one transaction each, whose follow-up is due in two days.

Usage: fire_scheduled.py N
"""

from __future__ import annotations

import sys

import django

django.setup()

from django.db import transaction  # noqa: E402

from django_domain_events import fire  # noqa: E402
from tests.app.events import OrderPlaced  # noqa: E402
from tests.procs.receivers import declare_scheduled  # noqa: E402

declare_scheduled()
for n in range(int(sys.argv[1])):
    with transaction.atomic():
        fire(OrderPlaced(order_id=n))
