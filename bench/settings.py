"""Django settings for the benchmark (``DJANGO_SETTINGS_MODULE=bench.settings``).

Environment:
    DDE_BENCH_PG_HOST, DDE_BENCH_PG_PORT, DDE_BENCH_PG_USER, DDE_BENCH_PG_PASSWORD
    DDE_BENCH_PG_NAME   the database (default dde_bench; created by run.py when missing)
    DDE_BENCH_PG_PREPARE  true: OPTIONS prepare_threshold=5 (psycopg prepares the claims);
                        unset, Django's default, as a deployment gets without tuning
    DDE_BENCH_SETTINGS_JSON  a JSON object merged over DJANGO_DOMAIN_EVENTS: how run.py
                        gives a relay child process its own settings (POLL_SECONDS, ...)
"""

import json
import os

SECRET_KEY = "django-domain-events-bench-not-secret"
DEBUG = False  # connection.queries stays off: the timed loops must not log queries
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_domain_events",
    "bench.apps.BenchConfig",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DDE_BENCH_PG_NAME", "dde_bench"),
        "USER": os.environ.get("DDE_BENCH_PG_USER", "postgres"),
        "PASSWORD": os.environ.get("DDE_BENCH_PG_PASSWORD", ""),
        "HOST": os.environ.get("DDE_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DDE_BENCH_PG_PORT", "5432"),
        # Names our sessions, so that run.py's load sampler counts only other people's.
        "OPTIONS": {"application_name": "dde-bench"},
    }
}

if os.environ.get("DDE_BENCH_PG_PREPARE", "").lower() in {"1", "true", "yes"}:
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Section 13 renders the admin dashboard's figures (no admin here: its links are left out).
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
ROOT_URLCONF = "bench.urls"

USE_TZ = True
TIME_ZONE = "UTC"
USE_I18N = False

# The package defaults, spelled out: what a deployment gets without tuning.
DJANGO_DOMAIN_EVENTS = {"WARN_OUTSIDE_ATOMIC": True, "BATCH_SIZE": 50}
DJANGO_DOMAIN_EVENTS.update(json.loads(os.environ.get("DDE_BENCH_SETTINGS_JSON", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
