"""System checks (``manage.py check``): settings, declarations and rows nobody can deliver."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.checks import CheckMessage, Error, Tags, register

from . import conf


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every problem with ``DJANGO_DOMAIN_EVENTS``, one error each."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    return [
        Error(problem, hint="See docs/settings.md.", id="django_domain_events.E001")
        for problem in conf.problems(raw)
    ]


@register(Tags.compatibility)
def check_wake(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``WAKE="notify"`` needs psycopg 3; under psycopg2 relays poll, and we say so."""
    raw = getattr(django_settings, conf.SETTINGS_NAME, {})
    if conf.problems(raw) or conf.get().WAKE != "notify":
        return []
    from django.db import connections

    found: list[CheckMessage] = []
    for alias in connections:
        if connections[alias].vendor != "postgresql":
            continue
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            found.append(
                checks.Warning(
                    f"Database {alias!r} uses psycopg2, so relays cannot LISTEN and will "
                    "find new work only on their poll (POLL_SECONDS).",
                    hint="Install psycopg 3 (pip install 'psycopg[binary]'), or set "
                    "WAKE='poll' to say polling is intended.",
                    id="django_domain_events.W001",
                )
            )
    return found
