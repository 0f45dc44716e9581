"""The app config: declarations in every installed app's ``events.py`` are imported here."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DomainEventsConfig(AppConfig):
    """Autodiscovers ``events.py`` once the app registry is ready."""

    name = "django_domain_events"
    label = "django_domain_events"
    verbose_name = "Domain events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .delivery.ticks import install_firing
        from .tick_firing import fire_schedule

        # Firing a tick fires an event, above delivery/: the relays' watch is given it here.
        install_firing(fire_schedule)

        autodiscover_modules("events")
