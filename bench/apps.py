from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmark's own app: it only declares the ``Tick`` event (``bench/events.py``)."""

    name = "bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"
