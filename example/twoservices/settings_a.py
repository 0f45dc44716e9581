"""Service A, "shop": fires OrderPlaced and publishes it (its own SQLite file)."""

from twoservices.settings_common import *  # noqa: F403
from twoservices.settings_common import BASE_APPS, BROKERS, HERE

INSTALLED_APPS = [*BASE_APPS, "twoservices.shop_a"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": HERE / "shop.sqlite3"}}
DJANGO_DOMAIN_EVENTS = {"BROKERS": BROKERS, "EVENT_SOURCE": "shop"}
