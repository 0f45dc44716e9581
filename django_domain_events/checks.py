"""System checks (``manage.py check``): settings, declarations and rows nobody can deliver."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
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
