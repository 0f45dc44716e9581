"""What both services of the two-service demo share (``make demo-brokers``)."""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECRET_KEY = "django-insecure-two-services-demo-not-secret"
DEBUG = True
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
BASE_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django_domain_events"]
# The broker run.py found reachable; one URL for both services.
BROKERS = {"default": {"URL": os.environ.get("DDE_DEMO_BROKER_URL", "redis://127.0.0.1:6379/0")}}
# A destination of this run's own, so a shared broker's other streams are untouched.
DESTINATION = os.environ.get("DDE_DEMO_DESTINATION", "orders-demo")
