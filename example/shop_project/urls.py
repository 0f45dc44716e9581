"""The admin shows the shop's rows beside the package's events and deliveries; /metrics
serves the outbox's figures to Prometheus when prometheus-client is installed
(``pip install django-domain-outbox[prometheus]``)."""

from importlib.util import find_spec

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]

if find_spec("prometheus_client") is not None:
    from django_domain_events.contrib.prometheus import metrics_view

    urlpatterns.append(path("metrics", metrics_view))
