"""A child process: run prune_events() and print how many events it deleted."""

from __future__ import annotations

import django

django.setup()

from django_domain_events import prune_events  # noqa: E402

print(prune_events())
