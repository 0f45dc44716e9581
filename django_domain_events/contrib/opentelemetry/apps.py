"""The app that turns tracing on: add it to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class OpenTelemetryConfig(AppConfig):
    """Installs ``contrib.opentelemetry``'s hooks once the apps are ready."""

    name = "django_domain_events.contrib.opentelemetry"
    label = "django_domain_events_opentelemetry"
    verbose_name = "Domain events: OpenTelemetry"

    def ready(self) -> None:
        from . import install

        install()
