"""Service B, "billing": consumes the shop's events into its inbox (its own SQLite file)."""

from twoservices.settings_common import *  # noqa: F403
from twoservices.settings_common import BASE_APPS, BROKERS, HERE

INSTALLED_APPS = [*BASE_APPS, "twoservices.billing_b"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": HERE / "billing.sqlite3"}}
DJANGO_DOMAIN_EVENTS = {"BROKERS": BROKERS, "EVENT_SOURCE": "billing"}
