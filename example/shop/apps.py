from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The example shop. Its ``events.py`` is imported by django_domain_events at start-up."""

    name = "shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"
