"""Django settings for the test suite.

Environment:
    DDE_TEST_DB       sqlite (default), postgres or mariadb
    DDE_TEST_USE_TZ   true (default) or false
    DDE_SQLITE_PATH   SQLite database file (default /tmp/dde_test.sqlite3); a real
                      file, never :memory:, so that several processes can share it
    DDE_PG_HOST, DDE_PG_PORT, DDE_PG_USER, DDE_PG_PASSWORD
    DDE_PG_PREPARE    true: OPTIONS prepare_threshold=2, so that psycopg prepares the
                      statements the package binds on the server (the claims)
    DDE_MYSQL_HOST, DDE_MYSQL_PORT, DDE_MYSQL_USER, DDE_MYSQL_PASSWORD
    DDE_TEST_DB_SUFFIX  appended to the PostgreSQL/MariaDB test database names, so two
                      checkouts can run their suites at once on one server
"""

import json
import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


SECRET_KEY = "django-domain-events-tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "django_domain_events",
    "tests.app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# django-tasks-db (on the Django 6 leg): a database-backed django.tasks backend whose
# db_worker runs the site="task" tests' deliveries in a real worker process.
if find_spec("django_tasks_db") is not None:
    INSTALLED_APPS.append("django_tasks_db")

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

TEST_DB = os.environ.get("DDE_TEST_DB", "sqlite").strip().lower() or "sqlite"
_SUFFIX = os.environ.get("DDE_TEST_DB_SUFFIX", "")

if TEST_DB == "sqlite":
    _sqlite_path = os.environ.get("DDE_SQLITE_PATH") or "/tmp/dde_test.sqlite3"
    _default: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _sqlite_path,
        # Several processes write to the same file in some tests: wait for locks.
        "OPTIONS": {"timeout": 20},
        "TEST": {"NAME": _sqlite_path},
    }
elif TEST_DB in {"postgres", "postgresql"}:
    _default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "dde",
        "USER": os.environ.get("DDE_PG_USER", "postgres"),
        "PASSWORD": os.environ.get("DDE_PG_PASSWORD", ""),
        "HOST": os.environ.get("DDE_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DDE_PG_PORT", "5432"),
        "TEST": {"NAME": f"test_dde{_SUFFIX}"},
    }
    if _env_bool("DDE_PG_PREPARE", False):  # psycopg may prepare the claims' statements
        _default["OPTIONS"] = {"prepare_threshold": 2}
elif TEST_DB in {"mariadb", "mysql"}:
    _default = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "dde",
        "USER": os.environ.get("DDE_MYSQL_USER", "root"),
        "PASSWORD": os.environ.get("DDE_MYSQL_PASSWORD", ""),
        "HOST": os.environ.get("DDE_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DDE_MYSQL_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4"},
        "TEST": {
            "NAME": f"test_dde{_SUFFIX}",
            "CHARSET": "utf8mb4",
            "COLLATION": "utf8mb4_unicode_ci",
        },
    }
else:
    raise RuntimeError(f"DDE_TEST_DB={TEST_DB!r}: expected sqlite, postgres or mariadb")

# Child processes started by the tests connect to the parent's test database.
if os.environ.get("DDE_DB_NAME"):
    _default["NAME"] = os.environ["DDE_DB_NAME"]

# A second database, for the tests that route the package's tables elsewhere.
_events = {**_default, "TEST": dict(_default.get("TEST", {}))}
if TEST_DB == "sqlite":
    _events["NAME"] = _events["TEST"]["NAME"] = f"{_default['NAME']}.events"
else:
    _events["NAME"] = f"{_default['NAME']}_events"
    _events["TEST"]["NAME"] = f"{_default['TEST']['NAME']}_events"

DATABASES = {"default": _default, "events": _events}

# A database that is down (child processes given DDE_DOWN_ALIAS): a server port nothing
# listens on, or an SQLite file in a directory that does not exist.
if os.environ.get("DDE_DOWN_ALIAS"):
    DATABASES["down"] = {**_default, "TEST": {}, "PORT": "1", "NAME": "/nonexistent/down"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A zone whose local time is not UTC, so naive-local versus aware-UTC mistakes show.
USE_TZ = _env_bool("DDE_TEST_USE_TZ", True)
TIME_ZONE = "Europe/Paris"
USE_I18N = True
LANGUAGE_CODE = "en-us"

STATIC_URL = "/static/"

# Fast hashing for users created in tests.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

DJANGO_DOMAIN_EVENTS: dict[str, Any] = {"WARN_OUTSIDE_ATOMIC": True}
# Child processes started by the tests may be given settings of their own.
DJANGO_DOMAIN_EVENTS.update(json.loads(os.environ.get("DDE_SETTINGS_JSON", "{}")))

# Child processes (a task worker) may be given a TASKS setting of their own.
if os.environ.get("DDE_TASKS_JSON"):
    TASKS = json.loads(os.environ["DDE_TASKS_JSON"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # DEBUG so that caplog sees everything; the console shows WARNING and up.
        "django_domain_events": {"level": os.environ.get("DDE_TEST_LOG_LEVEL", "DEBUG")},
    },
}
