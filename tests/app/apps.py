from django.apps import AppConfig


class TestAppConfig(AppConfig):
    """A stand-in application whose models fire domain events in the tests."""

    name = "tests.app"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"
