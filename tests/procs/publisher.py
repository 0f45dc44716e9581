"""A child process: a relay with one publish() declared, then ``manage.py deliver_events``.

Usage: publisher.py [deliver_events arguments...]
Environment: DDE_BROKER_URL (the ``default`` broker), DDE_PUBLISH_TO (the destination of
``publish(OrderPlaced, to=...)``), DDE_LEASE_SECONDS (default 300); DDE_READY_FILE and
DDE_GO_FILE as for tests.procs.relay.
"""

from __future__ import annotations

import os
import sys

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from django_domain_events.contrib.brokers import publish  # noqa: E402
from tests.app.events import OrderPlaced  # noqa: E402
from tests.procs import ready_then_go  # noqa: E402

override_settings(
    DJANGO_DOMAIN_EVENTS={
        **getattr(settings, "DJANGO_DOMAIN_EVENTS", {}),
        "BROKERS": {"default": {"URL": os.environ["DDE_BROKER_URL"], "RETRY_CONNECT_SECONDS": 0.2}},
        "LEASE_SECONDS": float(os.environ.get("DDE_LEASE_SECONDS", "300")),
    }
).enable()
publish(OrderPlaced, to=os.environ["DDE_PUBLISH_TO"], max_attempts=100)
ready_then_go()
call_command("deliver_events", *sys.argv[1:])
